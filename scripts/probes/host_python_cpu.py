"""The Python an eager RMSNorm forward + backward costs, measured on a CPU: kernelbench's
``rms_norm(impl="triton")`` on 8 x 4096 bf16 CPU tensors with every launch made a no-op, against
an ``autograd.Function`` that only allocates its outputs (the null Function), and the forward
without grad. By default through the launch-bound small call (bound by hand here: CPU tensors
have no direct launch of their own); ``--general`` through the general path.

    python scripts/probes/host_python_cpu.py [--general]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch

import kernelbench.nn.rmsnorm_kernels as K
from kernelbench.nn import rmsnorm as R


def no_launch(device, *args):
    return True


def bind_no_launch(self, aligned, args):  # stands in for _Launch.first_or_fallback: no Triton
    self.direct = no_launch


class Null(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return torch.empty_like(dy), torch.empty(dy.shape[-1], dtype=dy.dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--general", action="store_true", help="the general path, no small call")
    args = parser.parse_args()
    K._Launch.first_or_fallback = bind_no_launch
    K.sm_count = lambda device: 132
    K._current_device = lambda: -1
    R.runs_here = lambda t: True
    torch.autograd.set_multithreading_enabled(False)
    x = torch.randn(8, 4096, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8, 4096, dtype=torch.bfloat16)
    if not args.general:
        small = K._SmallCall(no_launch, None, -1, 8, 4096, False, K._scratch_rstd(8, x))
        small.bwd = no_launch
        K._small_calls[(x.shape, x.dtype, w.dtype, True, -1)] = small

    def ours():
        y = R.rms_norm(x, w, 1e-6, impl="triton")
        x.grad = w.grad = None
        y.backward(dy)

    def ours_forward_no_grad():
        with torch.no_grad():
            R.rms_norm(x, w, 1e-6, impl="triton")

    def null():
        y = Null.apply(x, w)
        x.grad = w.grad = None
        y.backward(dy)

    cases = {"ours fwd+bwd": ours, "null Function fwd+bwd": null, "ours fwd, no grad": ours_forward_no_grad}
    for case in cases.values():
        case()
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(15):  # interleaved rounds; each the best of 3 x 200 calls
        for name, case in cases.items():
            results[name].append(min(timeit.repeat(case, number=200, repeat=3)) / 200 * 1e6)
    for name, values in results.items():
        print(f"{name:24s} median {statistics.median(values):6.1f} us  min {min(values):6.1f}")
    gap = statistics.median(results["ours fwd+bwd"]) - statistics.median(results["null Function fwd+bwd"])
    print(f"ours - null Function: {gap:.1f} us")


if __name__ == "__main__":
    main()
