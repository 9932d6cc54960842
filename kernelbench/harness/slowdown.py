"""A known slowdown, for proving that ``compare`` and ``ab`` catch one: tests and the GPU proof only.

``KERNELBENCH_TEST_SLOWDOWN="OP/CANDIDATE=FRACTION"`` (several separated by commas;
``OP/WORKLOAD/MODE/CANDIDATE=FRACTION`` for one case) makes the runner follow every call of that
candidate with idle work lasting FRACTION of the call's own median time, measured once before the
timing starts: on CUDA a spin kernel (``torch.cuda._sleep``) on the same stream, on the CPU a busy
wait on the thread's own CPU clock, so that a loaded host stretches the delay as it stretches the call.
The kernels and the library are untouched; the report flags the row ``test-slowdown`` and
records the delay in a ``test_slowdown_ms`` row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import torch

from ..ops.base import UsageError
from .timing import TimingConfig, time_cpu, time_cuda

ENV = "KERNELBENCH_TEST_SLOWDOWN"
_CALIBRATION = TimingConfig(warmup_ms=10.0, rep_ms=50.0)


def parse(spec: str) -> dict[str, float]:
    """{"op/candidate" or "op/workload/mode/candidate": fraction} from the variable's text."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.rpartition("=")
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if key.count("/") not in (1, 3) or not fraction > 0:
            raise UsageError(f"{ENV}={spec!r}: expected OP/CANDIDATE=FRACTION or OP/WORKLOAD/MODE/CANDIDATE=FRACTION "
                             "with FRACTION > 0, e.g. rmsnorm/triton=0.05")
        out[key] = fraction
    return out


def requested(op: str, workload: str, mode: str, candidate: str,
              environ: Mapping[str, str] = os.environ) -> float | None:
    """The fraction asked for this case, or None (the variable unset or naming other cases)."""
    spec = environ.get(ENV, "")
    if not spec:
        return None
    wanted = parse(spec)
    return wanted.get(f"{op}/{workload}/{mode}/{candidate}", wanted.get(f"{op}/{candidate}"))


def _cuda_cycles_per_ms() -> float:
    """Clock cycles torch.cuda._sleep spins per ms, from the median of five timed spins."""
    cycles = 1_000_000
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return cycles / sorted(times)[2]


def slowed(run: Callable[[], None], prepare: Callable[[], None], fraction: float,
           device: str) -> tuple[Callable[[], None], float]:
    """``run`` followed by idle work of ``fraction`` x its median time, and that delay in ms."""
    timer = time_cuda if device == "cuda" else time_cpu
    times = sorted(timer(run, prepare, _CALIBRATION).times)
    delay_ms = fraction * times[len(times) // 2]
    if device == "cuda":
        cycles = max(1, int(delay_ms * _cuda_cycles_per_ms()))

        def run_then_spin() -> None:
            run()
            torch.cuda._sleep(cycles)

        return run_then_spin, delay_ms

    def run_then_wait() -> None:
        run()
        # CPU time, not wall time: while the thread waits for a core the delay waits too.
        deadline = time.thread_time() + delay_ms / 1e3
        while time.thread_time() < deadline:
            pass

    return run_then_wait, delay_ms
