"""Where an RMSNorm call's host time goes: the public call against F.rms_norm and liger, and
each piece of the Triton path alone (input checks, allocation, one launch, the autograd.Function
and the autograd engine's own cost), on the ``host-8x4096`` bf16 input.

    python scripts/probes/host_breakdown.py [--calls 3000] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kernelbench.nn import rmsnorm_kernels as K
from kernelbench.nn.rmsnorm import rms_norm

from common import emit  # noqa: F401  (puts the checkout on sys.path)


def per_call_us(fn, calls: int, prepare=None) -> float:
    """Median host microseconds per call, the device synchronised every 50 calls (untimed)."""
    for _ in range(50):
        if prepare:
            prepare()
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        if prepare:
            prepare()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times)


class _Null(torch.autograd.Function):
    """The cheapest autograd.Function with the RMSNorm signature: what Python autograd costs."""

    @staticmethod
    def forward(ctx, x, w, r, eps):
        ctx.save_for_backward(x, w)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy, torch.empty_like(w), None, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json")
    parser.add_argument("--compile-first", action="store_true",
                        help="run a torch.compile'd fwd+bwd first, as a benchmark run's compiled anchor does")
    parser.add_argument("--only", help="only the cases whose name contains this text")
    args = parser.parse_args()
    dev = "cuda"
    x = torch.randn(8, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8, 4096, device=dev, dtype=torch.bfloat16)
    xd, wd = x.detach(), w.detach()
    if args.compile_first:
        import threading

        compiled = torch.compile(lambda a, b: (a.float() * b.float()).sum())
        compiled(x, w).backward()
        x.grad = w.grad = None
        torch.cuda.synchronize()
        print("threads after torch.compile:", [t.name for t in threading.enumerate()])

    def clear():
        x.grad = w.grad = None

    def fwd_bwd(f):
        def run():
            torch.autograd.backward(f(), dy)
        return run

    y0, h0, saved = K._forward(xd, wd, None, 1e-6)
    rstd = saved[2]
    K._forward(xd, wd, None, 1e-6)  # a second call: the plan's direct launch is bound
    fwd_plan = next(iter(K._fwd_plans.values()))
    fwd_launch = fwd_plan.cached
    K._rmsnorm_bwd(xd, wd, rstd, dy, None)
    K._rmsnorm_bwd(xd, wd, rstd, dy, None)
    bwd_plan = next(iter(K._bwd_plans.values()))
    dw = torch.empty_like(wd)
    bwd_args = [xd, 4096, wd, dy, 4096, dy, 0, rstd, torch.empty_like(xd), 4096, dw, 8, 4096, 1e-6]
    if bwd_plan.sum_rows is not None:  # the persistent grid: fp32 partials, reduced to dw
        partial = torch.empty((bwd_plan.partial_rows, 4096), dtype=torch.float32, device=dev)
        bwd_args[10] = partial
    y_buf = torch.empty_like(xd)
    fwd_args = (xd, 4096, xd, 0, wd, y_buf, 4096, y_buf, 0, rstd, 8, 4096, 1e-6)
    runner, direct = next(iter(fwd_launch._runners.values()))
    full_fwd_args = fwd_launch._with_constexprs(fwd_args)
    as_ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in fwd_args]
    bwd_as_ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in bwd_args]
    full_fwd_ints = fwd_launch._with_constexprs(as_ints)

    class _OursFwdNullBwd(torch.autograd.Function):
        """Our forward with the cheapest backward: what our backward costs, by difference."""

        @staticmethod
        def forward(ctx, x, w, r, eps):
            y, _, saved = K._forward(x, w, r, eps)
            ctx.save_for_backward(*saved)
            return y

        @staticmethod
        def backward(ctx, dy):
            return dy, torch.empty_like(ctx.saved_tensors[1]), None, None

    # What the backward's extra cost depends on: forwards that differ in one thing each, all with
    # the empty Function's backward (dy for x, an empty tensor for w).
    def null_backward(ctx, dy):
        return dy, torch.empty_like(ctx.saved_tensors[1]), None, None

    def variant(name, forward):
        return type(name, (torch.autograd.Function,), {
            "forward": staticmethod(forward), "backward": staticmethod(null_backward)})

    def fwd_aten_kernel(ctx, x, w, r, eps):  # a PyTorch kernel launch in the forward
        ctx.save_for_backward(x, w)
        return x.clone()

    def fwd_triton_kernel(ctx, x, w, r, eps):  # our forward kernel's direct launch, nothing else
        ctx.save_for_backward(x, w)
        y = torch.empty_like(x)
        ptrs = list(as_ints)
        ptrs[5] = ptrs[7] = y.data_ptr()
        fwd_plan.direct(0, *ptrs)
        return y

    def fwd_three_saved(ctx, x, w, r, eps):  # one more saved tensor (rstd's place)
        ctx.save_for_backward(x, w, torch.empty(8, dtype=torch.float32, device=x.device))
        return torch.empty_like(x)

    def fwd_spin(ctx, x, w, r, eps):  # 10 us more on the host, no launch
        ctx.save_for_backward(x, w)
        end = time.perf_counter() + 10e-6
        while time.perf_counter() < end:
            pass
        return torch.empty_like(x)

    experiments = {name: variant(name, fn) for name, fn in [
        ("AtenKernel", fwd_aten_kernel), ("TritonKernel", fwd_triton_kernel),
        ("ThreeSaved", fwd_three_saved), ("Spin10us", fwd_spin)]}
    c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, K._RMSNormFunction)

    y1, _, saved1 = K._forward(xd, wd, None, 1e-6, rstd="eager-backward")
    fake_ctx = SimpleNamespace(saved_tensors=saved1, shape=xd.shape, has_residual=False, eps=1e-6)

    cases = {
        "F.rms_norm fwd": lambda: F.rms_norm(x, (4096,), w, 1e-6),
        "F.rms_norm fwd+bwd": fwd_bwd(lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        "ours fwd": lambda: rms_norm(x, w, 1e-6, impl="triton"),
        "ours fwd+bwd": fwd_bwd(lambda: rms_norm(x, w, 1e-6, impl="triton")),
        "ours fwd no-grad": lambda: rms_norm(xd, wd, 1e-6, impl="triton"),
        "custom op fwd+bwd (eager)": fwd_bwd(lambda: K._rms_norm_compiled(x, w, None, 1e-6)),
        "null Function fwd": lambda: _Null.apply(x, w, None, 1e-6),
        "null Function fwd+bwd": fwd_bwd(lambda: _Null.apply(x, w, None, 1e-6)),
        "x*2 fwd+bwd": fwd_bwd(lambda: x * 2),
        "_check_inputs": lambda: K._check_inputs(x, w, None),
        "_forward": lambda: K._forward(xd, wd, None, 1e-6),
        "_rmsnorm_fwd": lambda: K._rmsnorm_fwd(xd, wd, None, 1e-6),
        "_rmsnorm_bwd": lambda: K._rmsnorm_bwd(xd, wd, rstd, dy, None),
        "fwd CachedLauncher call": lambda: fwd_launch(*fwd_args),
        "fwd Triton runner": lambda: runner(*full_fwd_args),
        "fwd Triton runner, pointers as ints": lambda: runner(*full_fwd_ints),
        "fwd DirectLaunch": lambda: fwd_plan.direct(0, *as_ints),
        "ours fwd + null bwd": fwd_bwd(lambda: _OursFwdNullBwd.apply(x, w, None, 1e-6)),
        "Function.backward called directly": lambda: K._RMSNormFunction.backward(fake_ctx, dy),
        "bwd main launch (CachedLauncher)": lambda: bwd_plan.main.cached(*bwd_args),
        "bwd DirectLaunch": lambda: bwd_plan.main.direct(0, *bwd_as_ints),
        "torch.empty_like": lambda: torch.empty_like(xd),
        "torch.empty (8,) fp32": lambda: torch.empty(8, dtype=torch.float32, device=dev),
        "x.new_empty((8,), dtype=fp32)": lambda: xd.new_empty((8,), dtype=torch.float32),
        "current_device": torch.cuda.current_device,
        "x.reshape(-1, n)": lambda: xd.reshape(-1, 4096),
        "w.contiguous()": lambda: wd.contiguous(),
        "x.get_device()": lambda: xd.get_device(),
        "exp: ours fwd+bwd, Function's C apply": fwd_bwd(lambda: c_apply(x, w, None, 1e-6)),
    }
    for name, fn_cls in experiments.items():
        cases[f"exp: null bwd, fwd {name} fwd+bwd"] = fwd_bwd(lambda c=fn_cls: c.apply(x, w, None, 1e-6))
    cases["exp: null Function fwd+bwd"] = cases["null Function fwd+bwd"]
    cases["exp: ours fwd+bwd"] = cases["ours fwd+bwd"]
    cases["exp: F.rms_norm fwd+bwd"] = cases["F.rms_norm fwd+bwd"]
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        liger = LigerRMSNorm(4096, eps=1e-6).to(dev, torch.bfloat16)
        cases["liger fwd"] = lambda: liger(x)
        cases["liger fwd+bwd"] = fwd_bwd(lambda: liger(x))
    except ImportError:
        pass
    # The harness's own cases and host loop, beside this probe's loop on the same cases.
    from kernelbench.harness.timing import time_host
    from kernelbench.ops import get_op

    op = get_op("rmsnorm")
    op_cases = {}
    for cand in ("torch-rms-norm", "triton"):
        for mode in ("fwd", "fwd+bwd"):
            case = op.make_case(op.get_candidate(cand), op.workload("host-8x4096"), "cuda", mode)
            cases[f"harness case {cand} {mode} (probe loop)"] = case.run
            op_cases[f"harness case {cand} {mode} (probe loop)"] = case
            cases[f"harness case {cand} {mode} (time_host)"] = (case, None)
    # The harness keeps each call's outputs (and so its autograd graph) until the next call's
    # prepare; this probe's own fwd+bwd cases drop them at the end of the call.
    held = []

    def release():
        held.clear()
        clear()

    def ours_keeping_outputs():
        held.append(rms_norm(x, w, 1e-6, impl="triton"))
        torch.autograd.backward(held[0], dy)

    def f_keeping_outputs():
        held.append(F.rms_norm(x, (4096,), w, 1e-6))
        torch.autograd.backward(held[0], dy)

    triton_case = op_cases["harness case triton fwd+bwd (probe loop)"]

    def case_dropping_outputs():
        triton_case.run()
        triton_case.outputs = None

    cases["exp: ours fwd+bwd, outputs kept until the next call"] = (
        SimpleNamespace(run=ours_keeping_outputs, prepare=release), None)
    cases["exp: F.rms_norm fwd+bwd, outputs kept until the next call"] = (
        SimpleNamespace(run=f_keeping_outputs, prepare=release), None)
    cases["exp: ours fwd+bwd (time_host)"] = (SimpleNamespace(run=cases["ours fwd+bwd"], prepare=clear), None)
    cases["exp: F.rms_norm fwd+bwd (time_host)"] = (
        SimpleNamespace(run=cases["F.rms_norm fwd+bwd"], prepare=clear), None)
    cases["exp: harness case triton fwd+bwd, outputs dropped in the call"] = (triton_case, case_dropping_outputs)
    if args.only:
        cases = {name: fn for name, fn in cases.items() if args.only in name}
    results = {}
    for _ in range(2):
        for name, fn in cases.items():
            if isinstance(fn, tuple):  # (harness case, its run or a stand-in): the harness's loop
                us = statistics.median(time_host(fn[1] or fn[0].run, fn[0].prepare).times) * 1e3
            elif name.startswith("harness case"):
                case = op_cases[name]
                us = per_call_us(fn, args.calls, prepare=case.prepare)
            else:
                us = per_call_us(fn, args.calls, prepare=clear)
            results.setdefault(name, []).append(us)
    for name, values in results.items():
        print(f"{name:32s} {min(values):9.1f} us  (rounds: {', '.join(f'{v:.1f}' for v in values)})")
        if args.json:
            with open(args.json, "a") as fh:
                import json

                fh.write(json.dumps({"case": name, "host_us": min(values), "rounds": values}) + "\n")


if __name__ == "__main__":
    main()
