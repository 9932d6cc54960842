"""What every probe shares: the harness's timing loop (CUDA events, cold L2, median), host time
per call, interleaved candidates, and one JSON line per result.

Probes run from the repository root (``python scripts/probes/<name>.py``) on a CUDA machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The checkout's kernelbench, also when it is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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


def rmsnorm_host_inputs(n_rows: int = 8, n: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x and the weight (both requiring grad) and an upstream gradient, bf16 on the GPU: a
    launch-bound RMSNorm call, where the host decides the speed."""
    x = torch.randn(n_rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(n_rows, n, device="cuda", dtype=torch.bfloat16)
    return x, w, dy


def fwd_bwd(forward: Callable[[], torch.Tensor], dy: torch.Tensor,
            single_threaded: bool = False) -> Callable[[], None]:
    """A forward + backward; ``single_threaded``: the backward on the calling thread instead of
    the autograd engine's device thread."""
    def run() -> None:
        if single_threaded:
            with torch.autograd.set_multithreading_enabled(False):
                torch.autograd.backward(forward(), dy)
        else:
            torch.autograd.backward(forward(), dy)
    return run


def print_rounds(results: dict[str, list[float]], width: int = 48, base: str | None = None) -> None:
    """Each case's median over rounds in microseconds, its ratio to case ``base`` if given, and
    the rounds."""
    base_us = statistics.median(results[base]) if base else None
    for name, values in results.items():
        med = statistics.median(values)
        ratio = f"  {med / base_us:5.2f}x" if base_us else ""
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:{width}s} {med:8.1f} us{ratio}  (rounds: {rounds})")
