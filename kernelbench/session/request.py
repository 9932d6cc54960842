"""What a session is asked to do and what it answers: typed requests in, typed outcomes out.

A front end (the CLI) builds a request, hands it to :class:`~kernelbench.session.Session` with a
:class:`Listener` for what should be shown while it runs, and maps the outcome's ``status`` to
its exit code. Imports neither torch nor pandas.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..harness.rows import Tally
from ..harness.settings import DEFAULT_PARITY_DETAIL, DEFAULT_TIMING, PARITY_STEPS, TimingConfig


@dataclass
class Entry:
    """One op to time or check: a suite's [[bench]] / [[parity]] table, or the CLI's op and its
    -c / -w / -m / --state / --sweep. None means the op's default (every candidate after
    ``tags``, the device's workloads, every mode). ``sweep`` (``N=256..65536``) varies one
    dimension of the one shape ``workloads`` gives, else of the op's example shape for the device.
    ``options``: a launched op's own options by flag (``--nproc``), from a suite's ``options`` table."""

    op: str
    workloads: list[str] | None = None
    candidates: list[str] | None = None
    modes: list[str] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    steps: int = PARITY_STEPS
    exclude: list[str] = field(default_factory=list)
    atol: float | None = None
    rtol: float | None = None
    sweep: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputSettings:
    """Where the report goes (default: reports/<UTC time>-<verb>-<label>/) and how much of
    each parity check it keeps ("worst" or "full" per-tensor rows)."""

    folder: Path | None = None
    parity_detail: str = DEFAULT_PARITY_DETAIL


@dataclass(frozen=True)
class RunRequest:
    """Time ``bench`` and check ``parity`` on ``device`` into one report. ``op_options``: the
    options of ops that start their own processes (``--nproc``...), by flag; ``recorded``:
    settings run.json keeps besides the timing (a suite's name); ``lock_clocks``: the GPU's
    application clocks locked for the run where permitted, and put back after it."""

    verb: str
    label: str
    bench: tuple[Entry, ...] = ()
    parity: tuple[Entry, ...] = ()
    device: str = "auto"
    timing: TimingConfig = DEFAULT_TIMING
    seed: int = 0
    telemetry: bool = False
    op_options: dict[str, Any] = field(default_factory=dict)
    output: OutputSettings = OutputSettings()
    recorded: dict[str, Any] = field(default_factory=dict)
    fsdp_nproc: int | None = None  # parity: each optimizer candidate under FSDP2 on this many ranks
    lock_clocks: bool = False


@dataclass(frozen=True)
class TrainRequest:
    """Train ``op``'s candidates (``candidates`` / ``tags`` select, as in run); None takes the
    device's default (see kernelbench.train.TrainSettings.defaults)."""

    op: str
    device: str = "auto"
    model: str | None = None
    steps: int | None = None
    batch: int | None = None
    seq: int | None = None
    seed: int | None = None
    lr: float | None = None
    rtol: float | None = None
    ref_seeds: int | None = None
    data: str | None = None  # the token stream (kernelbench.train.data.DATA_SETS)
    candidates: list[str] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    output: OutputSettings = OutputSettings()
    fsdp_nproc: int | None = None  # every run with the model under FSDP2 on this many ranks
    plugins: list[str] | None = None  # --plugin: files or modules loaded before the op is looked up


class Status(enum.Enum):
    """How a session ended; a front end maps each to its exit code."""

    COMPLETE = "complete"
    NOTHING_MEASURED = "nothing measured"  # ran, but only in the Triton interpreter: no times
    PARITY_FAILED = "parity failed"  # a check failed, parity's or a timed result's (train: left the band)
    NOTHING_RAN = "nothing ran"  # nothing that was asked for could run here
    INTERRUPTED = "interrupted"  # SIGINT / SIGTERM / SIGHUP: the report is closed and says so


@dataclass
class Outcome:
    """What a session did: its report folder and rows, how it ended (``status``, with
    ``message`` saying why in one line and ``reasons`` listing what could not run), the signal
    that stopped it and a tally of the results."""

    verb: str
    folder: Path
    rows: list[dict[str, Any]]
    status: Status = Status.COMPLETE
    message: str = ""
    reasons: list[str] = field(default_factory=list)
    interruption: str | None = None
    detail: Any = None  # what the verb adds (train: its TrainResult)

    @property
    def tally(self) -> Tally:
        return Tally.of(self.rows)


class Listener:
    """What a session shows while it runs; the base shows nothing. ``note(important=True)``: a
    line worth colour (what a run on this device is and is not worth)."""

    def note(self, text: str, *, important: bool = False) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def error(self, text: str) -> None:
        pass

    def progress(self, text: str) -> None:
        pass
