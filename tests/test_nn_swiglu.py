"""kernelbench.nn.silu_mul: the fused SwiGLU kernels (Triton interpreter on the CPU) against the
fp64 reference, gradcheck in fp64, the custom ops (opcheck, aot_eager fullgraph compile forward
and backward), and bad input rejected with one-line errors in eager and under compile."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from kernelbench.nn import silu_mul
from kernelbench.nn.swiglu import SiluMulConfig, default_config, host, silu_mul_ref_fp32

# (atol, rtol) against the fp64 reference: fp32 math, one rounding to the storage dtype (the
# interpreter truncates fp32 -> bf16, where the GPU rounds to nearest: up to one bf16 ulp).
TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}


def assert_close(name, got, want, atol, rtol):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    nan_mismatch = (got.isnan() != want.isnan()).sum().item()
    bad = (got - want).abs() > atol + rtol * want.abs()
    if nan_mismatch or bad.any():
        first = tuple(bad.nonzero()[0].tolist()) if bad.any() else None
        raise AssertionError(
            f"{name}: {bad.sum().item()} of {bad.numel()} elements outside atol={atol} rtol={rtol}, "
            f"max abs diff {(got - want).abs().max().item():.3g}, first at {first}, NaN mismatches {nan_mismatch}")


def draw(shape, dtype, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    gate = (scale * torch.randn(shape, generator=gen)).to(dtype).requires_grad_(True)
    up = torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=gen).to(dtype)
    return gate, up, dy


def fp64_reference(gate, up, dy):
    g, u = gate.detach().double().requires_grad_(True), up.detach().double().requires_grad_(True)
    out = silu_mul_ref_fp32(g, u)
    out.backward(dy.double())
    return out.detach(), g.grad, u.grad


SHAPES = [
    ((4, 64), torch.float32),
    ((5, 123, 123), torch.bfloat16),  # odd sizes: the masked tail
    ((37, 64), torch.float16),
    ((1, 760), torch.float32),
    ((2, 3, 4096), torch.bfloat16),  # several full blocks, no mask
]


@pytest.mark.parametrize("shape, dtype", SHAPES, ids=[f"{'x'.join(map(str, s))}-{str(d)[6:]}" for s, d in SHAPES])
def test_matches_reference(shape, dtype):
    gate, up, dy = draw(shape, dtype, seed=sum(shape))
    out = silu_mul(gate, up, impl="triton")
    out.backward(dy)
    assert out.dtype == dtype and gate.grad.dtype == dtype and up.grad.dtype == dtype
    atol, rtol = TOL[dtype]
    for name, got, want in zip(("out", "dgate", "dup"), (out.detach(), gate.grad, up.grad),
                               fp64_reference(gate, up, dy)):
        # dgate is ~4 |dy u| at most; bf16/fp16 round it once.
        assert_close(name, got, want, atol * (4 if name == "dgate" else 1), rtol)


def test_matches_torch_eager_fp32():
    """Against what the Llama MLP computes today, F.silu(gate) * up, forward and backward."""
    gate, up, dy = draw((3, 7, 40), torch.float32, seed=1)
    out = silu_mul(gate, up, impl="triton")
    out.backward(dy)
    g2, u2 = gate.detach().clone().requires_grad_(True), up.detach().clone().requires_grad_(True)
    ref = F.silu(g2) * u2
    ref.backward(dy)
    for name, got, want in (("out", out, ref), ("dgate", gate.grad, g2.grad), ("dup", up.grad, u2.grad)):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy exp
def test_extreme_gates_stay_finite():
    """exp(-g) overflows for g << 0: sig is then 0 and silu, dgate are 0, not NaN."""
    gate = torch.tensor([-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0], requires_grad=True)
    up = torch.full_like(gate, 2.0).requires_grad_(True)
    out = silu_mul(gate, up, impl="triton")
    out.backward(torch.ones_like(out))
    g2, u2 = gate.detach().clone().requires_grad_(True), up.detach().clone().requires_grad_(True)
    ref = F.silu(g2) * u2
    ref.backward(torch.ones_like(ref))
    for got, want in ((out, ref), (gate.grad, g2.grad), (up.grad, u2.grad)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)


def test_non_contiguous_and_mixed_grad():
    """Strided views are copied (result contiguous); a frozen up gets no gradient."""
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(6, 2 * 48, generator=gen)
    gate, up = base[:, :48].requires_grad_(False), base[:, 48:]  # halves of a fused gate_up output
    gate = gate.clone().t().contiguous().t().requires_grad_(True)  # column-major
    out = silu_mul(gate, up, impl="triton")
    assert out.is_contiguous()
    dy = torch.randn(6, 48, generator=gen)
    out.backward(dy)
    g2 = gate.detach().clone().requires_grad_(True)
    ref = F.silu(g2) * up
    ref.backward(dy)
    torch.testing.assert_close(out.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gate.grad, g2.grad, rtol=1e-5, atol=1e-6)
    assert up.grad is None


def test_saves_only_gate_and_up():
    """The backward recomputes sigmoid: nothing but the inputs is kept (eager also keeps silu(gate))."""
    gate, up, _ = draw((4, 32), torch.float32, seed=9)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        silu_mul(gate, up, impl="triton")
    assert sorted(t.data_ptr() for t in saved) == sorted((gate.data_ptr(), up.data_ptr()))
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        F.silu(gate) * up
    assert len(saved) == 3


def test_no_grad_and_empty():
    gate, up, _ = draw((3, 10), torch.float32, seed=2)
    with torch.no_grad():
        out = silu_mul(gate, up, impl="triton")
    assert out.grad_fn is None
    torch.testing.assert_close(out, F.silu(gate.detach()) * up.detach())
    empty = torch.empty(0, 16, requires_grad=True)
    got = silu_mul(empty, empty.detach(), impl="triton")
    assert got.shape == (0, 16)
    got.sum().backward()
    assert empty.grad.shape == (0, 16)


def test_gradcheck_fp64():
    gen = torch.Generator().manual_seed(11)
    gate = (3 * torch.randn(3, 37, generator=gen, dtype=torch.float64)).requires_grad_(True)
    up = torch.randn(3, 37, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, u: silu_mul(g, u, impl="triton"), (gate, up))


def test_impls():
    gate, up, _ = draw((4, 24), torch.float32, seed=3)
    want = F.silu(gate) * up
    torch.testing.assert_close(silu_mul(gate, up, impl="torch"), want, rtol=0, atol=0)
    # TRITON_INTERPRET=1 (set by conftest): "auto" takes the kernels, fp32 math like torch's.
    auto = silu_mul(gate, up)
    assert auto.grad_fn is not None and "SiluMul" in type(auto.grad_fn).__name__
    torch.testing.assert_close(auto, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", [SiluMulConfig(32, 1), SiluMulConfig(256, 2), SiluMulConfig(4096, 8)],
                         ids=["block32", "block256", "block4096"])
def test_launch_configs_match_reference(config):
    """Every launch shape computes the same: partial last blocks, blocks larger than the tensor."""
    gate, up, dy = draw((9, 100), torch.float16, seed=21)
    gate, up = gate.detach(), up.detach()
    out = host.forward(gate, up, config=config)
    dgate, dup = host.backward(dy, gate, up, config=config)
    atol, rtol = TOL[torch.float16]
    for name, got, want in zip(("out", "dgate", "dup"), (out, dgate, dup), fp64_reference(gate, up, dy)):
        assert_close(name, got, want, atol * 4, rtol)


def test_default_config():
    """Two 16-byte vectors of each tensor per thread, 8 warps."""
    assert default_config(2) == SiluMulConfig(4096, 8)
    assert default_config(4) == SiluMulConfig(2048, 8)
    assert default_config(8) == SiluMulConfig(1024, 8)
    with pytest.raises(ValueError, match="block must be a power of two, got 100"):
        SiluMulConfig(100, 4)


# ------------------------------------------------------------------------------------------------
# Custom ops and torch.compile
# ------------------------------------------------------------------------------------------------
def test_schemas():
    ops = torch.ops.kernelbench
    assert str(ops.silu_mul_fwd.default._schema) == "kernelbench::silu_mul_fwd(Tensor gate, Tensor up) -> Tensor"
    assert str(ops.silu_mul_bwd.default._schema) == (
        "kernelbench::silu_mul_bwd(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)")
    assert str(ops.silu_mul_bwd_into_dy.default._schema) == (
        "kernelbench::silu_mul_bwd_into_dy(Tensor(a0!) dy, Tensor gate, Tensor up) -> Tensor")


def test_opcheck():
    gate, up, dy = draw((3, 5, 16), torch.float32, seed=5)
    torch.library.opcheck(torch.ops.kernelbench.silu_mul_fwd.default, (gate, up))
    torch.library.opcheck(torch.ops.kernelbench.silu_mul_bwd.default, (dy, gate.detach(), up.detach()))
    torch.library.opcheck(torch.ops.kernelbench.silu_mul_bwd_into_dy.default, (dy.clone(), gate.detach(), up.detach()))


class MLP(torch.nn.Module):
    """A Llama MLP: down(silu_mul(gate(x), up(x)))."""

    def __init__(self, impl, hidden=16, intermediate=40):
        super().__init__()
        self.impl = impl
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x), impl=self.impl))


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_no_graph_breaks(impl):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(MLP(impl))(torch.randn(2, 3, 16))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_compiled_matches_eager_and_does_not_recompile():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = MLP("triton")
    compiled = torch.compile(mlp, backend="aot_eager", fullgraph=True)
    counters.clear()
    for step in range(3):
        x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(step), requires_grad=True)
        out = compiled(x)
        out.square().sum().backward()
        got = [out.detach(), x.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        x2 = x.detach().clone().requires_grad_(True)
        ref = mlp(x2)
        ref.square().sum().backward()
        want = [ref.detach(), x2.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]


def test_compiled_graph_holds_the_custom_ops(aot_graphs):
    """Forward and backward graphs call the fused ops, not silu and mul."""
    backend, graphs = aot_graphs
    gate, up, _ = draw((4, 8), torch.float32, seed=6)
    compiled = torch.compile(lambda g, u: silu_mul(g, u, impl="triton"), backend=backend, fullgraph=True)
    compiled(gate, up).sum().backward()
    assert len(graphs) == 2
    assert "kernelbench.silu_mul_fwd" in graphs[0] and "silu.default" not in graphs[0]
    assert "kernelbench.silu_mul_bwd" in graphs[1]


def test_compiled_backward_leaves_the_callers_gradient_alone():
    """Where silu_mul's output is the compiled region's output, dy is the caller's tensor: the
    backward that writes dgate over dy must work on a copy of it."""
    torch._dynamo.reset()
    gate, up, dy = draw((4, 8), torch.float32, seed=7)
    compiled = torch.compile(lambda g, u: silu_mul(g, u, impl="triton"), backend="aot_eager", fullgraph=True)
    kept = dy.clone()
    compiled(gate, up).backward(dy)
    assert torch.equal(dy, kept)
    gate2, up2 = gate.detach().clone().requires_grad_(True), up.detach().clone().requires_grad_(True)
    silu_mul(gate2, up2, impl="triton").backward(kept)
    assert torch.equal(gate.grad, gate2.grad) and torch.equal(up.grad, up2.grad)


def test_the_in_place_backward_op_checks_dy_and_writes_dgate_over_it():
    gate, up, dy = draw((3, 5, 16), torch.float32, seed=8)
    gate, up = gate.detach(), up.detach()
    dgate, dup = torch.ops.kernelbench.silu_mul_bwd(dy, gate, up)
    written = dy.clone()
    got_dup = torch.ops.kernelbench.silu_mul_bwd_into_dy(written, gate, up)
    assert torch.equal(written, dgate) and torch.equal(got_dup, dup)
    with pytest.raises(ValueError, match="dy must be contiguous"):
        torch.ops.kernelbench.silu_mul_bwd_into_dy(dy.transpose(0, 1), gate.transpose(0, 1), up.transpose(0, 1))
    # A dy smaller than gate would be read (and written) past its end: refused before any launch.
    for op in (torch.ops.kernelbench.silu_mul_bwd_into_dy, torch.ops.kernelbench.silu_mul_bwd):
        with pytest.raises(ValueError, match=r"dy is \(3, 5, 8\) torch.float32 on cpu, gate \(3, 5, 16\)"):
            op(dy[..., :8].contiguous(), gate, up)
        with pytest.raises(ValueError, match="dy must match gate"):
            op(dy.double(), gate, up)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU code needs a C++ compiler")
def test_inductor_writes_dgate_over_the_down_projections_gradient_without_a_copy():
    """In a compiled MLP, dy is the down projection's fresh gradient: Inductor hands it to the in-place
    op itself (no clone), so the backward holds one new [tokens, intermediate] buffer (dup) where the
    functional op held two, as Inductor's own SiLU backward does."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = MLP("triton")
    compiled = torch.compile(mlp, fullgraph=True)
    x = torch.randn(2, 3, 16)

    def step():
        compiled(x).square().sum().backward()

    _, codes = run_and_get_code(step)
    backward = codes[-1]
    assert "kernelbench.silu_mul_bwd_into_dy" in backward, backward
    assert "clone" not in backward and ".copy_(" not in backward, backward
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad(set_to_none=True)
    mlp(x).square().sum().backward()
    for got, want in zip(grads, [p.grad for p in mlp.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
BAD = [
    (lambda: silu_mul(torch.randn(4, 8), torch.randn(4, 9), impl="triton"),
     r"up has shape \(4, 9\), gate \(4, 8\); both must have the same shape"),
    (lambda: silu_mul(torch.randn(4, 8), torch.randn(1, 8), impl="triton"), "no broadcasting"),
    (lambda: silu_mul(torch.randn(4, 8), torch.randn(4, 8).half(), impl="triton"),
     "up has dtype torch.float16, gate torch.float32"),
    (lambda: silu_mul(torch.ones(4, 8, dtype=torch.int32), torch.ones(4, 8, dtype=torch.int32), impl="triton"),
     "unsupported dtype torch.int32; accepted: float32, bfloat16, float16, float64"),
]


@pytest.mark.parametrize("call, match", BAD, ids=["shape", "broadcast", "dtype-mismatch", "int-dtype"])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_without_the_interpreter_triton_refuses_cpu_tensors_and_auto_takes_torch(monkeypatch):
    import kernelbench.nn._triton_support as support

    monkeypatch.setattr(support, "interpreter", lambda: False)
    gate, up, _ = draw((2, 8), torch.float32, seed=7)
    with pytest.raises(ValueError, match=r"silu_mul\(impl='triton'\): Triton kernels need CUDA tensors"):
        silu_mul(gate, up, impl="triton")
    out = silu_mul(gate, up)
    assert type(out.grad_fn).__name__ == "MulBackward0"  # F.silu(gate) * up


def test_bad_impl_and_device():
    with pytest.raises(ValueError, match="impl must be one of auto, triton, torch, got 'cuda'"):
        silu_mul(torch.randn(2), torch.randn(2), impl="cuda")
    with pytest.raises(ValueError, match="up is on meta, gate on cpu"):
        silu_mul(torch.randn(2), torch.empty(2, device="meta"), impl="torch")


@pytest.mark.parametrize("call, match", BAD[:1] + BAD[2:], ids=["shape", "dtype-mismatch", "int-dtype"])
def test_bad_input_under_compile_raises_the_eager_message(call, match):
    torch._dynamo.reset()
    with pytest.raises(Exception, match=match):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_under_compile_without_the_interpreter(monkeypatch):
    """At trace time: impl="triton" on CPU tensors raises, impl="auto" traces torch's silu and mul."""
    monkeypatch.delenv("TRITON_INTERPRET")
    gate, up, _ = draw((2, 8), torch.float32, seed=8)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"silu_mul\(impl='triton'\): Triton kernels need CUDA tensors"):
        torch.compile(lambda g, u: silu_mul(g, u, impl="triton"), backend="aot_eager", fullgraph=True)(gate, up)
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    out = torch.compile(lambda g, u: silu_mul(g, u), backend=backend, fullgraph=True)(gate, up)
    torch.testing.assert_close(out, F.silu(gate) * up)
    assert "silu" in graphs[0] and "kernelbench" not in graphs[0]
