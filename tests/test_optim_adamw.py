"""TritonAdamW and adamw_step_flat against torch.optim.AdamW(foreach=False), in the Triton
interpreter on CPU (bitwise equality is a GPU claim: tests/gpu/test_optim_adam_gpu.py).

The CPU reference differs from the CUDA op order the kernel mirrors (ATen's CPU addcmul rounds
value*g first), so moments differ by an ulp now and then: params and state are compared within
1e-6 relative plus a 1e-7 floor for elements near zero (params are ~1, updates ~lr).
"""

import copy

import pytest
import torch

from kernelbench.optim.adamw import TritonAdamW, adamw_step_flat

SHAPES = [(64, 48), (48,), (33, 17), (1,), (4099,)]  # odd sizes, a masked tail, one element


def assert_close(actual, expected, what, rtol=1e-6, atol=1e-7):
    actual, expected = actual.detach().float(), expected.detach().float()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    nan_mismatch = (actual.isnan() != expected.isnan()).sum().item()
    same_special = (actual.isnan() & expected.isnan()) | (actual.isinf() & (actual == expected))
    bad = ~((actual - expected).abs() <= atol + rtol * expected.abs()) & ~same_special
    if nan_mismatch or bad.any():
        idx = bad.nonzero()[:3].tolist()
        raise AssertionError(
            f"{what}: {bad.sum().item()} of {actual.numel()} elements outside atol={atol} rtol={rtol}, "
            f"{nan_mismatch} NaN mismatches, max abs diff {(actual - expected).abs().nan_to_num().max().item():.3e}, "
            f"first at {idx}: {[actual[tuple(i)].item() for i in idx]} vs {[expected[tuple(i)].item() for i in idx]}")


def make_params(seed, shapes=SHAPES, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def set_grads(params_a, params_b, gen, scale=1.0):
    for a, b in zip(params_a, params_b):
        g = torch.randn(a.shape, generator=gen) * scale
        a.grad = g.to(a.dtype)
        b.grad = g.to(b.dtype)


def compare(opt_a, opt_b, params_a, params_b, step):
    for i, (a, b) in enumerate(zip(params_a, params_b)):
        assert_close(a, b, f"step {step} param {i}")
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in opt_b.state[b]:
                assert_close(opt_a.state[a][key], opt_b.state[b][key], f"step {step} param {i} {key}")
        assert opt_a.state[a]["step"].item() == opt_b.state[b]["step"].item()


def pair(groups_a, groups_b, **kw):
    return TritonAdamW(groups_a, **kw), torch.optim.AdamW(groups_b, foreach=False, **kw)


@pytest.mark.parametrize("kw", [
    dict(lr=1e-2, weight_decay=0.1),
    dict(lr=3e-3, weight_decay=0.0, amsgrad=True),
    dict(lr=1e-2, weight_decay=0.05, maximize=True, betas=(0.6, 0.95)),  # lerp weight >= 0.5 branch
    dict(lr=1e-3, weight_decay=0.01, amsgrad=True, maximize=True, eps=1e-6),
])
def test_matches_torch_adamw(kw):
    init = make_params(0)
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    opt_a, opt_b = pair(a, b, **kw)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        set_grads(a, b, gen)
        opt_a.step()
        opt_b.step()
        compare(opt_a, opt_b, a, b, step)


@pytest.mark.parametrize("fused_limit", [0, 10**9], ids=["separate-increment-launch", "increment-in-update"])
def test_step_counters_advance_either_way(monkeypatch, fused_limit):
    """A single small launch advances the step counters itself (ticket); otherwise a separate
    increment launch does: both give torch's result and counters."""
    from kernelbench.optim.adamw import host as adamw_host

    monkeypatch.setattr(adamw_host, "FUSED_INCREMENT_MAX_PROGRAMS", fused_limit)
    init = make_params(3)
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    opt_a, opt_b = pair(a, b, lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        set_grads(a, b, gen)
        opt_a.step()
        opt_b.step()
        compare(opt_a, opt_b, a, b, step)
    plan = next(iter(opt_a._plans.values()))
    assert plan.increments_steps == (fused_limit > 0)
    assert plan.ticket.item() == 0  # re-armed for the next launch


def test_param_groups_scheduler_closure_and_params_without_grads():
    init = make_params(2)
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    groups = lambda ps: [{"params": ps[:2], "lr": 2e-2, "weight_decay": 0.0}, {"params": ps[2:], "amsgrad": True}]
    opt_a, opt_b = pair(groups(a), groups(b), lr=1e-2, weight_decay=0.1)
    sched_a = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.5)
    sched_b = torch.optim.lr_scheduler.StepLR(opt_b, step_size=1, gamma=0.5)
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        set_grads(a, b, gen)
        a[1].grad = b[1].grad = None if step == 1 else a[1].grad  # skipped on step 1: its step lags
        losses = []
        for opt, ps in ((opt_a, a), (opt_b, b)):
            losses.append(opt.step(closure=lambda ps=ps: sum((p.float() ** 2).sum() for p in ps)))
        assert losses[0].item() == pytest.approx(losses[1].item())
        sched_a.step()
        sched_b.step()
        compare(opt_a, opt_b, a, b, step)
    assert opt_a.state[a[1]]["step"].item() == 2.0


def test_state_dict_round_trip_both_ways_and_resume():
    init = make_params(4)
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    opt_a, opt_b = pair(a, b, lr=1e-2, weight_decay=0.1, amsgrad=True)
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        set_grads(a, b, gen)
        opt_a.step()
        opt_b.step()
    # ours -> torch and torch -> ours, then continue both pairs from the same point
    c = [torch.nn.Parameter(t.detach().clone()) for t in a]
    d = [torch.nn.Parameter(t.detach().clone()) for t in b]
    opt_c = torch.optim.AdamW(c, foreach=False, lr=1e-2, weight_decay=0.1, amsgrad=True)
    opt_c.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    opt_d = TritonAdamW(d, lr=1e-2, weight_decay=0.1, amsgrad=True)
    opt_d.load_state_dict(copy.deepcopy(opt_b.state_dict()))
    assert opt_d.state[d[0]]["step"].device == d[0].device and opt_d.state[d[0]]["step"].dim() == 0
    for step in range(2):
        g_seed = 100 + step
        for group in ((a, b), (c, d)):
            set_grads(*group, torch.Generator().manual_seed(g_seed))
        for opt in (opt_a, opt_b, opt_c, opt_d):
            opt.step()
        compare(opt_a, opt_c, a, c, step)  # ours continuing == torch resumed from ours
        compare(opt_d, opt_b, d, b, step)  # ours resumed from torch == torch continuing
    # a resumed TritonAdamW continues exactly as the uninterrupted one
    e = [torch.nn.Parameter(t.detach().clone()) for t in a]
    opt_e = TritonAdamW(e, lr=1e-2, weight_decay=0.1, amsgrad=True)
    opt_e.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    set_grads(a, e, torch.Generator().manual_seed(7))
    opt_a.step()
    opt_e.step()
    for x, y in zip(a, e):
        assert torch.equal(x, y)
        assert torch.equal(opt_a.state[x]["exp_avg_sq"], opt_e.state[y]["exp_avg_sq"])


def test_bf16_params_match_fp32_math():
    """bf16 params keep bf16 state; the update is computed in fp32 (torch fused AdamW's
    semantics), so compare against fp32 torch AdamW run on the same bf16-rounded values."""
    init = make_params(6, shapes=[(37, 29), (300,)], dtype=torch.bfloat16)
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.float()) for t in init]
    opt_a, opt_b = pair(a, b, lr=1e-2, weight_decay=0.1)
    set_grads(a, b, torch.Generator().manual_seed(8))
    for x, y in zip(a, b):
        y.grad = x.grad.float()
    opt_a.step()
    opt_b.step()
    for x, y in zip(a, b):
        assert x.dtype == opt_a.state[x]["exp_avg"].dtype == torch.bfloat16
        assert_close(x, y.to(torch.bfloat16), "bf16 param", rtol=8e-3, atol=1e-6)
        assert_close(opt_a.state[x]["exp_avg"], opt_b.state[y]["exp_avg"], "bf16 exp_avg", rtol=8e-3, atol=1e-6)


def test_nan_and_inf_grads_propagate_like_torch():
    init = make_params(9, shapes=[(5, 7)])
    a = [torch.nn.Parameter(init[0].clone())]
    b = [torch.nn.Parameter(init[0].clone())]
    opt_a, opt_b = pair(a, b, lr=1e-2, amsgrad=True)
    set_grads(a, b, torch.Generator().manual_seed(10))
    for p in (a[0], b[0]):
        p.grad[0, 0], p.grad[1, 1] = float("nan"), float("inf")
    opt_a.step()
    opt_b.step()
    compare(opt_a, opt_b, a, b, 0)
    assert a[0].isnan().sum() == b[0].isnan().sum() > 0


def test_bad_inputs_are_clear_errors():
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = TritonAdamW([p])
    p.grad = torch.randn(4, 3).to_sparse()
    with pytest.raises(RuntimeError, match=r"parameter 0 \(4x3\) has a sparse gradient"):
        opt.step()
    p.grad = torch.randn(4, 3)
    p.grad.data = torch.randn(3, 4)  # torch refuses such a grad on assignment, not through .data
    with pytest.raises(RuntimeError, match=r"parameter 0 \(4x3\) has a gradient of shape \(3, 4\)"):
        opt.step()
    q = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.complex64))
    q.grad = torch.randn(4, 3, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="is complex"):
        TritonAdamW([q]).step()
    r = torch.nn.Parameter(torch.randn(6, 6)[:, :3])  # a view with gaps
    r.grad = torch.randn(6, 3)
    with pytest.raises(RuntimeError, match="gaps or overlaps|strides"):
        TritonAdamW([r]).step()
    with pytest.raises(TypeError, match="lr must be a Python float"):
        TritonAdamW([p], lr=torch.tensor(1e-3))


def test_transposed_params_work():
    """A dense non-contiguous layout (a transpose) works when grad and state share its strides."""
    base = torch.randn(17, 9)
    a = torch.nn.Parameter(base.clone().t())
    b = torch.nn.Parameter(base.clone().t())
    opt_a, opt_b = pair([a], [b], lr=1e-2)
    g = torch.randn(17, 9).t()
    a.grad, b.grad = g.clone(memory_format=torch.preserve_format), g.clone(memory_format=torch.preserve_format)
    opt_a.step()
    opt_b.step()
    compare(opt_a, opt_b, [a], [b], 0)


def test_adamw_step_flat_matches_torch():
    gen = torch.Generator().manual_seed(11)
    p = torch.randn(5003, generator=gen)
    ref = torch.nn.Parameter(p.clone())
    m, v, step = torch.zeros_like(p), torch.zeros_like(p), torch.zeros(())
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01, foreach=False, maximize=True)
    for _ in range(3):
        g = torch.randn(5003, generator=gen)
        ref.grad = g.clone()
        adamw_step_flat(p, g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                        maximize=True)
        opt.step()
    assert step.item() == 3.0
    assert_close(p, ref, "flat param")
    assert_close(m, opt.state[ref]["exp_avg"], "flat exp_avg")
    assert_close(v, opt.state[ref]["exp_avg_sq"], "flat exp_avg_sq")
    with pytest.raises(ValueError, match="contiguous 1-D fp32"):
        adamw_step_flat(p.view(1, -1), g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


def test_new_gradient_tensors_each_step_repoint_the_table_without_a_rebuild(monkeypatch):
    """zero_grad(set_to_none=True) makes every backward allocate new gradients: the plan keeps its
    per-program map and only points at the new tensors (a rebuild is O(parameters) host work)."""
    params = [torch.nn.Parameter(p) for p in make_params(3)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = TritonAdamW(params, lr=1e-2, weight_decay=0.1)
    torch_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    builds = []
    build = ours._build_plan
    monkeypatch.setattr(ours, "_build_plan", lambda *a, **k: builds.append(1) or build(*a, **k))
    gen = torch.Generator().manual_seed(4)
    held = []
    for _ in range(4):
        held.append(torch.empty(1000))  # moves the allocator, so the new gradients land elsewhere
        set_grads(params, ref, gen)
        ours.step()
        torch_opt.step()
        ours.zero_grad()
        torch_opt.zero_grad()
    assert len(builds) == 1
    for i, (a, b) in enumerate(zip(params, ref)):
        assert_close(a, b, f"param {i}")
        assert_close(ours.state[a]["exp_avg_sq"], torch_opt.state[b]["exp_avg_sq"], f"exp_avg_sq {i}")
