"""Where TritonAdamW's step() spends host time on single-4096x1024, and what CachedLauncher saves.

Prints one JSON line per row: host microseconds per call (perf_counter over back-to-back calls,
enqueue only) of
  triton-launch      _adamw_group_kernel launched through Triton's JIT (kernel[grid](...))
  cached-launch      the same launch through CachedLauncher (after its first call)
  step-cached        TritonAdamW.step() as shipped
  step-uncached      TritonAdamW.step() with every CachedLauncher forced onto Triton's path
  torch-fused        torch.optim.AdamW(fused=True).step()
and, for the three optimizers, the harness's median (kernelbench time_cuda, L2 flushed) and
do_bench's median. Run on the GPU machine: python scripts/probe_launch.py  (~20 s)
"""

from __future__ import annotations

import json
import time

import torch
import triton
from triton.testing import do_bench

from kernelbench import fast_launch
from kernelbench.harness.timing import TimingConfig, time_cuda
from kernelbench.optim import adamw as adamw_mod

HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def host_us(fn, calls=200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return round(per_call, 2)


def harness_ms(fn) -> float:
    sample = time_cuda(fn, config=TimingConfig())
    ordered = sorted(sample.times)
    return round(ordered[len(ordered) // 2], 4)


def make_param():
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4096, 1024, generator=gen, device="cuda") * 0.02)
    p.grad = torch.randn(4096, 1024, generator=gen, device="cuda")
    return p


def main() -> None:
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    p = make_param()
    opt = adamw_mod.TritonAdamW([p], **HP)
    opt.step()
    plan = next(iter(opt._plans.values()))
    raw = lambda: adamw_mod._adamw_group_kernel[plan.grid](  # noqa: E731
        plan.table, plan.n_tensors, plan.ticket, *plan.scalars, DTYPE=triton.language.float32, AMSGRAD=False,
        MAXIMIZE=False, ALIGNED=plan.aligned, INV_BC2_FP64=adamw_mod.reciprocal_in_fp64(p.device),
        BLOCK_SIZE=adamw_mod.BLOCK, INCREMENT_STEPS=plan.increments_steps, num_warps=adamw_mod.NUM_WARPS,
        enable_fp_fusion=False)
    emit(row="triton-launch", host_us=host_us(raw))
    emit(row="cached-launch", host_us=host_us(lambda: plan.launch(plan.table, plan.n_tensors, plan.ticket, *plan.scalars)))

    runs = {"step-cached": opt.step}
    slow_p = make_param()
    original_init = fast_launch.CachedLauncher.__init__

    def uncached_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._cacheable = False

    fast_launch.CachedLauncher.__init__ = uncached_init
    try:
        slow = adamw_mod.TritonAdamW([slow_p], **HP)
        slow.step()
        adamw_mod._FLAT_LAUNCHERS.clear()
    finally:
        fast_launch.CachedLauncher.__init__ = original_init
    runs["step-uncached"] = slow.step
    fused_p = make_param()
    runs["torch-fused"] = torch.optim.AdamW([fused_p], fused=True, **HP).step
    for name, fn in runs.items():
        emit(row=name, host_us=host_us(fn), harness_ms=harness_ms(fn),
             do_bench_ms=round(do_bench(fn, warmup=25, rep=100, return_mode="median"), 4))


if __name__ == "__main__":
    main()
