"""What a compiled ``llama-step`` costs the host before its graphs run: Dynamo's guard check.

For each candidate, built and warmed up as the harness builds it: the number of cache entries of
the compiled step (more than one means a recompilation, and each call may check several), the
time of one guard check (best of ``--rounds`` loops of ``--checks`` checks), the guard nodes by
kind, the Python part of the check under cProfile, and with ``--dump DIR`` the whole guard tree
(``DIR/<candidate>.txt``), so two candidates' trees can be diffed.

    python scripts/step_guards.py --candidates torch-cudagraphs kernelbench-cudagraphs+auto -w llama-7m
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dis
import io
import pstats
import re
import time
from pathlib import Path

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase

import common  # noqa: F401  (puts the checkout's kernelbench first on sys.path)


def build(name: str, workload_name: str, device: str) -> LlamaStepCase:
    op = get_op("llama-step")
    workload = op.workloads.get(workload_name) or op.custom_workload(workload_name)
    if workload is None:
        raise SystemExit(f"-w {workload_name}: not a grid name nor MODEL@BxS")
    case = LlamaStepCase(op.get_candidate(name).build(), workload, device, "fwd+bwd")
    for _ in range(3):
        case.prepare()
        case.run()
    return case


def check_time_us(check, f_locals: dict, checks: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(checks):
            check(f_locals)
        best = min(best, (time.perf_counter() - start) / checks * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", nargs="+", required=True)
    parser.add_argument("-w", "--workload", default="llama-7m")
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dump", type=Path, help="write each candidate's guard tree here")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = {name: build(name, args.workload, device) for name in args.candidates}
    for name, case in cases.items():
        # Every candidate's step is the same function, so its code object holds one cache entry
        # per candidate (and one per recompilation): a call checks them in order until one passes.
        entries = _debug_get_cache_entry_list(case._loss_and_logits.__func__.__code__)
        f_locals = {"self": case, "tokens": case.inputs, "targets": case.targets}
        passing = [i for i, entry in enumerate(entries) if entry.guard_manager.check(f_locals)]
        if not passing:
            raise SystemExit(f"{name}: no cache entry's guards pass on the step's own inputs")
        manager = entries[passing[0]].guard_manager
        misses = [check_time_us(entries[i].guard_manager.check, f_locals, args.checks, args.rounds)
                  for i in range(passing[0])]
        tree = str(manager)
        kinds = collections.Counter(re.findall(r"\+- ([A-Z_]+):", tree))
        us = check_time_us(manager.check, f_locals, args.checks, args.rounds)
        print(f"== {name}: entry {passing[0] + 1} of {len(entries)} passes; {sum(kinds.values())} guards, "
              f"one check {us:.1f} us (best of {args.rounds} x {args.checks}); the entries before it fail in "
              + (", ".join(f"{m:.1f}" for m in misses) + " us" if misses else "-"))
        print("   " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.checks):
            manager.check(f_locals)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(6)
        print("\n".join("   " + line for line in text.getvalue().splitlines() if line.strip()))
        code = entries[passing[0]].code
        instructions = list(dis.get_instructions(code))
        effects = ("STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR", "STORE_GLOBAL")
        stores = [f"{i.opname} {i.argrepr}" for i in instructions if i.opname in effects]
        print(f"   the compiled frame: {len(instructions)} instructions, "
              f"{sum(i.opname.startswith('CALL') for i in instructions)} calls; side effects replayed: "
              + (", ".join(stores) if stores else "none"))
        forward = cProfile.Profile()
        for _ in range(200):
            case.prepare()
            if case._cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            forward.enable()
            loss, _ = case.step(case.inputs, case.targets)
            forward.disable()
            loss.backward()
        text = io.StringIO()
        pstats.Stats(forward, stream=text).sort_stats("tottime").print_stats(14)
        print("   the forward call, 200 calls under cProfile:")
        print("\n".join("   " + line for line in text.getvalue().splitlines() if line.strip()))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name.replace('+', '_')}.txt").write_text(tree)


if __name__ == "__main__":
    main()
