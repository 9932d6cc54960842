"""Per-rep times and per-round state beside ``results.csv``: what ``compare``, ``ab``, ``history``
and ``plot`` judge from, and what pandas reads directly.

- ``samples.csv.gz``: one line per timed rep: op, workload, mode, candidate, metric (the row the
  times make: ``time_median_ms`` or ``host_per_call_ms``), round (from 1), ms (5 significant
  digits), in the order the reps ran. Written in gzip members as the run goes (pandas and gzip
  read the members as one file), so an interrupted run keeps what it measured.
- ``rounds.csv``: one line per (candidate, round): reps, the round's median and min, and the GPU's
  state over the round (clocks, temperature, power, clock-event reasons, ``throttled``).

``pd.read_csv(folder / "samples.csv.gz")`` is all a reader needs.
"""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import pandas as pd

from ..harness.gpustate import GPU_STATE_FIELDS
from ..harness.rows import RoundSamples

SAMPLES_CSV, ROUNDS_CSV = "samples.csv.gz", "rounds.csv"
KEYS = ["op", "workload", "mode", "candidate"]
SAMPLE_COLUMNS = [*KEYS, "metric", "round", "ms"]
ROUND_COLUMNS = [*KEYS, "metric", "round", "reps", "median_ms", "min_ms",
                 *(f"gpu_{name}" for name in GPU_STATE_FIELDS)]
# CUDA events resolve about half a microsecond; 5 significant digits keep 1e-4 of any time and
# make a CI suite's ~20,000 reps about 55 KB once compressed.
FLOAT_FORMAT = "%.5g"
_FLUSH_EVERY_S = 5.0


class SamplesFile:
    """Appends rounds to ``samples.csv.gz`` (buffered, one gzip member per flush) and
    ``rounds.csv`` (a line per round, at once). Files appear with the first round."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._pending: list[RoundSamples] = []
        self._last_flush = time.monotonic()
        self.reps = 0
        self.rounds: list[dict] = []

    def add(self, samples: RoundSamples) -> None:
        times = pd.Series(samples.times, dtype=float)
        gpu = samples.gpu.as_dict() if samples.gpu is not None else {}
        line = {"op": samples.op, "workload": samples.workload, "mode": samples.mode,
                "candidate": samples.candidate, "metric": samples.metric, "round": samples.round,
                "reps": len(times), "median_ms": times.median() if len(times) else None,
                "min_ms": times.min() if len(times) else None,
                **{f"gpu_{name}": gpu.get(name) for name in GPU_STATE_FIELDS}}
        path = self.folder / ROUNDS_CSV
        pd.DataFrame([line], columns=ROUND_COLUMNS).to_csv(path, mode="a", header=not path.exists(), index=False,
                                                           float_format=FLOAT_FORMAT)
        self.rounds.append(line)
        self.reps += len(times)
        self._pending.append(samples)
        if time.monotonic() - self._last_flush > _FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        frame = pd.DataFrame(
            [(s.op, s.workload, s.mode, s.candidate, s.metric, s.round, t) for s in self._pending for t in s.times],
            columns=SAMPLE_COLUMNS)
        self._pending = []
        path = self.folder / SAMPLES_CSV
        text = frame.to_csv(None, header=not path.exists(), index=False, float_format=FLOAT_FORMAT)
        with open(path, "ab") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(text.encode())

    def summary(self) -> dict:
        """What run.json says of the samples and of the GPU's state."""
        if not self.rounds:
            return {}
        sources = sorted({str(r["gpu_source"]) for r in self.rounds if r.get("gpu_source")})
        throttled = [r for r in self.rounds if r.get("gpu_throttled")]
        return {"samples_file": SAMPLES_CSV, "rounds_file": ROUNDS_CSV, "reps": self.reps,
                "gpu_state_source": ", ".join(sources) or "not sampled",
                "throttled_rounds": len(throttled),
                "throttled_rows": sorted({"/".join(str(r[k]) for k in KEYS) for r in throttled})}


def _read(path: Path, columns: list[str], what: str) -> pd.DataFrame | None:
    from .writer import ReportError, read_csv  # writer imports this module

    if not path.is_file():
        return None
    try:
        return read_csv(path, columns, what=what)
    except EOFError:  # a gzip member cut short: the run was killed while writing it
        raise ReportError(f"{path}: cut short (a run killed while writing it); delete it to fall back to "
                          "the results' medians") from None


def load_samples(folder: Path) -> pd.DataFrame | None:
    """The report's per-rep times (columns SAMPLE_COLUMNS), or None for a report without them; a
    ReportError names a file that cannot be read."""
    frame = _read(Path(folder) / SAMPLES_CSV, SAMPLE_COLUMNS, "samples")
    return None if frame is None else frame.astype({k: str for k in KEYS + ["metric"]})


def load_rounds(folder: Path) -> pd.DataFrame | None:
    """Per-round medians and GPU state, or None for a report without them."""
    return _read(Path(folder) / ROUNDS_CSV, [*KEYS, "metric", "round", "reps", "median_ms"], "rounds")
