"""The result row every report is made of: one (op, workload, mode, candidate, metric) figure.

Whatever measures something (the runner, the dist-adamw launcher, ``train``) builds a
:class:`Row`; sinks (the report writer) store its :meth:`Row.as_dict`. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

# Statuses. "not-measured": a Triton kernel run in the interpreter (parity only); "suspect": a
# figure above the device's measured ceiling, i.e. a measurement error.
OK = "ok"
ERROR = "error"
SKIPPED = "skipped"
NOT_MEASURED = "not-measured"
SUSPECT = "suspect"
PASS = "pass"
FAIL = "fail"
STATUSES = (OK, ERROR, SKIPPED, NOT_MEASURED, SUSPECT, PASS, FAIL)


@dataclass(frozen=True)
class Row:
    op: str
    workload: str
    mode: str
    candidate: str
    metric: str
    value: Any = None
    unit: str = ""
    status: str = OK
    flags: str = ""
    tensor: str = ""
    message: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"row status {self.status!r}: accepted: {', '.join(STATUSES)}")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ROW_FIELDS}


ROW_FIELDS = tuple(f.name for f in fields(Row))


class RowSink(Protocol):
    def add(self, row: Row | dict) -> None: ...
