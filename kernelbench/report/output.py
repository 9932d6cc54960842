"""What the CLI prints, and how: tables as text, Markdown, JSON or CSV; full-width tables when
stdout is no terminal (CI logs, pipes), so a name or a number is never split across lines;
errors on one line; a closed pipe (``| head -1``) ends printing, not the run.

Imports neither torch nor pandas (``--help`` and ``list`` stay fast); a pandas DataFrame is
accepted wherever rows are, through its ``to_dict``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"
    csv = "csv"


STATUS_STYLE = {"ok": "green", "pass": "green", "faster": "green", "yes": "green", "fail": "bold red",
                "error": "bold red", "regression": "bold red", "suspect": "bold yellow",
                "skipped": "dim", "not-measured": "yellow", "same": ""}
STATUS_COLUMNS = ("status", "result", "verdict")
# Columns of free text: wrapped on a terminal, never elsewhere.
TEXT_COLUMNS = ("notes", "details", "message", "what", "runs here")


def fmt(value: Any) -> str:
    """Numbers as people read them in a table: 3 significant digits, no scientific notation
    for ordinary magnitudes, empty for missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 0.01:
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
        return f"{value:.2e}"
    return str(value)


def _plain(value: Any) -> Any:
    """A cell as JSON / CSV carry it: numbers stay numbers, NaN becomes null, numpy scalars Python."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return value


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # The reader went away (`| head -1`): stop printing, let the run finish and exit with its
        # own code (rich's default exits 1, the code of a failed parity check).
        self.quiet = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
        except (OSError, ValueError, AttributeError):
            pass


def columns_limit() -> int | None:
    """$COLUMNS as a number, when set."""
    try:
        return int(os.environ.get("COLUMNS", "")) or None
    except ValueError:
        return None


def make_console(stderr: bool = False) -> Console:
    """A console for stdout or stderr. Without a terminal: no colour and no wrapping: tables
    take the width they need (their free-text columns fold at $COLUMNS when it is set)."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return _Console(file=stream, width=None if tty else 100_000, soft_wrap=not tty, highlight=False,
                    emoji=False, markup=False)


def _rows(rows: Any) -> tuple[list[str], list[dict]]:
    """(columns, rows as dicts) from a DataFrame or a list of dicts."""
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        columns = [str(c) for c in rows.columns]
        return columns, [dict(zip(columns, r)) for r in rows.itertuples(index=False, name=None)]
    rows = list(rows)
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    return columns, rows


def markdown_table(columns: Sequence[str], rows: Iterable[dict]) -> str:
    rows = list(rows)
    if not rows:
        return "_(none)_\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [fmt(r.get(c)).replace("|", "\\|").replace("\n", " ") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


class Output:
    """Where a command's tables and messages go. Tables go to stdout in the chosen format;
    notes go to stdout as text, or to stderr when stdout carries JSON or CSV for a script."""

    def __init__(self, fmt: Format | str = Format.table) -> None:
        self.format = Format(fmt)
        self.out = make_console()
        self.err = make_console(stderr=True)
        self._pending: list[tuple[str, list[str], list[dict]]] = []

    @property
    def machine(self) -> bool:
        return self.format in (Format.json, Format.csv)

    # -- messages -------------------------------------------------------------------------------
    def note(self, text: str, style: str | None = None) -> None:
        self._print(self.err if self.machine else self.out, Text(text, style=style or ""))

    def warn(self, text: str) -> None:
        self._print(self.err, Text(text, style="yellow"))

    def error(self, message: str) -> None:
        """One line on stderr, printed literally (config text like [suite] is no markup)."""
        line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
        self._print(self.err, Text("error: ", style="bold red") + Text(line))

    # -- tables ---------------------------------------------------------------------------------
    def table(self, title: str, rows: Any, *, name: str | None = None) -> None:
        """Prints (text, Markdown) or collects (JSON, CSV: written by ``flush``) one table."""
        columns, records = _rows(rows)
        if not records:
            return
        if self.format is Format.table:
            self._print(self.out, self._rich(title, columns, records))
        elif self.format is Format.markdown:
            self._print(self.out, Text(f"### {title}\n\n" + markdown_table(columns, records)))
        else:
            self._pending.append((name or title, columns, records))

    def flush(self) -> None:
        """JSON: one array of objects, one per row, each naming its table; CSV: the union of
        the tables' columns after a ``table`` column."""
        if not self.machine:
            return
        pending, self._pending = self._pending, []
        records = [{"table": name, **{c: _plain(r.get(c)) for c in cols}} for name, cols, rows in pending for r in rows]
        if self.format is Format.json:
            text = json.dumps(records, indent=1, default=str)
        else:
            columns = ["table"]
            for _, cols, _ in pending:
                columns += [c for c in cols if c not in columns]
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
            text = buf.getvalue().rstrip("\n")
        self._print(self.out, Text(text))

    def _rich(self, title: str, columns: list[str], records: list[dict]) -> Table:
        tty = self.out.is_terminal
        cells = [[fmt(r.get(col)) for col in columns] for r in records]
        out = Table(title=title, header_style="bold")
        for i, col in enumerate(columns):
            values = [_plain(r.get(col)) for r in records]
            numeric = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values) \
                and any(v is not None for v in values)
            text = col in TEXT_COLUMNS
            if tty:
                out.add_column(col, justify="right" if numeric else "left", overflow="fold",
                               max_width=70 if text else None)
            else:
                # Names and numbers are never split; only free text may fold (at $COLUMNS).
                widest = max([len(col)] + [len(c[i]) for c in cells])
                out.add_column(col, justify="right" if numeric else "left", no_wrap=not text, overflow="fold",
                               min_width=None if text else widest)
        for row in cells:
            out.add_row(*(Text(text, style=STATUS_STYLE.get(text, "") if col in STATUS_COLUMNS else "")
                          for col, text in zip(columns, row)))
        limit = columns_limit()
        if not tty and limit and self.out.measure(out).maximum > limit:
            fixed = sum(c.min_width or 0 for c in out.columns) + 3 * len(columns) + 1
            texts = sum(1 for col in columns if col in TEXT_COLUMNS)
            out.width = max(limit, fixed + 12 * texts)
        return out

    # -- printing -------------------------------------------------------------------------------
    def _print(self, console: Console, renderable: Any) -> None:
        if console.quiet:
            return
        try:
            console.print(renderable, soft_wrap=not console.is_terminal and isinstance(renderable, Text))
            console.file.flush()
        except BrokenPipeError:
            console.on_broken_pipe()
