"""Rich renderings of the tables for the terminal."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

from .tables import fmt

STATUS_STYLE = {"ok": "green", "pass": "green", "faster": "green", "fail": "bold red",
                "error": "bold red", "regression": "bold red", "suspect": "bold yellow",
                "skipped": "dim", "not-measured": "yellow", "same": ""}


def render(console: Console, title: str, table: pd.DataFrame) -> None:
    if table.empty:
        return
    out = Table(title=title, show_lines=False, header_style="bold")
    for col in table.columns:
        numeric = pd.api.types.is_numeric_dtype(table[col])
        out.add_column(str(col), justify="right" if numeric else "left",
                       overflow="fold", max_width=70 if col in ("notes", "details", "message") else None)
    for _, row in table.iterrows():
        cells = []
        for col in table.columns:
            text = fmt(row[col])
            style = STATUS_STYLE.get(text) if col in ("status", "result", "verdict") else None
            cells.append(f"[{style}]{text}[/]" if style else text.replace("[", "\\["))
        out.add_row(*cells)
    console.print(out)
