"""Checks the harness's timing loop against triton.testing.do_bench in the same process.

Times torch fused AdamW on single-4096x1024 alternately with the harness and with
``do_bench(..., return_mode="median")`` (both flush L2 between reps), several times each, and
prints a JSON line with every median and the ratio of the medians of medians; exits 1 when
the two are more than 5% apart.

    python scripts/timing_selfcheck.py
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

from kernelbench.ops import get_op

from common import device_ms, emit, require_cuda

ROUNDS = 5


def main() -> int:
    require_cuda("timing_selfcheck")
    op = get_op("adamw")
    case = op.make_case(op.get_candidate("torch-fused"), op.workload("single-4096x1024"), "cuda", "step")
    harness, do_bench = [], []
    for _ in range(ROUNDS):
        harness.append(device_ms(case.run, case.prepare))
        do_bench.append(triton.testing.do_bench(case.run, warmup=25, rep=100, return_mode="median"))
    h, d = statistics.median(harness), statistics.median(do_bench)
    within = abs(h / d - 1) <= 0.05
    emit(what="torch.optim.AdamW(fused=True) step, single-4096x1024, fp32",
         gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
         harness_median_ms=h, do_bench_median_ms=d, ratio=h / d,
         harness_medians_ms=harness, do_bench_medians_ms=do_bench, within_5_percent=within)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
