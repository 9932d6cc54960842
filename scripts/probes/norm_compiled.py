"""RMSNorm with a residual under torch.compile, alone: the GPU time of one forward + backward
(sum of its kernels, from torch.profiler, so the host's time does not count) for kernelbench's
op compiled, kernelbench eager and torch's layers compiled, at a model's shape and a large one.

    python scripts/probes/norm_compiled.py [--shapes 8192x2048 32768x4096] [--iters 20]

The gradients of y and h are given, so no gradient sum around the norm is in the timed work:
what it shows is each backward's own kernels (``results/2026-11-24-h100-model-step``).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from kernelbench.nn import rms_norm

from common import emit, require_cuda


def ours(x, r, w):
    return rms_norm(x, w, 1e-6, residual=r, impl="triton")


def torch_layers(x, r, w):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, 1e-6), h


def kernel_ms(step, iters: int) -> tuple[float, dict[str, float]]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name[:70]] = per_kernel.get(evt.name[:70], 0.0) + evt.device_time / iters / 1e3
    return sum(per_kernel.values()), per_kernel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["8192x2048", "32768x4096"])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    device = require_cuda("norm_compiled")
    for shape in args.shapes:
        m, n = (int(v) for v in shape.split("x"))
        gen = torch.Generator(device=device).manual_seed(0)
        x, r, dy, dh = (torch.randn(m, n, generator=gen, device=device).to(torch.bfloat16) for _ in range(4))
        w = (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(torch.bfloat16)
        cases = {"kernelbench-eager": ours, "kernelbench-compile": torch.compile(ours, fullgraph=True),
                 "torch-compile": torch.compile(torch_layers, fullgraph=True)}
        for name, fn in cases.items():
            leaves = [t.clone().requires_grad_(True) for t in (x, r, w)]

            def step(fn=fn, leaves=leaves, dy=dy, dh=dh):
                for t in leaves:
                    t.grad = None
                y, h = fn(*leaves)
                torch.autograd.backward([y, h], [dy, dh])

            total, per_kernel = kernel_ms(step, args.iters)
            print(f"{shape} {name}: {total:.4f} ms of kernels per fwd+bwd")
            for kernel, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
                print(f"    {ms:.4f} ms  {kernel}")
            emit(shape=shape, case=name, kernel_ms=round(total, 4),
                 kernels={k: round(v, 4) for k, v in per_kernel.items()})


if __name__ == "__main__":
    main()
