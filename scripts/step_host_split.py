"""Where a compiled ``llama-step``'s host time goes: its forward call and its backward call timed
apart on the host (perf_counter, no synchronisation inside a step, so each is the time to enqueue),
candidates interleaved round by round; and for CUDA-graph candidates each recorded graph's inputs
(static / copied each replay) and outputs.

    python scripts/step_host_split.py --candidates torch-cudagraphs kernelbench-cudagraphs+auto -w llama-7m
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase

import common  # noqa: F401


def graph_nodes() -> list:
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    if manager is None:
        return []
    nodes, todo = [], [n for roots in manager.roots.values() for n in roots]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(child for children in node.children.values() for child in children)
    return nodes


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
        before = {id(n) for n in graph_nodes()}
        case = LlamaStepCase(op.get_candidate(name).build(), workload, "cuda", "fwd+bwd")
        for _ in range(3):
            case.prepare()
            case.run()
        cases[name] = case
        for node in graph_nodes():
            if id(node) not in before:
                print(f"== {name}: graph {node.wrapped_function.id}: {len(node.static_input_idxs)} static inputs, "
                      f"{len(node.non_static_input_idx)} copied, {len(node.outputs_weakrefs)} outputs")
    times = {name: {"forward": [], "backward": [], "step": []} for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            fwd, bwd, step = [], [], []
            torch.cuda.synchronize()
            for _ in range(args.steps):
                case.prepare()
                if case._cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                t0 = time.perf_counter()
                loss, _ = case.step(case.inputs, case.targets)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
                step.append(t3 - t0)
            for key, values in (("forward", fwd), ("backward", bwd), ("step", step)):
                times[name][key].append(statistics.median(values) * 1e3)
    for name, parts in times.items():
        print(f"{name}: " + ", ".join(
            f"{key} {statistics.median(v):.3f} ms (rounds {min(v):.3f}-{max(v):.3f})" for key, v in parts.items()))


if __name__ == "__main__":
    main()
