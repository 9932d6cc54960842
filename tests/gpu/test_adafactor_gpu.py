"""Adafactor8bit on the GPU: compiled kernels against the reference, bitwise determinism and
resume, no host synchronisation in step(), 8-bit error on a small model, state memory."""

import io
import math

import pytest
import torch

from kernelbench.ops.optim_workloads import model_370m_shapes
from kernelbench.optim.adafactor import Adafactor8bit
from kernelbench.optim.adafactor.reference import AdafactorRef

pytestmark = pytest.mark.gpu

# Aligned (C % 16 == 0) and unaligned factored shapes, a batch of matrices, full vectors.
SHAPES = [(1000, 1024), (777, 333), (3, 130, 257), (1024,), (5000,), (1,)]


def make_params(shapes, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda") * 0.02) for s in shapes]


def set_grads(params, step):
    gen = torch.Generator(device="cuda").manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, device="cuda")


def run(opt, params, steps, first=0):
    for step in range(first, first + steps):
        set_grads(params, step)
        opt.step()
    return opt


@pytest.mark.parametrize("kw", [{}, {"beta1": 0.9, "weight_decay": 0.1},
                                {"beta2": 0.99, "relative_step": False, "lr": 1e-3}])
def test_fp32_state_matches_reference(kw):
    pr, pt = make_params(SHAPES), make_params(SHAPES)
    run(AdafactorRef(pr, **kw), pr, 20)
    tri = run(Adafactor8bit(pt, quantize=False, **kw), pt, 20)
    for r, t in zip(pr, pt):
        err = (t - r).abs().max().item()
        assert err <= 1e-7 + 1e-5 * r.abs().max().item(), f"{tuple(r.shape)}: max abs diff {err:.3g}"
        assert float(tri.state[t]["step"]) == 20.0


@pytest.mark.parametrize("quantize", [True, False])
def test_bitwise_deterministic_and_resume(quantize):
    kw = {"beta1": 0.9, "quantize": quantize}
    pa, pb = make_params(SHAPES), make_params(SHAPES)
    run(Adafactor8bit(pa, **kw), pa, 5)
    b = run(Adafactor8bit(pb, **kw), pb, 3)
    buf = io.BytesIO()
    torch.save({"params": [p.detach().cpu() for p in pb], "opt": b.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, map_location="cpu")  # a CPU checkpoint: load_state_dict moves it back
    pc = [torch.nn.Parameter(t.cuda()) for t in saved["params"]]
    c = Adafactor8bit(pc, **kw)
    c.load_state_dict(saved["opt"])
    run(c, pc, 2, first=3)
    for x, y in zip(pa, pc):
        assert torch.equal(x, y), "resumed run differs from the uninterrupted one"


def test_step_does_not_synchronise():
    params = make_params(SHAPES)
    opt = Adafactor8bit(params, beta1=0.9, min_8bit_size=0)
    set_grads(params, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()   # first step: state allocation and table upload included
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_8bit_tracks_reference_on_a_small_model():
    """Relative error of the cumulative parameter change over 100 steps (interpreter: 2.4e-3
    over 50 steps on two tensors)."""
    shapes = [shape for _, shape in model_370m_shapes(vocab=512, d=128, layers=2)]
    initial = make_params(shapes)
    p8, pr = make_params(shapes), make_params(shapes)
    run(Adafactor8bit(p8), p8, 100)
    run(AdafactorRef(pr), pr, 100)
    num = sum(float((a - b).detach().norm() ** 2) for a, b in zip(p8, pr))
    den = sum(float((b - c).detach().norm() ** 2) for b, c in zip(pr, initial))
    err = math.sqrt(num / den)
    print(f"8-bit vs reference over 100 steps: relative error of the cumulative change {err:.3g}")
    assert 0 < err < 1e-2


def test_state_memory_on_model_370m():
    """State held after the first step on model-370m (the harness measures the same way). The
    8-bit row / column codes, the norms' fp32 v and the launch tables come to about 0.9 MB."""
    params = make_params([shape for _, shape in model_370m_shapes()])
    for p in params:
        p.grad = torch.ones_like(p)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    opt = Adafactor8bit(params)
    opt.step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    print(f"Adafactor8bit state on model-370m: {held / 1e6:.3f} MB")
    assert held < 1.5e6
