"""AdamMini against the official adam-mini 1.1.1 and its own fp32 run, in the Triton interpreter.

Shapes: kernelbench's llama-tiny (d 64, 4 heads, 2 KV heads, MLP 160), plus names that exercise
the Adam (bias) path, a head longer than one program (the two-pass kernel) and an unrecognised name.
"""

import copy
import warnings

import pytest
import torch
import triton
import triton.language as tl

from kernelbench.ops.optim_workloads import llama_shapes
from kernelbench.optim.adam_mini import (
    AdamMini,
    LaunchConfig,
    Rule,
    adam_mini_block_ref,
    partition_param,
    round_to_e4m3_ref,
)
from kernelbench.optim.adam_mini.host import FP8_SCALE_BLOCK
from kernelbench.optim.adam_mini.kernels import _round_to_e4m3

HP = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, dim=64, n_heads=4, n_kv_heads=2)
LLAMA = llama_shapes(vocab=96, d=64, layers=1, heads=4, kv_heads=2, hidden=160)


def rel_err(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def named(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02)) for n, s in shapes]


def clone(named_params):
    return [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named_params]


def run(optimizers_and_params, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = {n: torch.randn(p.shape, generator=gen) for n, p in optimizers_and_params[0][1]}
        for opt, params in optimizers_and_params:
            for n, p in params:
                p.grad = grads[n].to(p.dtype)
            opt.step()


def test_fp32_matches_official_on_llama_tiny():
    from adam_mini import Adam_mini

    ours = named(LLAMA + [("mlp.fc.bias", (33,))], seed=0)
    theirs = clone(ours)
    opt_a = AdamMini(ours, **HP)
    opt_b = Adam_mini(theirs, verbose=False, **HP)
    run([(opt_a, ours), (opt_b, theirs)], steps=4, seed=1)
    for (name, a), (_, b) in zip(ours, theirs):
        assert rel_err(a, b) < 1e-6, name
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), name
        sa, sb = opt_a.state[a], opt_b.state[b]
        for key in ("m", "vmean", "v"):
            if key in sb:
                assert sa[key].shape == sb[key].shape, (name, key)
                assert (sa[key] - sb[key]).abs().max() <= 1e-5 * sb[key].abs().max(), (name, key)
        assert sa["step"].item() == sb["step"] == 4


@pytest.mark.parametrize("row_len", [4096, 3001])
def test_one_block_per_program_rows_match_official(row_len):
    """Rows longer than half a tile (llama's MLP down-projection: 4096) go one block per program,
    in one pass; several tensors share the launch (the GPU once diverged on all but the first)."""
    from adam_mini import Adam_mini

    shapes = [(f"layers.{i}.mlp.down_proj.weight", (3 + i, row_len)) for i in range(3)]
    ours = named(shapes, seed=8)
    theirs = clone(ours)
    opt_a, opt_b = AdamMini(ours, **HP), Adam_mini(theirs, verbose=False, **HP)
    run([(opt_a, ours), (opt_b, theirs)], steps=3, seed=9)
    for (name, a), (_, b) in zip(ours, theirs):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), name
        assert (opt_a.state[a]["vmean"] - opt_b.state[b]["vmean"]).abs().max() <= 1e-5 * opt_b.state[b]["vmean"].max()
        assert opt_a.state[a]["step"].item() == 3


def test_partition_matches_official_names_and_report_explains():
    shapes = dict(LLAMA)
    report = {r["name"]: r for r in AdamMini(named(LLAMA, 2), **HP).partition_report()}
    q = report["model.layers.0.self_attn.q_proj.weight"]
    assert (q["kind"], q["block_len"], q["n_blocks"]) == ("head", 64 * 64 // 4, 4)
    k = report["model.layers.0.self_attn.k_proj.weight"]
    assert (k["kind"], k["n_blocks"]) == ("head", 2)  # GQA: one block per KV head
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                 "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight"):
        assert report[name]["kind"] == "row" and report[name]["n_blocks"] == shapes[name][0], name
        assert report[name]["weight_decay"] == HP["weight_decay"]
    norm = report["model.norm.weight"]
    assert (norm["kind"], norm["weight_decay"]) == ("tensor", 0.0) and "norm" in norm["reason"]
    odd = partition_param("encoder.proj", torch.empty(7, 13), dim=64, n_heads=4)
    assert (odd.kind, odd.n_blocks) == ("tensor", 1) and "official default" in odd.reason
    odd = partition_param("encoder.proj", torch.empty(7, 13), dim=64, n_heads=4, fallback="structure")
    assert (odd.kind, odd.n_blocks) == ("row", 7) and "fallback='structure'" in odd.reason
    assert partition_param("scale", torch.empty(5), dim=64, n_heads=4).kind == "tensor"
    bias = partition_param("mlp.fc.bias", torch.empty(9), dim=64, n_heads=4)
    assert (bias.kind, bias.weight_decay) == ("adam", False)


def test_user_rules_come_first():
    rules = [Rule("encoder.proj", "tensor", weight_decay=False), Rule("q_proj", "row")]
    assert partition_param("encoder.proj", torch.empty(7, 13), dim=64, n_heads=4, rules=rules).kind == "tensor"
    q = partition_param("layers.0.q_proj.weight", torch.empty(64, 64), dim=64, n_heads=4, rules=rules)
    assert (q.kind, q.n_blocks, q.reason) == ("row", 64, "rule contains='q_proj' (row)")
    with pytest.raises(ValueError, match="kind 'rows' is not one of"):
        Rule("x", "rows")
    opt = AdamMini([("encoder.proj", torch.nn.Parameter(torch.randn(7, 13)))], rules=rules)
    assert opt.partition_report()[0]["weight_decay"] == 0.0


@pytest.mark.parametrize("state_dtype, bound", [("bf16", 2e-2), ("fp8", 6e-2)])
def test_low_precision_state_within_documented_bound(state_dtype, bound):
    """Relative error (Frobenius) of each parameter's cumulative change against our fp32 run,
    with a head longer than one program (dim 128, 2 heads: 8192-element blocks, two passes)."""
    shapes = LLAMA[:1] + LLAMA[-4:-2] + [("layers.0.attn.q_proj.weight", (128, 128)), ("mlp.fc.bias", (40,))]
    hp = dict(HP, dim=128, n_heads=2, n_kv_heads=None)
    init = named(shapes, seed=3)
    ref, low = clone(init), clone(init)
    opt_ref = AdamMini(ref, **hp)
    opt_low = AdamMini(low, state_dtype=state_dtype, min_8bit_size=0, **hp)
    run([(opt_ref, ref), (opt_low, low)], steps=4, seed=4)
    for (name, a), (_, b), (_, p0) in zip(low, ref, init):
        assert rel_err(a - p0, b - p0) < bound, name
    if state_dtype == "fp8":
        q = dict(low)["layers.0.attn.q_proj.weight"]
        assert opt_low.state[q]["m_fp8"].dtype == torch.float8_e4m3fn
        assert opt_low.state[q]["m_scale"].shape == (2 * 2,)  # 2 heads x two 4096-element scale blocks
        assert opt_low.state[dict(low)["mlp.fc.bias"]]["m"].dtype == torch.bfloat16


def test_fp8_kernel_matches_torch_emulation():
    """The fp8 path step by step against adam_mini_block_ref (torch's own e4m3 cast)."""
    gen = torch.Generator().manual_seed(5)
    p0 = torch.randn(24, 40, generator=gen) * 0.02
    param = torch.nn.Parameter(p0.clone())
    opt = AdamMini([("mlp.w", param)], lr=1e-2, weight_decay=0.1, state_dtype="fp8", min_8bit_size=0)
    p, m, vmean = p0.reshape(-1).clone(), torch.zeros(960), torch.zeros(24)
    for step in range(1, 4):
        g = torch.randn(24, 40, generator=gen) * 10.0 ** (step - 2)
        param.grad = g.clone()
        opt.step()
        p, m, vmean, _ = adam_mini_block_ref(p, g.reshape(-1), m, vmean, step, block_len=40, lr=1e-2, beta1=0.9,
                                             beta2=0.999, eps=1e-8, weight_decay=0.1, state_dtype="fp8",
                                             scale_block=40)
        state = opt.state[param]
        stored = state["m_fp8"].float() * state["m_scale"][:, None]
        assert (stored.reshape(-1) - m).abs().max() <= 1e-6 * m.abs().max()
        assert (param.detach().reshape(-1) - p).abs().max() <= 1e-6
        assert (state["vmean"].reshape(-1) - vmean).abs().max() <= 1e-6 * vmean.abs().max()


@triton.jit
def _e4m3_cast_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, _round_to_e4m3(tl.load(x_ptr + offs)).to(tl.float8e4nv))


def test_e4m3_rounding_matches_torch_cast():
    gen = torch.Generator().manual_seed(6)
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[~grid.isnan()]
    x = torch.cat([torch.randn(1024, generator=gen) * 100, grid, (grid[1:] + grid[:-1]) / 2])  # ties too
    x = torch.cat([x, torch.zeros(4096 - x.numel())])
    y = torch.empty(4096, dtype=torch.float8_e4m3fn)
    _e4m3_cast_kernel[(1,)](x, y, N=4096)
    assert torch.equal(y.view(torch.uint8), round_to_e4m3_ref(x).view(torch.uint8))


def test_telemetry_and_state_memory():
    params = named(LLAMA, seed=7)
    opt = AdamMini(params, state_dtype="fp8", min_8bit_size=0, **HP)
    run([(opt, params)], steps=1, seed=8)
    report = opt.telemetry()
    embed = report["model.embed_tokens.weight"]
    assert embed["state_dtype"] == "fp8" and embed["max_update"].item() > 0 and embed["max_m"].item() > 0
    assert embed["scale_max"].item() == pytest.approx(embed["max_m"].item() / 448, rel=1e-6)
    n = sum(p.numel() for _, p in params)
    m_bytes = sum(s["m_fp8"].numel() for s in opt.state.values())
    assert m_bytes == n  # one byte per parameter for m


def test_state_dict_round_trip_resumes_exactly():
    init = named(LLAMA[:4], seed=9)
    a, b = clone(init), clone(init)
    opt_a = AdamMini(a, state_dtype="fp8", **HP)
    run([(opt_a, a)], steps=2, seed=10)
    for (_, x), (_, y) in zip(a, b):
        y.data.copy_(x.data)
    opt_b = AdamMini(b, state_dtype="fp8", **HP)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert opt_b.state[b[0][1]]["m_fp8"].dtype == torch.float8_e4m3fn
    run([(opt_a, a), (opt_b, b)], steps=1, seed=11)
    for (_, x), (_, y) in zip(a, b):
        assert torch.equal(x, y)


def test_fp8_falls_back_with_one_warning_without_float8(monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = AdamMini(named(LLAMA[:2], seed=12), state_dtype="fp8", **HP)
    assert opt.state_dtype == "bf16"
    assert len(caught) == 1 and "has no torch.float8_e4m3fn" in str(caught[0].message)


def test_bad_inputs_are_clear_errors():
    p = torch.nn.Parameter(torch.randn(6, 4))
    opt = AdamMini([("mlp.w", p)])
    p.grad = torch.randn(6, 4).to_sparse()
    with pytest.raises(RuntimeError, match=r"parameter 'mlp.w' \(6x4\) has a sparse gradient"):
        opt.step()
    p.grad = torch.randn(4, 6).t()
    with pytest.raises(RuntimeError, match="strides|contiguous"):
        opt.step()
    with pytest.raises(ValueError, match="state_dtype 'int8'"):
        AdamMini([("w", p)], state_dtype="int8")
    with pytest.raises(TypeError, match="named_parameters"):
        AdamMini([p])


def test_two_pass_matches_one_pass_on_rows_of_4096():
    # Rows of 4096 (llama-468m's down_proj) are one pass; a half tile sends them through the
    # two-pass path in 2048-element chunks. Both must agree. The race the barriers guard against (a
    # warp reading a vmean another warp already stored) cannot happen in the interpreter.
    one = named([("mlp.down_proj.weight", (3, 4096))], seed=5)
    two = clone(one)
    opt_one = AdamMini(one, **HP)
    opt_two = AdamMini(two, launch_config=LaunchConfig(tile=FP8_SCALE_BLOCK // 2), **HP)
    run([(opt_one, one), (opt_two, two)], steps=3, seed=6)
    (_, a), (_, b) = one[0], two[0]
    assert rel_err(a, b) < 1e-6
    assert rel_err(opt_one.state[a]["vmean"], opt_two.state[b]["vmean"]) < 1e-6


def test_bad_launch_config_is_a_clear_error():
    with pytest.raises(ValueError, match=r"tile=3000; accepted: a power of two"):
        LaunchConfig(tile=3000)
    with pytest.raises(ValueError, match=r"num_warps=3; accepted"):
        LaunchConfig(num_warps=3)
    p = torch.nn.Parameter(torch.randn(6, 4))
    with pytest.raises(ValueError, match=rf"fp8 state accepts only tile={FP8_SCALE_BLOCK}"):
        AdamMini([("mlp.w", p)], state_dtype="fp8", launch_config=LaunchConfig(tile=2048))
    with pytest.raises(TypeError, match="launch_config=4096; accepted: a"):
        AdamMini([("mlp.w", p)], launch_config=4096)


def test_kernels_read_only_constexpr_globals():
    """Compiled Triton (the GPU) raises NameError for a global read inside @triton.jit unless it
    is a tl.constexpr, another jit function or a module; the interpreter accepts anything."""
    import dis
    import types

    from kernelbench.optim.adam_mini import kernels as module

    jitted = {name: obj for name, obj in vars(module).items() if hasattr(obj, "fn") and callable(obj.fn)}
    assert "_adam_mini_rows_kernel" in jitted and "_tensor_entry" in jitted
    bad = []
    for name, obj in jitted.items():
        for ins in dis.get_instructions(obj.fn):
            if ins.opname != "LOAD_GLOBAL" or ins.argval not in obj.fn.__globals__:
                continue  # builtins are handled by Triton's code generator
            value = obj.fn.__globals__[ins.argval]
            if not (isinstance(value, (tl.constexpr, types.ModuleType)) or ins.argval in jitted):
                bad.append(f"{name} reads {ins.argval} = {value!r}")
    assert not bad, "globals that compiled Triton rejects: " + "; ".join(bad)


def test_new_gradient_tensors_each_step_repoint_the_table_without_a_rebuild(monkeypatch):
    """zero_grad(set_to_none=True) makes every backward allocate new gradients: each plan keeps its
    per-program map and only points at the new tensors, with the same result as fresh plans."""
    from kernelbench.optim import AdamMini

    torch.manual_seed(0)
    shapes = {"model.layers.0.self_attn.q_proj.weight": (64, 64), "model.layers.0.mlp.up_proj.weight": (96, 64),
              "model.layers.0.input_layernorm.weight": (64,), "lm_head.weight": (50, 64)}
    named = [(n, torch.nn.Parameter(torch.randn(s))) for n, s in shapes.items()]
    twin = [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]
    kw = dict(lr=1e-2, weight_decay=0.1, dim=64, n_heads=4, n_kv_heads=4)
    ours, fresh = AdamMini(named, **kw), AdamMini(twin, **kw)
    builds = []
    build = ours._build_plan
    monkeypatch.setattr(ours, "_build_plan", lambda *a, **k: builds.append(1) or build(*a, **k))
    held = []
    for _ in range(3):
        held.append(torch.empty(1000))  # moves the allocator, so the new gradients land elsewhere
        for (_, a), (_, b) in zip(named, twin):
            g = torch.randn(a.shape)
            a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        fresh._plans.clear()  # the twin rebuilds its plans from scratch every step
        fresh.step()
        ours.zero_grad()
        fresh.zero_grad()
    first_step_builds = len(ours._plans)
    assert len(builds) == first_step_builds
    for (name, a), (_, b) in zip(named, twin):
        assert torch.equal(a, b), name
