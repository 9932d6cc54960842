"""Guard check time of a compiled llama-step candidate, hot (a loop of checks) and cold (one check
right after each full step, as a training loop meets it)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase

import common  # noqa: F401


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", nargs="+", required=True)
    parser.add_argument("-w", "--workload", default="llama-7m")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    op = get_op("llama-step")
    workload = op.workloads.get(args.workload) or op.custom_workload(args.workload)
    cases = {}
    for name in args.candidates:
        case = LlamaStepCase(op.get_candidate(name).build(), workload, "cuda", "fwd+bwd")
        for _ in range(3):
            case.prepare()
            case.run()
        cases[name] = case
    checks = {}
    for name, case in cases.items():
        f_locals = {"self": case, "tokens": case.inputs, "targets": case.targets}
        entries = _debug_get_cache_entry_list(case._loss_and_logits.__func__.__code__)
        checks[name] = (next(e.guard_manager for e in entries if e.guard_manager.check(f_locals)), f_locals)
    cold = {name: [] for name in cases}
    hot = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            manager, f_locals = checks[name]
            times = []
            for _ in range(args.steps):
                case.prepare()
                case.run()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                manager.check(f_locals)
                times.append(time.perf_counter() - t0)
            cold[name].append(statistics.median(times) * 1e6)
            t0 = time.perf_counter()
            for _ in range(200):
                manager.check(f_locals)
            hot[name].append((time.perf_counter() - t0) / 200 * 1e6)
    for name in cases:
        print(f"{name}: guard check cold {statistics.median(cold[name]):.1f} us "
              f"(rounds {min(cold[name]):.1f}-{max(cold[name]):.1f}), hot {statistics.median(hot[name]):.1f} us")


if __name__ == "__main__":
    main()
