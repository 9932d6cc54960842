"""Where the host's Python time of a model step goes, per llama-step candidate: cProfile over
N steps of each (built as the harness builds them), the functions whose own time differs most
between the first candidate and each other one.

    python scripts/step_cprofile.py -w llama-7m -c torch-cudagraphs kernelbench-cudagraphs+auto [--steps 300]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def own_times(case: LlamaStepCase, steps: int) -> tuple[dict[str, tuple[float, int]], float]:
    """{function: (own seconds per step, calls per step)} and the profiled seconds per step."""
    profiler = cProfile.Profile()
    _sync()
    profiler.enable()
    for _ in range(steps):
        case.prepare()
        case.run()
    _sync()
    profiler.disable()
    stats = pstats.Stats(profiler)
    table = {}
    total = 0.0
    for (path, line, name), (_, calls, own, _, _) in stats.stats.items():
        key = f"{path.split('site-packages/')[-1]}:{line}:{name}"
        table[key] = (own / steps, calls / steps)
        total += own
    return table, total / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-w", "--workload", default="llama-7m")
    parser.add_argument("-c", "--candidates", nargs="+", default=["torch-cudagraphs", "kernelbench-cudagraphs+auto"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    op = get_op("llama-step")
    workload = op.workloads.get(args.workload) or op.custom_workload(args.workload)
    cases = {name: LlamaStepCase(op.get_candidate(name).build(), workload, args.device, "fwd+bwd")
             for name in args.candidates}
    for case in cases.values():
        for _ in range(20):
            case.prepare()
            case.run()
    # Twice, alternated: the second pass is the one kept (caches warm for both).
    tables = {}
    for _ in range(2):
        for name, case in cases.items():
            tables[name] = own_times(case, args.steps)
    first = args.candidates[0]
    base, base_total = tables[first]
    print(f"{args.workload}: profiled Python time per step, {first}: {base_total * 1e3:.3f} ms")
    for name in args.candidates[1:]:
        table, total = tables[name]
        print(f"\n{name}: {total * 1e3:.3f} ms per step; functions by own time, us per step ({name} - {first})")
        keys = set(base) | set(table)
        diffs = sorted(keys, key=lambda k: -abs(table.get(k, (0, 0))[0] - base.get(k, (0, 0))[0]))
        for key in diffs[:args.top]:
            mine, theirs = table.get(key, (0.0, 0.0)), base.get(key, (0.0, 0.0))
            print(f"  {(mine[0] - theirs[0]) * 1e6:+8.1f}  {mine[0] * 1e6:8.1f} vs {theirs[0] * 1e6:8.1f}  "
                  f"calls {mine[1]:6.1f} vs {theirs[1]:6.1f}  {key[:110]}")
        print(f"\n{name}: top own time")
        for key in sorted(table, key=lambda k: -table[k][0])[:args.top]:
            print(f"  {table[key][0] * 1e6:8.1f} us  {table[key][1]:6.1f} calls  {key[:110]}")


if __name__ == "__main__":
    main()
