"""What the CLI prints, and how: tables as text, Markdown, JSON or CSV; full-width tables when
stdout is no terminal (CI logs, pipes), so a name or a number is never split across lines;
errors on one line; a closed pipe (``| head -1``) ends printing, not the run.

A table wider than the terminal (or than $COLUMNS without one) never splits a name or a number:
it first turns compact (columns holding one value for every row move to the title, headers wrap
between words, free text folds), then hides the free-text columns that only add detail (their
text is in the report files), and, when the names and numbers alone are too wide, shows each row
as a block of "column: value" lines.

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

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"
    csv = "csv"


STATUS_STYLE = {"ok": "green", "pass": "green", "faster": "green", "yes": "green", "fail": "bold red",
                "error": "bold red", "regression": "bold red", "slower": "bold red", "broken": "bold red",
                "inconclusive": "yellow", "suspect": "bold yellow",
                "skipped": "dim", "not-measured": "yellow", "same": ""}
STATUS_COLUMNS = ("status", "result", "verdict")
# Columns of free text: wrapped on a terminal, never elsewhere.
TEXT_COLUMNS = ("notes", "details", "message", "what", "runs here", "why")
# Free text a narrow table may hide (the report files keep it), the first hidden first.
DETAIL_COLUMNS = ("why", "what", "notes", "details", "message")
# Columns that name a row: a stacked row's first line.
KEY_COLUMNS = ("op", "workload", "mode", "candidate", "implementation", "key")
MIN_TEXT_WIDTH = 12


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

    def _rich(self, title: str, columns: list[str], records: list[dict]) -> Any:
        cells = {col: [fmt(r.get(col)) for r in records] for col in columns}
        numeric = {col: _numeric([_plain(r.get(col)) for r in records]) for col in columns}
        limit = self.out.width if self.out.is_terminal else columns_limit()
        full = self._table(title, columns, cells, numeric)
        if limit is None or self._natural(full) <= limit:
            return full
        # Compact: columns with one value for every row say it in the title.
        constant = [c for c in columns if len(records) > 1 and c not in TEXT_COLUMNS and not numeric[c]
                    and len(set(cells[c])) == 1 and cells[c][0]]
        shown = [c for c in columns if c not in constant]
        if constant:
            title += " (" + ", ".join(f"{c} {cells[c][0]}" for c in constant) + ")"
        # Then one table per value of the first name that varies (a workload), then without the
        # detail text, before each row becomes a block.
        split = next((c for c in shown if c in KEY_COLUMNS and 1 < len(set(cells[c])) <= len(records) // 2), None)
        hidden: list[str] = []
        for drop in [None, *(c for c in DETAIL_COLUMNS if c in shown)]:
            if drop is not None:
                shown.remove(drop)
                hidden.append(drop)
            caption = (f"{', '.join(hidden)}: hidden at {limit} columns (in the report files, or with "
                       "--format markdown)") if hidden else None
            widths = _fit(shown, cells, limit)
            if widths is not None:
                return self._table(title, shown, cells, numeric, widths=widths, caption=caption)
            inner = [c for c in shown if c != split]
            widths = _fit(inner, cells, limit) if split else None
            if widths is not None:
                groups: dict[str, list[int]] = {}
                for i, value in enumerate(cells[split]):
                    groups.setdefault(value, []).append(i)
                tables = [self._table(f"{split} {value}", inner, {c: [cells[c][i] for i in rows] for c in inner},
                                      numeric, widths=widths) for value, rows in groups.items()]
                return Group(Text(title, style="bold"), *tables, *([Text(caption)] if caption else []))
        return self._stacked(title, [c for c in columns if c not in constant], cells, limit)

    def _table(self, title: str, columns: list[str], cells: dict[str, list[str]], numeric: dict[str, bool], *,
               widths: dict[str, int] | None = None, caption: str | None = None) -> Table:
        """The table at its natural width (``widths`` None) or compact, each column as wide as
        ``widths`` says (one space between columns; headers may wrap between words)."""
        tty = self.out.is_terminal
        if widths is None:
            out = Table(title=title, header_style="bold")
        else:
            out = Table(title=title, caption=caption, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
                        pad_edge=False, padding=(0, 0))
        for col in columns:
            justify = "right" if numeric[col] else "left"
            if widths is not None:
                out.add_column(col, justify=justify, overflow="fold", width=widths[col])
            elif col in TEXT_COLUMNS:
                # Free text folds: at 70 on a terminal, at $COLUMNS without one.
                out.add_column(col, justify=justify, overflow="fold", max_width=70 if tty else None)
            else:
                widest = max([cell_len(col)] + [cell_len(c) for c in cells[col]])
                out.add_column(col, justify=justify, no_wrap=True, overflow="fold", min_width=widest)
        for i in range(len(cells[columns[0]]) if columns else 0):
            out.add_row(*(Text(cells[col][i], style=STATUS_STYLE.get(cells[col][i], "") if col in STATUS_COLUMNS
                               else "") for col in columns))
        return out

    def _stacked(self, title: str, columns: list[str], cells: dict[str, list[str]], limit: int) -> Any:
        """Each row as a block: the names that identify it on one line, then "column: value" lines."""
        keys = [c for c in columns if c in KEY_COLUMNS] or columns[:1]
        rest = [c for c in columns if c not in keys]
        label = max((cell_len(c) for c in rest), default=0) + 3  # two spaces of indent and the colon
        parts: list[Any] = [Text(title, style="bold")]
        for i in range(len(cells[columns[0]])):
            parts.append(Text("  ".join(cells[c][i] for c in keys if cells[c][i]), style="bold"))
            grid = Table.grid(padding=(0, 1, 0, 0))
            grid.add_column(no_wrap=True, width=label, justify="right")
            grid.add_column(overflow="fold", max_width=max(limit - label - 1, MIN_TEXT_WIDTH))
            for col in rest:
                if cells[col][i]:
                    grid.add_row(col + ":", Text(cells[col][i], style=STATUS_STYLE.get(cells[col][i], "")
                                                 if col in STATUS_COLUMNS else ""))
            parts.append(grid)
        return Group(*parts)

    def _natural(self, renderable: Any) -> int:
        """The width ``renderable`` takes when nothing limits it."""
        return Measurement.get(self.out, self.out.options.update(max_width=1_000_000), renderable).maximum

    # -- printing -------------------------------------------------------------------------------
    def _print(self, console: Console, renderable: Any) -> None:
        if console.quiet:
            return
        try:
            console.print(renderable, soft_wrap=not console.is_terminal and isinstance(renderable, Text))
            console.file.flush()
        except BrokenPipeError:
            console.on_broken_pipe()


def _numeric(values: list[Any]) -> bool:
    return all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values) \
        and any(v is not None for v in values)


def _longest_word(text: str) -> int:
    return max(cell_len(word) for word in text.split()) if text.strip() else 0


def _fit(columns: list[str], cells: dict[str, list[str]], limit: int) -> dict[str, int] | None:
    """Column widths of a compact table within ``limit`` (one space between columns), or None
    when it cannot fit: names and numbers whole, their headers wrapped between words if needed,
    free text at least MIN_TEXT_WIDTH wide (or its widest cell) and folded."""
    widest = {c: max([0] + [cell_len(x) for x in cells[c]]) for c in columns}
    widths = {c: max(widest[c], _longest_word(c)) for c in columns if c not in TEXT_COLUMNS}
    texts = [c for c in columns if c in TEXT_COLUMNS]
    room = limit - sum(widths.values()) - max(len(columns) - 1, 0)
    floors = {c: max(min(widest[c], MIN_TEXT_WIDTH), _longest_word(c)) for c in texts}
    if room < sum(floors.values()):
        return None
    widths.update(floors)
    room -= sum(floors.values())
    # What is left goes to the free text first (up to its widest), then to headers kept on one line.
    for c in texts:
        extra = min(room, max(widest[c], cell_len(c)) - widths[c])
        widths[c] += extra
        room -= extra
    for c in columns:
        if c not in TEXT_COLUMNS and room > 0:
            extra = min(room, cell_len(c) - widths[c]) if cell_len(c) > widths[c] else 0
            widths[c] += extra
            room -= extra
    return widths
