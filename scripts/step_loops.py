"""One model step timed by different loops in one process: does the harness's loop read a
host-bound step as a plain loop does?

    python scripts/step_loops.py -w llama-3.2-1b-layer4-1x512 [-c torch-eager kernelbench-eager+auto] [--rounds 7]

Per ``llama-step`` candidate, built as the harness builds it, interleaved over rounds:
``loop``: 10 steps back to back between two events, per step; ``harness``: the harness's loop
(``time_cuda``: a rep per step, L2 flushed between reps), median; ``harness-warm``: the same
without the flush; ``issue``: host time to enqueue one step from an empty queue; ``gc``:
collections by Python's cycle collector during the timed steps, and their time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from kernelbench.harness.timing import TimingConfig, issue_ms, time_cuda
from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase

from common import emit, require_cuda

LOOP_STEPS = 10


class GcClock:
    """Collections of Python's cycle collector and the time they took, while counting."""

    def __init__(self) -> None:
        self.count, self.ms, self._t0 = 0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-w", "--workload", default="llama-3.2-1b-layer4-1x512")
    parser.add_argument("-c", "--candidates", nargs="+", default=["torch-eager", "kernelbench-eager+auto"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rep-ms", type=float, default=500.0)
    args = parser.parse_args()
    require_cuda("step_loops")
    op = get_op("llama-step")
    workload = op.workloads.get(args.workload) or op.custom_workload(args.workload)
    cases = {name: LlamaStepCase(op.get_candidate(name).build(), workload, "cuda", "fwd+bwd")
             for name in args.candidates}
    for case in cases.values():
        for _ in range(3):
            case.prepare()
            case.run()
    torch.cuda.synchronize()
    clock = GcClock()
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in cases}

    def note(name: str, what: str, value: float) -> None:
        figures[name].setdefault(what, []).append(value)

    for _ in range(args.rounds):
        for name, case in cases.items():
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            before = (clock.count, clock.ms)
            start.record()
            for _ in range(LOOP_STEPS):
                case.prepare()
                case.run()
            end.record()
            torch.cuda.synchronize()
            note(name, "loop", start.elapsed_time(end) / LOOP_STEPS)
            note(name, "gc_per_step", (clock.count - before[0]) / LOOP_STEPS)
            note(name, "gc_ms_per_step", (clock.ms - before[1]) / LOOP_STEPS)
            for label, flush in (("harness", True), ("harness-warm", False)):
                sample = time_cuda(case.run, case.prepare, TimingConfig(warmup_ms=25, rep_ms=args.rep_ms,
                                                                          flush_l2=flush))
                note(name, label, statistics.median(sample.times))
            note(name, "issue", issue_ms(case.run, case.prepare))
    print(f"{args.workload}, {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"median of {args.rounds} rounds, ms per step")
    whats = list(next(iter(figures.values())))
    print("| candidate | " + " | ".join(whats) + " |")
    print("|---" * (len(whats) + 1) + "|")
    for name, by_what in figures.items():
        medians = {what: statistics.median(values) for what, values in by_what.items()}
        print(f"| {name} | " + " | ".join(f"{medians[w]:.3f}" for w in whats) + " |")
        emit(workload=args.workload, candidate=name, **{w: round(v, 4) for w, v in medians.items()},
             rounds={w: [round(v, 3) for v in vals] for w, vals in by_what.items()})


if __name__ == "__main__":
    main()
