"""Gradient clipping fused into the step (``max_grad_norm=``) against torch's clip-then-step:
``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` and then the same optimizer
without clipping. CPU, Triton interpreter, small odd shapes."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks

SHAPES = [(37, 5), (1,), (300,), (1030,), (3, 7, 2)]
MINI_SHAPES = [
    ("embed_tokens.weight", (37, 24)),
    ("layers.0.self_attn.q_proj.weight", (24, 24)),
    ("layers.0.self_attn.k_proj.weight", (24, 24)),
    ("layers.0.mlp.down_proj.weight", (24, 40)),
    ("layers.0.input_layernorm.weight", (24,)),
    ("lm_head.bias", (37,)),
]
STEPS = 3
# Gradients are standard normal: a total norm of ~45 on SHAPES, so 1.0 clips and 1e4 does not.
ACTIVE, INACTIVE = 1.0, 1e4


def _named(shapes, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(name, torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(dtype)))
            for name, shape in shapes]


def _twins(shapes, dtype=torch.float32):
    return _named(shapes, dtype), _named(shapes, dtype)


def _grads(shapes, step, dtype=torch.float32):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=gen).to(dtype) for _, shape in shapes]


def _mismatch(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str | None:
    """None when close (NaN where the other has NaN counts as equal), else how many elements are
    off, the worst one and any NaN / Inf pattern difference."""
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(torch.isinf(a), torch.isinf(e)):
        return f"NaN/Inf pattern differs: {int(torch.isnan(a).sum())} vs {int(torch.isnan(e).sum())} NaN"
    finite = torch.isfinite(e)
    diff = (a - e).abs()[finite]
    bound = (atol + rtol * e.abs())[finite]
    bad = diff > bound
    if bool(bad.any()):
        worst = int((diff - bound).argmax())
        return (f"{int(bad.sum())}/{bad.numel()} off; worst diff {float(diff[worst]):.3g} "
                f"(bound {float(bound[worst]):.3g})")
    return None


def _run(make, shapes, max_norm, dtype=torch.float32, rtol=1e-5, atol=1e-7, grads=None):
    """Steps make(named, max_grad_norm) against clip_grad_norm_ + make(named, None); returns the
    problems and the two last norms."""
    named, ref_named = _twins(shapes, dtype)
    opt, ref = make(named, max_norm), make(ref_named, None)
    problems, norms = [], []
    for step in range(STEPS):
        gs = grads(step) if grads else _grads(shapes, step, dtype)
        for (_, p), (_, q), g in zip(named, ref_named, gs):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        torch_norm = torch.nn.utils.clip_grad_norm_([q for _, q in ref_named], max_norm, foreach=True)
        ref.step()
        norms.append((opt.last_grad_norm.clone(), torch_norm))
        for (n, p), (_, q) in zip(named, ref_named):
            if m := _mismatch(p, q, rtol, atol):
                problems.append(f"step {step} {n}: {m}")
            for key, value in opt.state[p].items():
                if isinstance(value, torch.Tensor) and value.is_floating_point() and key != "step":
                    if m := _mismatch(value.float(), ref.state[q][key].float(), rtol, atol):
                        problems.append(f"step {step} {n}.{key}: {m}")
    return problems, norms


def triton_adamw(named, max_norm):
    from kernelbench.optim import TritonAdamW

    return TritonAdamW([p for _, p in named], lr=1e-2, weight_decay=0.1, max_grad_norm=max_norm)


def adam_mini(named, max_norm, state_dtype="fp32"):
    from kernelbench.optim import AdamMini

    return AdamMini(named, lr=1e-2, weight_decay=0.1, dim=24, n_heads=4, verbose=False, state_dtype=state_dtype,
                    min_8bit_size=0, max_grad_norm=max_norm)


def _named_shapes(shapes):
    return [(f"p{i}", s) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("max_norm", [ACTIVE, INACTIVE], ids=["clipping", "not-clipping"])
@pytest.mark.parametrize("dtype, rtol, atol", [(torch.float32, 1e-5, 1e-7), (torch.bfloat16, 1e-2, 1e-3)],
                         ids=["fp32", "bf16"])
def test_triton_adamw_fused_clip_equals_clip_then_step(max_norm, dtype, rtol, atol):
    problems, norms = _run(triton_adamw, _named_shapes(SHAPES), max_norm, dtype, rtol, atol)
    assert not problems, "\n".join(problems)
    for ours, theirs in norms:
        assert ours.dtype == torch.float32 and ours.dim() == 0
        # torch's norm of bf16 gradients is itself rounded to bf16
        torch.testing.assert_close(ours, theirs.float(), rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=0)


# fp8 m: a one-ulp difference of the clip coefficient can move m across an e4m3 rounding boundary
# (1/16 relative of that element's m); bf16 m likewise by 2^-8.
@pytest.mark.parametrize("state_dtype, rtol, atol", [("fp32", 1e-5, 1e-7), ("bf16", 1e-3, 1e-5), ("fp8", 1e-2, 1e-4)])
@pytest.mark.parametrize("max_norm", [ACTIVE, INACTIVE], ids=["clipping", "not-clipping"])
def test_adam_mini_fused_clip_equals_clip_then_step(state_dtype, rtol, atol, max_norm):
    make = functools.partial(adam_mini, state_dtype=state_dtype)
    problems, norms = _run(lambda named, m: make(named, m), MINI_SHAPES, max_norm, rtol=rtol, atol=atol)
    assert not problems, "\n".join(problems)
    for ours, theirs in norms:
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


def test_adam_mini_pytorch_path_is_clipped_too():
    """A GPT-2 Conv1D weight under preset 'gpt2' is stepped by PyTorch ops, not the kernels."""
    from kernelbench.optim import AdamMini

    shapes = [("h.0.attn.c_attn.weight", (24, 72)), ("h.0.mlp.c_fc.weight", (24, 40)), ("wte.weight", (37, 24))]

    def make(named, max_norm):
        return AdamMini(named, lr=1e-2, dim=24, n_heads=4, preset="gpt2", verbose=False, max_grad_norm=max_norm)

    problems, _ = _run(make, shapes, ACTIVE)
    assert not problems, "\n".join(problems)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("make, shapes", [(triton_adamw, _named_shapes(SHAPES)), (adam_mini, MINI_SHAPES)],
                         ids=["triton-adamw", "adam-mini"])
def test_non_finite_gradients_propagate_as_with_torch(bad, make, shapes):
    def grads(step):
        gs = _grads(shapes, step)
        if step == 1:
            gs[2].view(-1)[3] = bad
        return gs

    problems, norms = _run(make, shapes, ACTIVE, grads=grads)
    assert not problems, "\n".join(problems)
    ours, theirs = norms[1]
    same_kind = torch.isnan if math.isnan(bad) else torch.isinf
    assert same_kind(ours) and same_kind(theirs), (ours, theirs)


def test_clipping_off_leaves_no_norm_and_the_step_unchanged():
    named, twin = _twins(_named_shapes(SHAPES))
    opt, plain = triton_adamw(named, None), triton_adamw(twin, None)
    assert opt.max_grad_norm is None and opt.last_grad_norm is None
    for (_, p), (_, q), g in zip(named, twin, _grads(_named_shapes(SHAPES), 0)):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    plain.step()
    assert opt.last_grad_norm is None
    assert all(torch.equal(p, q) for (_, p), (_, q) in zip(named, twin))


def test_grads_are_not_scaled_in_place():
    named = _named(_named_shapes(SHAPES))
    opt = triton_adamw(named, ACTIVE)
    gs = _grads(_named_shapes(SHAPES), 0)
    for (_, p), g in zip(named, gs):
        p.grad = g.clone()
    opt.step()
    assert all(torch.equal(p.grad, g) for (_, p), g in zip(named, gs))


def _sharded(named, max_norm):
    from kernelbench.optim import ShardedAdamW

    return ShardedAdamW([p for _, p in named], lr=1e-2, weight_decay=0.1, bucket_bytes=4096, max_grad_norm=max_norm)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "one"])
@pytest.mark.parametrize("make", [triton_adamw, adam_mini, _sharded], ids=["triton-adamw", "adam-mini", "sharded"])
def test_bad_max_grad_norm_is_one_clear_error(bad, make):
    named = _named(MINI_SHAPES)
    with pytest.raises(ValueError, match="max_grad_norm"):
        make(named, bad)


def test_sharded_adamw_single_process_equals_clip_then_step():
    named, ref_named = _twins(_named_shapes(SHAPES))
    opt = _sharded(named, ACTIVE)
    ref = torch.optim.AdamW([q for _, q in ref_named], lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(STEPS):
        for (_, p), (_, q), g in zip(named, ref_named, _grads(_named_shapes(SHAPES), step)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        norm = torch.nn.utils.clip_grad_norm_([q for _, q in ref_named], ACTIVE, foreach=True)
        ref.step()
        torch.testing.assert_close(opt.last_grad_norm, norm, rtol=1e-6, atol=0)
    problems = [f"{n}: {m}" for (n, p), (_, q) in zip(named, ref_named) if (m := _mismatch(p, q, 1e-5, 1e-7))]
    assert not problems, "\n".join(problems)


# -- 2 Gloo ranks ---------------------------------------------------------------------------------
def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(13, 33), torch.nn.Tanh(), torch.nn.Linear(33, 7))


def _batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 13, generator=gen)


def _sharded_two_ranks(rank: int, world: int, overlap: bool) -> list[str]:
    """ShardedAdamW with max_grad_norm vs all-reduce-average + clip_grad_norm_ + AdamW(foreach=False),
    gradients from a backward (so the overlap's hooks run)."""
    from kernelbench.optim import ShardedAdamW

    model, ref_model = _model(), _model()
    opt = ShardedAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, bucket_bytes=1024,
                       overlap_grad_reduce=overlap, max_grad_norm=0.05)
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    problems = []
    for step in range(STEPS):
        model(_batch(step, rank)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        for r in range(world):  # every rank's backward, then the average
            ref_model(_batch(step, r)).square().sum().backward()
        for q in ref_model.parameters():
            q.grad.div_(world)
        norm = torch.nn.utils.clip_grad_norm_(list(ref_model.parameters()), 0.05, foreach=True)
        ref.step()
        ref.zero_grad()
        if not bool(norm > 0.05):
            problems.append(f"step {step}: norm {float(norm)} does not clip; the test needs a smaller max_norm")
        if m := _mismatch(opt.last_grad_norm, norm, 1e-5, 0):
            problems.append(f"step {step} norm: {m}")
        for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
            if m := _mismatch(p, q, 1e-5, 1e-7):
                problems.append(f"rank {rank} step {step} {n}: {m}")
    return problems


@pytest.mark.parametrize("overlap", [False, True], ids=["after-backward", "overlap-grad-reduce"])
def test_sharded_adamw_two_ranks_clip_the_global_norm(overlap):
    results = run_ranks(_sharded_two_ranks, 2, args=(overlap,), timeout_s=150)
    problems = [p for rank in results for p in rank]
    assert not problems, "\n".join(problems)


def _fsdp_triton_adamw(named):
    from kernelbench.optim import TritonAdamW

    return TritonAdamW([p for _, p in named], lr=1e-2, weight_decay=0.1, max_grad_norm=0.05)


def test_triton_adamw_under_fsdp_clips_the_global_norm():
    """FSDP2 on 2 Gloo ranks against the same optimizer on the unsharded model: equal only if the
    norm is the global one (each rank's local norm is smaller)."""
    from kernelbench.distributed.fsdp import FsdpParityRequest, fsdp_parity_rank
    from kernelbench.models.llama import LlamaConfig

    config = LlamaConfig(vocab_size=37, hidden=24, n_layers=1, n_heads=4, n_kv_heads=2, intermediate=40, max_seq=16)
    rows = run_ranks(fsdp_parity_rank, 2, args=(FsdpParityRequest(_fsdp_triton_adamw, config, steps=2,
                                                                  grad_scale=1.0),), timeout_s=240)[0]
    worst = max(rows, key=lambda r: r["rel_frob"])
    assert rows and worst["rel_frob"] < 1e-5, worst
