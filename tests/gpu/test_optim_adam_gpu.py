"""GPU-only checks of TritonAdamW and AdamMini: bitwise equality with torch's AdamW, the fp8 path
on real hardware, and CUDA-graph capture of step(). Run on the GPU machine:

    python -m pytest tests/gpu/test_optim_adam_gpu.py -q
"""

import pytest
import torch

from kernelbench.ops.optim_workloads import (
    fused_qkv_shapes,
    gpt2_shapes,
    llama_shapes,
    model_370m_shapes,
)

pytestmark = pytest.mark.gpu


def _named(shapes, seed, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [(n, torch.randn(s, generator=gen, device=device) * 0.02) for n, s in shapes]


def _grads(params, gen):
    return [torch.randn(p.shape, generator=gen, device=p.device) for p in params]


def _mismatch(a, b):
    diff = (a.float() - b.float()).abs()
    return f"{(a != b).sum().item()} of {a.numel()} differ, max abs diff {diff.max().item():.3e}"


@pytest.mark.parametrize("kw", [dict(weight_decay=0.01), dict(weight_decay=0.1, amsgrad=True, maximize=True)])
def test_adamw_bitwise_equal_to_torch_forloop_after_50_steps(kw):
    from kernelbench.optim.adamw import TritonAdamW

    shapes = model_370m_shapes(layers=2) if kw.get("amsgrad") else model_370m_shapes(layers=4)
    init = [t for _, t in _named(shapes, seed=0)]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    opt_ours = TritonAdamW(ours, lr=1e-3, **kw)
    opt_ref = torch.optim.AdamW(ref, lr=1e-3, foreach=False, **kw)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(50):
        for a, b, g in zip(ours, ref, _grads(ours, gen)):
            a.grad, b.grad = g, g.clone()
        opt_ours.step()
        opt_ref.step()
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert torch.equal(a, b), f"param {i} {tuple(a.shape)}: {_mismatch(a, b)}"
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in opt_ref.state[b]:
                x, y = opt_ours.state[a][key], opt_ref.state[b][key]
                assert torch.equal(x, y), f"param {i} {key}: {_mismatch(x, y)}"


def test_adamw_step_flat_bitwise():
    from kernelbench.optim.adamw import adamw_step_flat

    gen = torch.Generator(device="cuda").manual_seed(2)
    p = torch.randn(3_000_017, generator=gen, device="cuda")
    ref = torch.nn.Parameter(p.clone())
    m, v, step = torch.zeros_like(p), torch.zeros_like(p), torch.zeros((), device="cuda")
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01, foreach=False)
    for _ in range(20):
        g = torch.randn(p.shape, generator=gen, device="cuda")
        ref.grad = g.clone()
        adamw_step_flat(p, g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
        opt.step()
    assert torch.equal(p, ref), _mismatch(p, ref)
    assert torch.equal(m, opt.state[ref]["exp_avg"]) and torch.equal(v, opt.state[ref]["exp_avg_sq"])


def _row_diagnosis(name, step, ours, ref, before):
    """Which rows differ and by what ratio of update: a constant ratio over a row means that row's
    step size was off (a wrong step counter gives the ratio of bias corrections of t and t+1)."""
    a, b, p0 = ours.reshape(ours.shape[0], -1), ref.reshape(ref.shape[0], -1), before.reshape(before.shape[0], -1)
    bad_rows = ((a - b).abs() > 1e-5 * (b - p0).abs().amax(dim=1, keepdim=True)).any(dim=1).nonzero().flatten()
    ratios = [((a[r] - p0[r]).norm() / (b[r] - p0[r]).norm()).item() for r in bad_rows[:5].tolist()]
    return (f"{name}: first off at step {step}, rows {bad_rows[:10].tolist()} ({bad_rows.numel()} rows), "
            f"update-norm ratio ours/official of those rows {ratios}")


def test_adam_mini_fp32_matches_official_on_gpu():
    """Checked after every step, so a divergence names its step, its rows and its size."""
    from adam_mini import Adam_mini

    from kernelbench.optim.adam_mini import AdamMini

    shapes = llama_shapes(vocab=32000, d=1024, layers=3, heads=16, kv_heads=16, hidden=4096)
    init = _named(shapes, seed=3)
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, dim=1024, n_heads=16, n_kv_heads=16)
    ours = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    ref = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    opt_ours, opt_ref = AdamMini(ours, **hp), Adam_mini(ref, verbose=False, **hp)
    gen = torch.Generator(device="cuda").manual_seed(4)
    for step in range(1, 51):
        before = [b.detach().clone() for _, b in ref]
        for (_, a), (_, b), g in zip(ours, ref, _grads([p for _, p in ours], gen)):
            a.grad, b.grad = g, g.clone()
        opt_ours.step()
        opt_ref.step()
        if step <= 10 or step % 10 == 0:
            for (name, a), (_, b), p0 in zip(ours, ref, before):
                err = ((a - b).norm() / (b - p0).norm()).item()
                assert a.dim() < 2 or err < 1e-4, _row_diagnosis(name, step, a.detach(), b.detach(), p0)
            for name, a in ours:
                assert opt_ours.state[a]["step"].item() == step, f"{name}: step counter"
    for (name, a), (_, b), (_, p0) in zip(ours, ref, init):
        change_err = ((a - b).norm() / (b - p0).norm()).item()
        assert change_err < 1e-5, f"{name}: cumulative change off by {change_err:.2e}"


def test_adam_mini_fp8_on_gpu_matches_emulation_and_bound():
    from kernelbench.optim.adam_mini import AdamMini, adam_mini_block_ref

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 state needs sm_89+; the fallback is covered on CPU")
    gen = torch.Generator(device="cuda").manual_seed(5)
    p0 = torch.randn(512, 1024, generator=gen, device="cuda") * 0.02
    param = torch.nn.Parameter(p0.clone())
    opt = AdamMini([("mlp.w", param)], lr=1e-3, weight_decay=0.1, state_dtype="fp8")
    p, m, vmean = p0.reshape(-1).clone(), torch.zeros(p0.numel(), device="cuda"), torch.zeros(512, device="cuda")
    for step in range(1, 11):
        g = torch.randn(p0.shape, generator=gen, device="cuda")
        param.grad = g.clone()
        opt.step()
        p, m, vmean, _ = adam_mini_block_ref(p, g.reshape(-1), m, vmean, step, block_len=1024, lr=1e-3, beta1=0.9,
                                             beta2=0.999, eps=1e-8, weight_decay=0.1, state_dtype="fp8",
                                             scale_block=1024)
    state = opt.state[param]
    stored = (state["m_fp8"].float() * state["m_scale"][:, None]).reshape(-1)
    assert ((stored - m).norm() / m.norm()).item() < 1e-3
    assert ((param.detach().reshape(-1) - p).norm() / (p - p0.reshape(-1)).norm()).item() < 1e-3


@pytest.mark.parametrize("which", ["adamw", "adam-mini-fp8", "adam-mini-fused-qkv-fp8"])
def test_step_captures_in_a_cuda_graph(which):
    from kernelbench.optim.adam_mini import AdamMini
    from kernelbench.optim.adamw import TritonAdamW

    if which == "adam-mini-fused-qkv-fp8":
        shapes = fused_qkv_shapes(vocab=1000, d=256, layers=2, heads=4, kv_heads=2, hidden=512)
    else:
        shapes = llama_shapes(vocab=1000, d=256, layers=2, heads=4, kv_heads=2, hidden=512)
    init = _named(shapes, seed=6)

    def build(params):
        if which == "adamw":
            return TritonAdamW([p for _, p in params], lr=1e-3)
        preset = "fused-qkv" if which == "adam-mini-fused-qkv-fp8" else None
        return AdamMini(params, lr=1e-3, weight_decay=0.1, dim=256, n_heads=4, n_kv_heads=2, state_dtype="fp8",
                        preset=preset, verbose=False)

    eager = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    graphed = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    opt_eager, opt_graphed = build(eager), build(graphed)
    gen = torch.Generator(device="cuda").manual_seed(7)
    grads = [_grads([p for _, p in eager], gen) for _ in range(4)]
    for (_, p), g in zip(graphed, grads[0]):
        p.grad = g.clone()  # static grad buffers, refilled before each replay
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        opt_graphed.step()  # warm-up outside the graph: compiles kernels and builds the launch tables
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt_graphed.step()
    for (_, p), g in zip(eager, grads[0]):
        p.grad = g.clone()
    opt_eager.step()
    for step_grads in grads[1:]:
        for (_, a), (_, b), g in zip(eager, graphed, step_grads):
            a.grad = g.clone()
            b.grad.copy_(g)
        opt_eager.step()
        graph.replay()
    torch.cuda.synchronize()
    for (name, a), (_, b) in zip(eager, graphed):
        assert torch.equal(a, b), f"{name}: {_mismatch(a, b)}"


_GPT2 = (gpt2_shapes(vocab=50257, d=768, layers=2, positions=1024), dict(dim=768, n_heads=12, n_kv_heads=12))
_FUSED = (fused_qkv_shapes(vocab=32000, d=1024, layers=2, heads=16, kv_heads=8, hidden=4096),
          dict(dim=1024, n_heads=16, n_kv_heads=8))
_FUSED_NEOX = (fused_qkv_shapes(vocab=32000, d=1024, layers=2, heads=16, kv_heads=16, hidden=4096),
               dict(dim=1024, n_heads=16, n_kv_heads=16))


def _compare_runs(build_a, build_b, shapes, steps, tol=1e-5):
    init = _named(shapes, seed=11)
    a_params = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    b_params = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    opt_a, opt_b = build_a(a_params), build_b(b_params)
    gen = torch.Generator(device="cuda").manual_seed(12)
    for _ in range(steps):
        for (_, a), (_, b), g in zip(a_params, b_params, _grads([p for _, p in a_params], gen)):
            a.grad, b.grad = g, g.clone()
        opt_a.step()
        opt_b.step()
    for (name, a), (_, b) in zip(a_params, b_params):
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err <= tol, f"{name}: max |diff| / max |ref| = {err:.2e}"


@pytest.mark.parametrize("model", ["gpt2", "fused-qkv-gqa", "fused-qkv-neox"])
def test_adam_mini_defaults_match_official_on_gpt2_and_fused_qkv(model):
    """Official-compatible defaults (unknown names: one block per tensor) against official, fp32 state."""
    from adam_mini import Adam_mini

    from kernelbench.optim.adam_mini import AdamMini

    shapes, geometry = {"gpt2": _GPT2, "fused-qkv-gqa": _FUSED, "fused-qkv-neox": _FUSED_NEOX}[model]
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, **geometry)
    _compare_runs(lambda ps: AdamMini(ps, verbose=False, **hp), lambda ps: Adam_mini(ps, verbose=False, **hp),
                  shapes, steps=20)


@pytest.mark.parametrize("model, preset", [("gpt2", "gpt2"), ("fused-qkv-gqa", "fused-qkv"),
                                           ("fused-qkv-neox", "fused-qkv")])
def test_adam_mini_presets_match_the_pytorch_reference(model, preset):
    from kernelbench.optim.adam_mini import AdamMini, AdamMiniReference

    shapes, geometry = {"gpt2": _GPT2, "fused-qkv-gqa": _FUSED, "fused-qkv-neox": _FUSED_NEOX}[model]
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, preset=preset, **geometry)
    _compare_runs(lambda ps: AdamMini(ps, verbose=False, **hp), lambda ps: AdamMiniReference(ps, **hp),
                  shapes, steps=5)


def test_adam_mini_one_pass_rows_match_two_pass_on_gpu():
    """Rows of 4096 (llama-468m's down_proj) go through the one-pass block kernel; a half tile
    sends them through the two-pass path. Every row's vmean must agree to rounding: a warp that
    read vmean after another warp stored it would apply beta2 twice to its share of a row."""
    from kernelbench.optim.adam_mini import AdamMini, LaunchConfig

    init = _named([(f"layers.{i}.mlp.down_proj.weight", (8192, 4096)) for i in range(3)], seed=13)
    one = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    two = [(n, torch.nn.Parameter(t.clone())) for n, t in init]
    hp = dict(lr=1e-3, weight_decay=0.1, verbose=False)
    opt_one, opt_two = AdamMini(one, **hp), AdamMini(two, launch_config=LaunchConfig(tile=2048), **hp)
    gen = torch.Generator(device="cuda").manual_seed(14)
    for _ in range(3):
        for (_, a), (_, b), g in zip(one, two, _grads([p for _, p in one], gen)):
            a.grad, b.grad = g, g.clone()
        opt_one.step()
        opt_two.step()
    for (name, a), (_, b) in zip(one, two):
        va, vb = opt_one.state[a]["vmean"], opt_two.state[b]["vmean"]
        assert ((va - vb).abs() / vb).max().item() < 1e-5, f"{name}: vmean {_mismatch(va, vb)}"
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-5, f"{name}: {_mismatch(a, b)}"
