"""Pilot: RMSNorm's forward kernel as a ``torch.library.triton_op`` (Inductor launches the Triton
kernel itself) against the custom op kernelbench ships (a Python op per call) and the same body
behind a bare ``torch.library.Library`` kernel, inside a compiled graph of ``--chain`` norms on
``--shape`` bf16 rows (no grad).

Checks that the triton_op compiles (the kernel's dtype constexpr ACC and its float ``eps``), that its
output equals the eager kernel's bit for bit, and times the host's cost per norm: the compiled
chain issued into an empty launch queue, divided by the chain's length.

    python scripts/probes/triton_op_pilot.py [--shape 4096x256] [--chain 20] [--reps 50] [--weight-requires-grad]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton
from torch.library import triton_op, wrap_triton

import kernelbench.nn.rmsnorm_kernels as K
from kernelbench.nn._triton_support import tl_acc

from common import emit, require_cuda


@triton_op("kernelbench_pilot::rms_norm_fwd", mutates_args=())
def pilot_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    m, n = x.shape
    config = K.fwd_config(n)
    y = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    wrap_triton(K._rmsnorm_fwd_kernel)[(triton.cdiv(m, config.block_m),)](
        x, x.stride(0), x, 0, weight, y, y.stride(0), y, 0, rstd, m, n, eps,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, SINGLE_PASS=config.single_pass,
        HAS_RESIDUAL=False, HAS_WEIGHT=True, ACC=tl_acc(x.dtype),
        EARLY_WEIGHT=config.single_pass and config.early_weight, num_warps=config.num_warps,
    )
    return y


def shipped_rms_norm(x, weight, eps):
    return torch.ops.kernelbench.rms_norm_fwd(x, weight, None, eps)[0]


# The shipped op's body behind a bare torch.library kernel: no torch.library Python wrappers
# (autograd kernel, alias check, Dynamo-disable), to split the shipped op's host cost.
_bare = torch.library.Library("kernelbench_pilot", "FRAGMENT")
_bare.define("rms_norm_fwd_bare(Tensor x, Tensor weight, float eps) -> Tensor")
_bare.impl("rms_norm_fwd_bare", lambda x, weight, eps: K._forward(x, weight, None, eps)[0], "CUDA")
torch.library.register_fake("kernelbench_pilot::rms_norm_fwd_bare", lambda x, weight, eps: torch.empty_like(x))


def bare_rms_norm(x, weight, eps):
    return torch.ops.kernelbench_pilot.rms_norm_fwd_bare(x, weight, eps)


def host_ms_per_call(fn, x, w, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x, w)
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4096x256")
    parser.add_argument("--chain", type=int, default=20)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--weight-requires-grad", action="store_true",
                        help="the weight requires grad (still run under no_grad), as a model's parameters in a "
                             "compiled training graph: each op call then also passes the Autograd dispatch key")
    args = parser.parse_args()
    device = require_cuda("triton_op_pilot")
    m, n = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, n, generator=gen, device=device).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(torch.bfloat16)
    w.requires_grad_(args.weight_requires_grad)
    with torch.no_grad():
        want = K._forward(x, w, None, 1e-6)[0]
    for name, norm in (("triton_op", pilot_rms_norm), ("shipped custom op", shipped_rms_norm),
                       ("bare Library op", bare_rms_norm)):
        def chain(x, w, norm=norm):
            for _ in range(args.chain):
                x = norm(x, w, 1e-6)
            return x

        try:
            compiled = torch.compile(chain, fullgraph=True)
            with torch.no_grad():
                one = torch.compile(lambda x, w, norm=norm: norm(x, w, 1e-6), fullgraph=True)(x, w)
                compiled(x, w)
                per_call = host_ms_per_call(compiled, x, w, args.reps) / args.chain
        except Exception as exc:  # the pilot's finding is also what fails
            print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            emit(case=name, error=f"{type(exc).__name__}: {str(exc)[:500]}")
            continue
        equal = torch.equal(one, want)
        differ = int((one != want).sum())
        worst = (one.float() - want.float()).abs().max().item()
        print(f"{name}: output equal to the eager kernel's: {equal} ({differ} of {one.numel()} elements "
              f"differ, at most {worst:.3g}); host time per norm in the compiled chain: {per_call * 1e3:.1f} us")
        emit(case=name, equal=equal, elements_differing=differ, max_abs_diff=worst,
             host_us_per_norm=round(per_call * 1e3, 2))


if __name__ == "__main__":
    main()
