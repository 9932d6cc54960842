"""GPU probe: AdamMini fp32 on llama-468m's mlp.down_proj rows (1024 x 4096, one block per row,
the one-pass path of _adam_mini_block_kernel) against a pure-torch step of the official math.

Each step is checked on its own: the reference step starts from *our* state before the step
(p, m, vmean), so a bad row is one this step got wrong, not drift. Per step, one JSON line with
the rows whose update differs by > 1e-5 relative (row norm), and for the first bad row: our vmean
/ reference vmean, the largest |m_ours / m_ref - 1|, and which warp slices (4096 / num_warps
elements) of the row differ. Variants (each in try/except): down_proj only vs the full model,
one pass vs FORCE_TWO_PASS, NUM_WARPS 8 vs 4; the base variant runs twice to see whether the bad
rows move. Run on the GPU machine (< 40 s on an H200):

    python scripts/probe_adam_mini_rows.py
"""

import json
import math
import time

import torch

import kernelbench.optim.adam_mini as adam_mini
from kernelbench.ops.optim_workloads import llama_shapes

HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
STEPS = 10
THRESHOLD = 1e-5
SHAPES = llama_shapes(vocab=32000, d=1024, layers=24, heads=16, kv_heads=16, hidden=4096)


def emit(**fields):
    print(json.dumps(fields), flush=True)


def reference_step(p, g, m, vmean, step):
    """The official adam-mini 1.1.1 row update in fp32 torch (vmean: [rows, 1])."""
    beta1, beta2 = HP["betas"]
    lr, eps = HP["lr"], HP["eps"]
    vmean = vmean * beta2 + (g * g).mean(dim=1, keepdim=True) * (1 - beta2)
    m = torch.lerp(m, g, 1 - beta1)
    h = vmean.sqrt() / math.sqrt(1 - beta2**step) + eps
    step_size = (1 / (1 - beta1**step)) / h
    p = p * (1 - lr * HP["weight_decay"]) - lr * step_size * m
    return p, m, vmean


def run_variant(name, full_model, two_pass, num_warps, seed=0):
    adam_mini.FORCE_TWO_PASS, adam_mini.NUM_WARPS = two_pass, num_warps
    try:
        shapes = SHAPES if full_model else [(n, s) for n, s in SHAPES if "down_proj" in n]
        gen = torch.Generator(device="cuda").manual_seed(seed)
        params = [(n, torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda") * 0.02)) for n, s in shapes]
        down = [(n, p) for n, p in params if "down_proj" in n]
        opt = adam_mini.AdamMini(params, dim=1024, n_heads=16, n_kv_heads=16, **HP)
        slice_len = 4096 // num_warps
        bad_history = []
        for step in range(1, STEPS + 1):
            for _, p in params:
                p.grad = torch.randn(p.shape, generator=gen, device="cuda")
            before = {n: (p.detach().clone(), opt.state[p]["m"].clone(), opt.state[p]["vmean"].clone())
                      if opt.state[p] else (p.detach().clone(), torch.zeros_like(p), torch.zeros(p.shape[0], 1, device="cuda"))
                      for n, p in down}
            opt.step()
            bad = []
            first = None
            for n, p in down:
                p0, m0, v0 = before[n]
                ref_p, ref_m, ref_v = reference_step(p0, p.grad, m0, v0, step)
                ours_update, ref_update = p.detach() - p0, ref_p - p0
                row_err = (ours_update - ref_update).norm(dim=1) / ref_update.norm(dim=1)
                rows = torch.nonzero(row_err > THRESHOLD).flatten().tolist()
                bad += [f"{n}[{r}]" for r in rows]
                if rows and first is None:
                    r = rows[0]
                    s = opt.state[p]
                    elem_bad = ((ours_update[r] - ref_update[r]).abs() > THRESHOLD * ref_update[r].abs().max())
                    slices = torch.nonzero(elem_bad.view(-1, slice_len).any(dim=1)).flatten().tolist()
                    first = dict(row=f"{n}[{r}]", row_err=row_err[r].item(),
                                 vmean_ratio=(s["vmean"][r, 0] / ref_v[r, 0]).item(),
                                 m_max_rel=((s["m"][r] - ref_m[r]).abs() / ref_m[r].abs().clamp_min(1e-30)).max().item(),
                                 update_norm_ratio=(ours_update[r].norm() / ref_update[r].norm()).item(),
                                 bad_elements=int(elem_bad.sum().item()), bad_warp_slices=slices)
            emit(variant=name, step=step, n_bad_rows=len(bad), bad_rows=bad[:8], first=first)
            bad_history.append(bad)
        return bad_history
    except Exception as exc:  # one variant failing must not hide the others
        emit(variant=name, error=f"{type(exc).__name__}: {exc}")
        return None
    finally:
        adam_mini.FORCE_TWO_PASS, adam_mini.NUM_WARPS = False, 8
        torch.cuda.empty_cache()


def main():
    start = time.time()
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__,
         triton=__import__("triton").__version__)
    base_a = run_variant("down_proj_only/one_pass/warps8/run1", False, False, 8)
    base_b = run_variant("down_proj_only/one_pass/warps8/run2", False, False, 8)
    if base_a is not None and base_b is not None:
        emit(same_bad_rows_in_identical_runs=base_a == base_b,
             total_bad_run1=sum(map(len, base_a)), total_bad_run2=sum(map(len, base_b)))
    run_variant("down_proj_only/two_pass/warps8", False, True, 8)
    run_variant("down_proj_only/one_pass/warps4", False, False, 4)
    run_variant("full_model/one_pass/warps8", True, False, 8)
    emit(seconds=round(time.time() - start, 1))


if __name__ == "__main__":
    main()
