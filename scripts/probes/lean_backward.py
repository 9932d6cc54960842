"""What a launch-bound RMSNorm backward (8 x 4096 bf16) costs on the autograd engine's device
thread, piece by piece: kernelbench's eager path against ``autograd.Function`` variants that make
the same two direct launches (the forward's and the one-program backward's, taken from the bound
small call) and differ in one thing each:
- ``alloc``: where dx and dw are allocated, in the backward (device thread) or the forward;
- ``saved``: x and the weight through ``save_for_backward`` / ``saved_tensors``, or held on ctx;
- ``entry``: torch's ``BackwardCFunction.apply`` wrapper, or the backward set as the node's apply.
Also: ours and ``F.rms_norm`` with each output kept until the next call (as the harness keeps
it), and the forward alone with its pieces (checks, plan lookup, an allocation, a direct launch).

Every case is timed in each of several interleaved rounds; the median of the rounds is printed.

    python scripts/probes/lean_backward.py [--calls 1500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import timeit

import torch
import torch.nn.functional as F
from host_breakdown import per_call_us

import kernelbench.nn.rmsnorm_kernels as K
from kernelbench.nn import rmsnorm as R
from kernelbench.nn.rmsnorm import rms_norm

from common import fwd_bwd, print_rounds, rmsnorm_host_inputs


def variant(small, eps: float, alloc_in_forward: bool, save: bool, own_entry: bool) -> type:
    m, n, device, rstd_ptr = small.m, small.n, small.device, small.rstd_ptr
    fwd, bwd = small.fwd, small.bwd

    def forward(ctx, x, w):
        y = torch.empty_like(x)
        xp, wp, yp = x.data_ptr(), w.data_ptr(), y.data_ptr()
        fwd(device, xp, n, xp, 0, wp, yp, n, yp, 0, rstd_ptr, m, n, eps)
        if alloc_in_forward:
            ctx.grads = (torch.empty_like(x), torch.empty_like(w))
        if save:
            ctx.save_for_backward(x, w)
        else:
            ctx.x, ctx.w = x, w
        ctx.set_materialize_grads(False)
        return y

    def backward(ctx, dy):
        x, w = ctx.saved_tensors if save else (ctx.x, ctx.w)
        if alloc_in_forward:
            dx, dw = ctx.grads
        else:
            dx, dw = torch.empty_like(x), torch.empty_like(w)
        xp, dyp = x.data_ptr(), dy.data_ptr()
        bwd(device, xp, n, w.data_ptr(), dyp, n, dyp, 0, xp, dx.data_ptr(), n, dw.data_ptr(), m, n, eps)
        return dx, dw

    cls = type("Variant", (torch.autograd.Function,),
               {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    if own_entry:
        cls._backward_cls.apply = backward  # the engine calls the node's apply(*grads)
    return cls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    eps = 1e-6
    x, w, dy = rmsnorm_host_inputs()
    for _ in range(3):  # binds the small call and both direct launches
        rms_norm(x, w, eps, impl="triton").backward(dy)
    small = K._small_calls[(x.shape, x.dtype, w.dtype, True, x.get_device())]
    assert small and small.bwd is not None, "no small call bound"

    def clear():
        x.grad = w.grad = None

    kept = []

    def fwd_bwd_kept(f):
        """As the harness runs a case: the output (and its graph) lives until the next call."""
        def run():
            y = f()
            torch.autograd.backward(y, dy)
            kept[:] = [y]
        return run

    cases = {
        "F.rms_norm": fwd_bwd(lambda: F.rms_norm(x, (4096,), w, eps), dy),
        "ours": fwd_bwd(lambda: rms_norm(x, w, eps, impl="triton"), dy),
        "output kept: F.rms_norm": fwd_bwd_kept(lambda: F.rms_norm(x, (4096,), w, eps)),
        "output kept: ours": fwd_bwd_kept(lambda: rms_norm(x, w, eps, impl="triton")),
        "ours, autograd.Function alone": fwd_bwd(lambda: R._rms_norm_autograd(x, w, None, eps), dy),
    }
    expected = rms_norm(x.detach(), w.detach(), eps, impl="triton")
    for alloc_fwd, save, own in itertools.product((False, True), repeat=3):
        fn = variant(small, eps, alloc_fwd, save, own)
        y = fn.apply(x, w)
        torch.autograd.backward(y, dy)
        assert torch.equal(y, expected), "variant's forward differs"
        name = (f"alloc in {'forward ' if alloc_fwd else 'backward'}, {'saved' if save else 'on ctx'}, "
                f"{'own entry' if own else 'torch entry'}")
        cases[name] = fwd_bwd(lambda fn=fn: fn.apply(x, w), dy)
    # The forward alone (with grad: the graph is built, then dropped) and its pieces, per call.
    lean = variant(small, eps, False, True, False)
    xp, wp, yp = x.data_ptr(), w.data_ptr(), torch.empty_like(x).data_ptr()
    pieces = {
        "fwd: F.rms_norm": lambda: F.rms_norm(x, (4096,), w, eps),
        "fwd: ours": lambda: rms_norm(x, w, eps, impl="triton"),
        "fwd: ours, autograd.Function alone": lambda: R._rms_norm_autograd(x, w, None, eps),
        "fwd: lean (alloc in backward, saved)": lambda: lean.apply(x, w),
        "piece: is_compiling": torch.compiler.is_compiling,
        "piece: _check_inputs": lambda: K._check_inputs(x, w, None),
        "piece: _small_call": lambda: K._small_call(x, w, None),
        "piece: empty_like": lambda: torch.empty_like(x),
        "piece: direct launch": lambda: small.fwd(small.device, xp, 4096, xp, 0, wp, yp, 4096, yp, 0,
                                                  small.rstd_ptr, 8, 4096, eps),
    }
    piece_us: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, fn in pieces.items():
            torch.cuda.synchronize()
            piece_us.setdefault(name, []).append(min(timeit.repeat(fn, number=200, repeat=3)) / 200 * 1e6)
    torch.cuda.synchronize()
    for name, values in piece_us.items():
        print(f"{name:48s} {statistics.median(values):8.2f} us  (min {min(values):.2f})")
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results.setdefault(name, []).append(per_call_us(fn, args.calls, prepare=clear))
    print_rounds(results, base="F.rms_norm")


if __name__ == "__main__":
    main()
