"""How the forward + backward host time of a launch-bound RMSNorm (``host-8x4096`` bf16) grows
with host work on each of the autograd engine's two threads, and what the backward costs when it
runs on the calling thread (``torch.autograd.set_multithreading_enabled(False)``).

Cases: ``F.rms_norm``, an ``autograd.Function`` that only allocates (with a busy wait of S us in
its forward, on the calling thread, or in its backward, on the engine's device thread), and
kernelbench's ``rms_norm``. Every case is timed in each of several interleaved rounds.

    python scripts/probes/host_threads.py [--calls 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import torch
import torch.nn.functional as F
from host_breakdown import per_call_us

from kernelbench.nn import rmsnorm_kernels as K
from kernelbench.nn.rmsnorm import rms_norm

from common import emit  # noqa: F401  (puts the checkout on sys.path)


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[2] - q[0]


def null_function(fwd_us: float, bwd_us: float) -> type:
    """An autograd.Function with RMSNorm's signature that allocates its outputs and busy-waits."""

    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        if fwd_us:
            spin(fwd_us)
        return torch.empty_like(x)

    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        if bwd_us:
            spin(bwd_us)
        return torch.empty_like(x), torch.empty_like(w)

    return type(f"Null_f{fwd_us}_b{bwd_us}", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="only the cases whose name matches this regular expression")
    args = parser.parse_args()
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)

    def clear():
        x.grad = w.grad = None

    def fwd_bwd(f, before_us=0.0):
        def run():
            if before_us:
                spin(before_us)
            torch.autograd.backward(f(), dy)
        return run

    def single_threaded(run):
        def wrapped():
            with torch.autograd.set_multithreading_enabled(False):
                run()
        return wrapped

    c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, K._RMSNormFunction)
    f_rms = lambda: F.rms_norm(x, (4096,), w, 1e-6)
    ours = lambda: rms_norm(x, w, 1e-6, impl="triton")
    cases = {
        "F.rms_norm": fwd_bwd(f_rms),
        "F.rms_norm, 20 us before": fwd_bwd(f_rms, 20),
        "F.rms_norm, 40 us before": fwd_bwd(f_rms, 40),
        "ours": fwd_bwd(ours),
        "ours, 20 us before": fwd_bwd(ours, 20),
        # The Function's C apply, without autograd.Function.apply's Python wrapper.
        "ours' Function through its C apply": fwd_bwd(lambda: c_apply(x, w, None, 1e-6)),
    }
    for fwd_us, bwd_us in [(0, 0), (10, 0), (20, 0), (40, 0), (0, 10), (0, 20), (0, 40)]:
        cls = null_function(fwd_us, bwd_us)
        cases[f"null Function, fwd +{fwd_us} us, bwd +{bwd_us} us"] = fwd_bwd(lambda c=cls: c.apply(x, w))
    cases["single-threaded backward: F.rms_norm"] = single_threaded(cases["F.rms_norm"])
    cases["single-threaded backward: ours"] = single_threaded(cases["ours"])
    cases["single-threaded backward: null Function"] = single_threaded(
        cases["null Function, fwd +0 us, bwd +0 us"])
    # Our launches' share in place: the same calls with one or both direct launches replaced by a
    # no-op (outputs left unwritten; only the host time is read).
    torch.autograd.backward(ours(), dy)
    torch.autograd.backward(ours(), dy)  # the second call binds both direct launches
    fwd_launch = next(iter(K._fwd_plans.values()))
    bwd_launch = next(iter(K._bwd_plans.values())).main
    small = next((v for v in K._small_calls.values() if v), None)  # holds its own references
    real = {"fwd": fwd_launch.direct, "bwd": bwd_launch.direct}

    def skipping(which, run):
        def patch(on: bool):
            for name, launch in (("fwd", fwd_launch), ("bwd", bwd_launch)):
                if name in which:
                    launch.direct = (lambda *a: True) if on else real[name]
                    if small is not None:
                        setattr(small, name, launch.direct)
        return run, patch

    cases["ours, no launch"] = skipping(("fwd", "bwd"), cases["ours"])
    cases["ours, no forward launch"] = skipping(("fwd",), cases["ours"])
    cases["ours, no backward launch"] = skipping(("bwd",), cases["ours"])
    cases["single-threaded backward: ours, no launch"] = skipping(
        ("fwd", "bwd"), cases["single-threaded backward: ours"])
    cases["forward only: F.rms_norm"] = f_rms
    cases["forward only: ours"] = ours
    null = null_function(0, 0)
    cases["forward only: null Function"] = lambda: null.apply(x, w)
    if args.only:
        cases = {name: fn for name, fn in cases.items() if re.search(args.only, name)}
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            fn, patch = fn if isinstance(fn, tuple) else (fn, None)
            if patch:
                patch(True)
            results.setdefault(name, []).append(per_call_us(fn, args.calls, prepare=clear))
            if patch:
                patch(False)
    for name, values in results.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:45s} {statistics.median(values):8.1f} us  (IQR of rounds {iqr(values):5.1f}; rounds: {rounds})")


if __name__ == "__main__":
    main()
