"""The result row every report is made of: one (op, workload, mode, candidate, metric) figure.

Whatever measures something (the runner, the dist-adamw launcher, ``train``) builds a
:class:`Row`; sinks (the report writer) store its :meth:`Row.as_dict`. The runner also hands
sinks that take them (``add_round``) each round's per-rep times and the GPU's state in that round,
as a :class:`RoundSamples`. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

# Statuses. "not-measured": a Triton kernel run in the interpreter (parity only); "suspect": a
# figure above the device's measured ceiling, or the time of a result that is not one (the
# output check failed), i.e. a measurement error.
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
    # Where the candidate came from: kernelbench, plugin:NAME (see kernelbench.ops.plugins), module:NAME.
    source: str = "kernelbench"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"row status {self.status!r}: accepted: {', '.join(STATUSES)}")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ROW_FIELDS}


ROW_FIELDS = tuple(f.name for f in fields(Row))


class RowSink(Protocol):
    def add(self, row: Row | dict) -> None: ...


# The rows that are one result each: a candidate's time and a parity check; any other row that
# errored (memory, telemetry, a launch's teardown) is a result of its own, and so is a failed check
# of a timed result (its time is suspect; the check is what failed).
RESULT_METRICS = ("time_median_ms", "parity")


@dataclass(frozen=True)
class Tally:
    """How a run's results ended: ok (timed or passed), failed (a failed check or an error),
    skipped (cannot run here), not measured (Triton interpreter), suspect (above a ceiling)."""

    ok: int = 0
    failed: int = 0
    skipped: int = 0
    not_measured: int = 0
    suspect: int = 0

    @classmethod
    def of(cls, rows: Iterable[Row | Mapping[str, Any]]) -> Tally:
        counts = dict.fromkeys(("ok", "failed", "skipped", "not_measured", "suspect"), 0)
        for row in rows:
            row = row.as_dict() if isinstance(row, Row) else row
            if row["metric"] not in RESULT_METRICS and row["status"] != ERROR \
                    and not (row["metric"] == "output_check" and row["status"] == FAIL):
                continue
            counts[_TALLIED[row["status"]]] += 1
        return cls(**counts)

    def line(self) -> str:
        """"7 ok, 1 failed, 2 skipped" and, when there are any, the unmeasured and the suspect."""
        parts = [f"{self.ok} ok", f"{self.failed} failed", f"{self.skipped} skipped"]
        parts += [f"{self.not_measured} not measured"] if self.not_measured else []
        parts += [f"{self.suspect} suspect"] if self.suspect else []
        return ", ".join(parts)


_TALLIED = {OK: "ok", PASS: "ok", FAIL: "failed", ERROR: "failed", SKIPPED: "skipped", NOT_MEASURED: "not_measured",
            SUSPECT: "suspect"}


@dataclass(frozen=True)
class RoundSamples:
    """One round of one candidate: every rep's time in ms, in the order timed, and the GPU's
    state read over the round (a :class:`~kernelbench.harness.gpustate.GpuState`, or None)."""

    op: str
    workload: str
    mode: str
    candidate: str
    metric: str  # the row these times make: time_median_ms or host_per_call_ms
    round: int
    times: tuple[float, ...]
    gpu: Any = None


class SampleSink(Protocol):
    def add_round(self, samples: RoundSamples) -> None: ...
