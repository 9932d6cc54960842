"""Host time of forward+backward through autograd on the GPU machine: is the ~300 us that the
harness saw for our RMSNorm / rotary (and for torch.compile's) fwd+bwd ours, or what any Python
autograd.Function costs there? One JSON line per row: host microseconds per call (perf_counter,
back-to-back calls, enqueue only) and do_bench's median, for
  native       F.rms_norm (C++ autograd node)
  python-fn    a trivial torch.autograd.Function (clone forward, clone backward)
  ours         kernelbench rms_norm(impl="triton") / apply_rotary(impl="triton")
  compile      torch.compile of the PyTorch reference
then torch.profiler's top host entries for `ours` (RMSNorm), and cProfile's top Python functions
for `ours` (RMSNorm and rotary). ~30 s.

    python scripts/probe_autograd_host.py
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernelbench.nn import apply_rotary, rms_norm
from kernelbench.ops.rmsnorm import rmsnorm_ref
from kernelbench.ops.rotary import rotary_ref, rotary_tables


class CloneFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def host_us(fn, calls=100) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return round(per_call, 1)


def fwd_bwd(fn, inputs, grads):
    def run():
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        torch.autograd.backward(out if isinstance(out, tuple) else (out,), grads)
    return run


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32768, 4096, generator=gen, device="cuda").bfloat16().requires_grad_(True)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    compiled = torch.compile(rmsnorm_ref, dynamic=False)
    rms = {
        "native": lambda x, w: F.rms_norm(x, (4096,), w, 1e-6),
        "python-fn": lambda x, w: CloneFunction.apply(x),
        "ours": lambda x, w: rms_norm(x, w, 1e-6, impl="triton"),
        "compile": lambda x, w: compiled(x, w, 1e-6),
    }
    for name, fn in rms.items():
        run = fwd_bwd(fn, (x, w), (dy,))
        print(json.dumps({"op": "rmsnorm 32768x4096 bf16 fwd+bwd", "row": name, "host_us": host_us(run),
                          "do_bench_ms": round(do_bench(run, warmup=25, rep=100, return_mode="median"), 4)}), flush=True)

    q = torch.randn((8, 32, 2048, 128), generator=gen, device="cuda").bfloat16().requires_grad_(True)
    k = torch.randn((8, 8, 2048, 128), generator=gen, device="cuda").bfloat16().requires_grad_(True)
    cos, sin = rotary_tables(2048, 128, "cuda", torch.bfloat16)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    compiled_rope = torch.compile(rotary_ref, dynamic=False)
    rope = {
        "ours": lambda q, k: apply_rotary(q, k, cos, sin, impl="triton"),
        "compile": lambda q, k: compiled_rope(q, k, cos, sin),
    }
    for name, fn in rope.items():
        run = fwd_bwd(fn, (q, k), (dq, dk))
        print(json.dumps({"op": "rotary fwd+bwd", "row": name, "host_us": host_us(run),
                          "do_bench_ms": round(do_bench(run, warmup=25, rep=100, return_mode="median"), 4)}), flush=True)

    run = fwd_bwd(rms["ours"], (x, w), (dy,))
    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            run()
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), flush=True)

    # Python's own view of the same host time (which of our functions, which of Triton's):
    # cProfile over 200 calls of each, the top entries by time spent in the function itself.
    for name, run in (("rmsnorm", fwd_bwd(rms["ours"], (x, w), (dy,))), ("rotary", fwd_bwd(rope["ours"], (q, k), (dq, dk)))):
        run()
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            run()
        profiler.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(22)
        print(f"--- cProfile, {name} fwd+bwd through autograd, 200 calls", flush=True)
        print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
