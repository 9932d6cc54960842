"""Where does TritonAdamW's time go on model-370m? Times, in one process, kernels that differ in
one thing each, over the same 367,576,064 fp32 elements (28 bytes/param), with do_bench (median,
L2 flushed). Prints one JSON line per variant.

  stream7      read 4 streams, write 3, trivial math: the access pattern's own ceiling
  plain        AdamW math with ordinary fp32 division and sqrt, no step counter
  precise      plain + IEEE-rounded div/sqrt and no fp fusion (as the bitwise kernel)
  flat         kernelbench's adamw_step_flat (precise + per-program atomic step ticket)
  group        TritonAdamW over the 147 tensors (one launch, device table)
  torch-fused  torch.optim.AdamW(fused=True) over the same tensors
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

from kernelbench.ops.optim_workloads import model_370m_shapes
from kernelbench.optim.adamw import TritonAdamW, adamw_step_flat


@triton.jit
def _stream7(p, g, m, v, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(p + offs, mask=mask)
    b = tl.load(g + offs, mask=mask)
    c = tl.load(m + offs, mask=mask)
    d = tl.load(v + offs, mask=mask)
    tl.store(p + offs, a + b, mask=mask)
    tl.store(m + offs, c + b, mask=mask)
    tl.store(v + offs, d + b, mask=mask)


@triton.jit
def _plain(p, g, m, v, n, lr, b1, b2, eps, step_size, inv_bc2, decay, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    pp = tl.load(p + offs, mask=mask)
    gg = tl.load(g + offs, mask=mask)
    mm = tl.load(m + offs, mask=mask)
    vv = tl.load(v + offs, mask=mask)
    pp = pp * decay
    mm = mm + (1 - b1) * (gg - mm)
    vv = vv * b2 + (1 - b2) * gg * gg
    if PRECISE:
        denom = tl.sqrt_rn(vv) * inv_bc2 + eps
        pp = tl.fma(-step_size, tl.div_rn(mm, denom), pp)
    else:
        denom = tl.sqrt(vv) * inv_bc2 + eps
        pp = pp - step_size * (mm / denom)
    tl.store(p + offs, pp, mask=mask)
    tl.store(m + offs, mm, mask=mask)
    tl.store(v + offs, vv, mask=mask)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> None:
    shapes = [s for _, s in model_370m_shapes()]
    n = sum(torch.Size(s).numel() for s in shapes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    p, g = (torch.randn(n, device="cuda", generator=gen) * 0.02 for _ in range(2))
    m, v = torch.zeros_like(p), torch.rand(n, device="cuda", generator=gen)
    scal = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, step_size=1e-3, inv_bc2=1.0, decay=0.99999)
    results = {}
    for block, warps in ((1024, 4), (2048, 4), (4096, 8), (8192, 8)):
        grid = (triton.cdiv(n, block),)
        results[f"stream7-{block}"] = bench(lambda: _stream7[grid](p, g, m, v, n, BLOCK=block, num_warps=warps))
        results[f"plain-{block}"] = bench(lambda: _plain[grid](p, g, m, v, n, **scal, PRECISE=False, BLOCK=block, num_warps=warps))
        results[f"precise-{block}"] = bench(lambda: _plain[grid](p, g, m, v, n, **scal, PRECISE=True, BLOCK=block,
                                                                num_warps=warps, enable_fp_fusion=False))
    step = torch.zeros((), device="cuda")
    results["flat"] = bench(lambda: adamw_step_flat(p, g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999,
                                                    eps=1e-8, weight_decay=0.01))
    del p, g, m, v
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen) * 0.02) for s in shapes]
    for q in params:
        q.grad = torch.randn(q.shape, device="cuda", generator=gen)
    for name, opt in (("group", TritonAdamW(params, lr=1e-3, weight_decay=0.01)),
                      ("torch-fused", torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True))):
        opt.step()
        results[name] = bench(opt.step)
        del opt
    for name, ms in results.items():
        print(json.dumps({"variant": name, "ms": round(ms, 4), "tbps_28B": round(28 * n / ms / 1e9, 3)}))


if __name__ == "__main__":
    main()
