"""What the scripts share: the harness's timing loop (CUDA events, cold L2, median), host time
per call, interleaved candidates, and one JSON line per result.

Scripts run from the repository root (``python scripts/<name>.py``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The checkout's kernelbench, also when it is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from kernelbench.harness.stats import summarize
from kernelbench.harness.timing import TimingConfig, time_cuda


def _no_prep() -> None:
    pass


def device_times(fn: Callable[[], object], prepare: Callable[[], None] = _no_prep,
                 config: TimingConfig = TimingConfig()) -> list[float]:
    """Per-rep device times (ms) of ``fn`` by the harness's loop."""
    return time_cuda(fn, prepare, config).times


def device_ms(fn: Callable[[], object], prepare: Callable[[], None] = _no_prep,
              config: TimingConfig = TimingConfig()) -> float:
    """Median device time (ms) of ``fn`` by the harness's loop."""
    return summarize(device_times(fn, prepare, config)).median


def interleaved_ms(cases: dict[str, Callable[[], object]], rounds: int = 3,
                   config: TimingConfig = TimingConfig()) -> dict[str, float]:
    """Median device time (ms) per case, the cases timed in turn ``rounds`` times (A B A B ...)
    so that drift of clocks or temperature hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name] += device_times(fn, config=config)
    return {name: summarize(t).median for name, t in times.items()}


def host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Host microseconds to enqueue one call (back-to-back calls, perf_counter), after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def interleaved_host_us(cases: dict[str, Callable[[], object]], rounds: int = 3, calls: int = 300) -> dict[str, float]:
    """Host microseconds per call of each case (``host_us``), the cases in turn ``rounds`` times;
    the median of the rounds. For calls small enough that the GPU keeps up with the host."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(host_us(fn, calls))
    return {name: statistics.median(t) for name, t in times.items()}


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``x`` against ``ref``, in fp32."""
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


def require_cuda(who: str) -> torch.device:
    if not torch.cuda.is_available():
        raise SystemExit(f"{who} needs a CUDA GPU; none is visible here.")
    return torch.device("cuda")
