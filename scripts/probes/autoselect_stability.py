"""How steady ``impl="auto"``'s choice is for RMSNorm, and whether it picks what is faster when
calls come back to back (as a model makes them). For each shape and mode, ``--trials`` fresh
decisions with auto-selection's own timer (CUDA events around each call) and with events around
``--batch`` back-to-back calls; then each implementation's steady cost per call: perf_counter
over ``--calls`` back-to-back calls plus the final synchronisation, in interleaved rounds.

    python scripts/probes/autoselect_stability.py [--trials 8] [--batch 8] [--calls 400]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kernelbench.nn import autoselect
from kernelbench.nn.rmsnorm import AUTOSELECT

from common import emit, require_cuda

SHAPES = ((8, 4096), (256, 4096), (32768, 4096))


def batched_timer(batch: int) -> autoselect.Timer:
    """Auto-selection's interleaved median, each rep ``batch`` calls between one pair of events."""
    def timer(runners: dict[str, Callable[[], None]]) -> dict[str, float]:
        def batched(run: Callable[[], None]) -> Callable[[], None]:
            def calls() -> None:
                for _ in range(batch):
                    run()
            return calls
        per_rep = autoselect.cuda_event_timer({name: batched(run) for name, run in runners.items()})
        return {name: ms / batch for name, ms in per_rep.items()}
    return timer


def steady_us(runners: dict[str, Callable[[], None]], calls: int, rounds: int = 5) -> dict[str, float]:
    """Per-call microseconds over ``calls`` back-to-back calls, synchronised once at the end."""
    results: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():
        for _ in range(10):
            run()
    for _ in range(rounds):
        for name, run in runners.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            torch.cuda.synchronize()
            results[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    require_cuda("autoselect_stability")
    timers = {"per-call": autoselect.cuda_event_timer, f"batch-{args.batch}": batched_timer(args.batch)}
    for shape in SHAPES:
        for mode in autoselect.MODES:
            for timer_name, timer in timers.items():
                choices, ratios = [], []
                for _ in range(args.trials):
                    report = autoselect.autoselect_report(AUTOSELECT, shape, torch.bfloat16, mode=mode,
                                                          timer=timer, refresh=True)
                    times = report["times_ms"]
                    choices.append(report["choice"])
                    ratios.append(round(times["triton"] / times["torch"], 3))
                emit(shape=list(shape), mode=mode, timer=timer_name, choices=choices,
                     triton_over_torch=ratios)
            runners = AUTOSELECT.runners(shape, torch.bfloat16, "cuda", mode, "")
            steady = steady_us(runners, args.calls if shape[0] < 1024 else 40)
            emit(shape=list(shape), mode=mode, steady_us_per_call={k: round(v, 1) for k, v in steady.items()},
                 triton_over_torch=round(steady["triton"] / steady["torch"], 3))


if __name__ == "__main__":
    main()
