"""What one kernel launch costs a launch-bound forward + backward (8 x 4096 bf16) on each of the
autograd engine's threads: a Triton launch (the direct launch kernelbench's layers use) against an
ATen launch, made in an ``autograd.Function``'s forward (the calling thread) or its backward (the
engine's device thread, or the calling thread under
``torch.autograd.set_multithreading_enabled(False)``).

Every case is timed in each of several interleaved rounds; the median of the rounds is printed.

    python scripts/probes/device_thread_launch.py [--calls 1500] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from host_breakdown import per_call_us

from kernelbench.fast_launch import CachedLauncher
from kernelbench.nn.rmsnorm import rms_norm

from common import fwd_bwd, print_rounds, rmsnorm_host_inputs


@triton.jit
def _zero_kernel(ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.zeros([BLOCK], dtype=ptr.dtype.element_ty), mask=offs < n)


def function_with(fwd_launch, bwd_launch) -> type:
    """An autograd.Function with RMSNorm's outputs that allocates them and makes the given
    launches (callables taking the tensor to write, or None)."""

    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        y = torch.empty_like(x)
        if fwd_launch:
            fwd_launch(y)
        return y

    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = torch.empty_like(x)
        if bwd_launch:
            bwd_launch(dx)
        return dx, torch.empty_like(w)

    return type("Probe", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    x, w, dy = rmsnorm_host_inputs()
    n, block = x.numel(), 1024
    device = torch.cuda.current_device()
    direct = CachedLauncher(_zero_kernel, (triton.cdiv(n, block),), BLOCK=block).direct(torch.empty_like(x), n)
    assert direct is not None, "no direct launch on this Triton"

    def triton_launch(t):
        direct(device, t.data_ptr(), n)

    def aten_launch(t):
        t.zero_()

    def clear():
        x.grad = w.grad = None

    functions = {
        "no launch": function_with(None, None),
        "Triton launch in forward": function_with(triton_launch, None),
        "ATen launch in forward": function_with(aten_launch, None),
        "Triton launch in backward": function_with(None, triton_launch),
        "ATen launch in backward": function_with(None, aten_launch),
    }
    cases = {
        "F.rms_norm": fwd_bwd(lambda: F.rms_norm(x, (4096,), w, 1e-6), dy),
        "ours": fwd_bwd(lambda: rms_norm(x, w, 1e-6, impl="triton"), dy),
    }
    for single in (False, True):
        prefix = "single-threaded: " if single else ""
        for name, fn in functions.items():
            cases[f"{prefix}Function, {name}"] = fwd_bwd(lambda fn=fn: fn.apply(x, w), dy, single)
    cases["single-threaded: F.rms_norm"] = fwd_bwd(lambda: F.rms_norm(x, (4096,), w, 1e-6), dy, True)
    cases["single-threaded: ours"] = fwd_bwd(lambda: rms_norm(x, w, 1e-6, impl="triton"), dy, True)
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results.setdefault(name, []).append(per_call_us(fn, args.calls, prepare=clear))
    print_rounds(results)


if __name__ == "__main__":
    main()
