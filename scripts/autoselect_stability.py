"""Whether ``impl="auto"`` makes the same choices in every process: each of ``--processes`` fresh
processes builds the models of the grid rows named, with the candidate's layers, runs one step
(where the choices are measured, as ``llama-step`` does) with an empty choice cache per model, and
prints each choice with the two times it was made from; then a count of the (row, op, shape) keys
whose choice differed between processes.

    python scripts/autoselect_stability.py -w qwen2.5-0.5b-layer4 smollm-135m-layer4 --processes 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from common import emit, require_cuda


def child(workloads: list[str], candidate: str) -> None:
    from kernelbench.nn import autoselect_report
    from kernelbench.nn.autoselect import CACHE_ENV, clear_memory_cache, recording_choices
    from kernelbench.ops import get_op
    from kernelbench.ops.llama_step import LlamaStepCase

    require_cuda("autoselect_stability")
    op = get_op("llama-step")
    spec = op.get_candidate(candidate).build()
    for name in workloads:
        with tempfile.TemporaryDirectory() as cache:
            os.environ[CACHE_ENV] = cache  # nothing read from an earlier process or model
            clear_memory_cache()
            with recording_choices() as seen:
                case = LlamaStepCase(spec, op.workloads[name], "cuda", "fwd+bwd")
                case.prepare()
                case.run()
            for (op_name, shape, dtype, _device, mode, variant), choice in sorted(seen.items(), key=str):
                times = autoselect_report(op_name, shape, dtype, mode=mode, variant=variant)["times_ms"]
                print(json.dumps({"workload": name, "op": op_name, "variant": variant, "shape": list(shape),
                                  "choice": choice, "times_ms": times}), flush=True)
            del case


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-w", "--workloads", nargs="+", required=True, help="grid rows")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--candidate", default="kernelbench-eager+auto")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.workloads, args.candidate)
        return
    seen: dict[tuple, list[str]] = defaultdict(list)
    for process in range(args.processes):
        out = subprocess.run([sys.executable, str(Path(__file__)), "--child", "--candidate", args.candidate,
                              "-w", *args.workloads], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                seen[(row["workload"], row["op"], row["variant"], tuple(row["shape"]))].append(row["choice"])
                times = ", ".join(f"{k} {v:.4f}" for k, v in row["times_ms"].items() if v is not None)
                print(f"process {process}: {row['workload']} {row['op']} {row['variant']} {row['shape']}: "
                      f"{row['choice']} ({times} ms)")
                emit(process=process, **row)
    flipped = {key: choices for key, choices in seen.items() if len(set(choices)) > 1}
    print(f"{len(flipped)} of {len(seen)} choices differed between {args.processes} processes")
    for key, choices in flipped.items():
        print(f"  {key}: {choices}")
    emit(keys=len(seen), differed=len(flipped), processes=args.processes)


if __name__ == "__main__":
    main()
