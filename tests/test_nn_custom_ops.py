"""kernelbench.nn under torch.compile, on the CPU: the custom ops' schemas, fake tensors and
autograd registration (torch.library.opcheck), zero graph breaks on a small block, compiled
forward and backward equal to eager (aot_eager backend, kernels in the Triton interpreter), no
recompilation on fresh same-shape inputs, and bad input reported with the eager message."""

import re

import pytest
import torch

from kernelbench.nn import (
    RMSNorm,
    _triton_support,
    apply_rotary,
    apply_rotary_,
    autoselect,
    autoselect_report,
    cross_entropy,
    linear_cross_entropy,  # noqa: F401 (registers kernelbench::linear_cross_entropy)
    rms_norm,
    silu_mul,
)

HEADS, HEAD_DIM = 2, 8
HIDDEN = HEADS * HEAD_DIM


def test_schemas():
    ops = torch.ops.kernelbench
    assert str(ops.rms_norm_fwd.default._schema) == (
        "kernelbench::rms_norm_fwd(Tensor x, Tensor? weight, Tensor? residual, float eps) -> (Tensor, Tensor, Tensor)")
    assert str(ops.rms_norm_bwd.default._schema) == (
        "kernelbench::rms_norm_bwd(Tensor dy, Tensor? dh, Tensor normed, Tensor? weight, Tensor rstd) "
        "-> (Tensor, Tensor)")
    assert str(ops.rotary.default._schema) == (
        "kernelbench::rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? offsets, SymInt position_offset, "
        "bool interleaved, bool bshd, bool backward) -> (Tensor, Tensor)")
    assert "Tensor(a0!) q, Tensor(a1!) k" in str(ops.rotary_.default._schema)


def _direct_calls():
    """Each op called directly (as torch.ops), one tensor not matching the others: what a kernel
    would read or write past its end, or in the wrong dtype, if the op did not check."""
    ops = torch.ops.kernelbench
    x, w, rows = torch.randn(4, 16), torch.ones(16), torch.ones(4)
    q, k, cos, sin = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8), torch.ones(8, 8), torch.zeros(8, 8)
    logits, targets = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    return [
        ("rms_norm_fwd residual", lambda: ops.rms_norm_fwd(x, w, x[:2], 1e-6), "residual has shape"),
        ("rms_norm_fwd weight", lambda: ops.rms_norm_fwd(x, w[:8], None, 1e-6), "weight has shape"),
        ("rms_norm_bwd dy", lambda: ops.rms_norm_bwd(x[:2], None, x, w, rows), r"dy is \(2, 16\)"),
        ("rms_norm_bwd dh", lambda: ops.rms_norm_bwd(x, x.double(), x, w, rows), "dh is"),
        ("rms_norm_bwd rstd", lambda: ops.rms_norm_bwd(x, None, x, w, rows[:2]), r"rstd is \(2,\)"),
        ("rotary cos", lambda: ops.rotary(q, k, cos[:4], sin[:4], None, 0, False, False, False), "positions"),
        ("rotary_ k", lambda: ops.rotary_(q, k[..., :4], cos, sin, None, 0, False, False), "must share"),
        ("silu_mul_fwd up", lambda: ops.silu_mul_fwd(x, x[:2]), "up has shape"),
        ("silu_mul_bwd dy", lambda: ops.silu_mul_bwd(x[:2], x, x), "dy must match gate"),
        ("cross_entropy_fwd targets", lambda: ops.cross_entropy_fwd(logits, targets[:2], -100, "mean"),
         "targets has shape"),
        ("linear_cross_entropy weight", lambda: ops.linear_cross_entropy(x, torch.randn(10, 8), targets, -100, "mean",
                                                                         None, False, False),
         "does not match hidden"),
    ]


@pytest.mark.parametrize("name, call, message", _direct_calls(), ids=[c[0] for c in _direct_calls()])
def test_every_op_called_directly_checks_its_tensors_before_a_launch(name, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("residual, weight", [(False, True), (True, True), (True, False)])
def test_opcheck_rms_norm(residual, weight):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=gen, requires_grad=True)
    w = torch.randn(16, generator=gen, requires_grad=True) if weight else None
    r = torch.randn(3, 5, 16, generator=gen, requires_grad=True) if residual else None
    torch.library.opcheck(torch.ops.kernelbench.rms_norm_fwd.default, (x, w, r, 1e-6))
    with torch.no_grad():
        _, h, rstd = torch.ops.kernelbench.rms_norm_fwd(x, w, r, 1e-6)
    normed = h if residual else x.detach()
    torch.library.opcheck(torch.ops.kernelbench.rms_norm_bwd.default,
                          (torch.randn_like(x), torch.randn_like(x) if residual else None, normed,
                           None if w is None else w.detach(), rstd))


@pytest.mark.parametrize("interleaved, bshd, offsets", [(False, False, False), (True, True, True)])
def test_opcheck_rotary(interleaved, bshd, offsets):
    gen = torch.Generator().manual_seed(1)
    shape = (lambda h: (2, 4, h, HEAD_DIM)) if bshd else (lambda h: (2, h, 4, HEAD_DIM))
    q = torch.randn(shape(4), generator=gen, requires_grad=True)
    k = torch.randn(shape(2), generator=gen, requires_grad=True)
    angles = torch.rand(9, HEAD_DIM, generator=gen)
    off = torch.tensor([0, 5]) if offsets else None
    args = (q, k, angles.cos(), angles.sin(), off, 0 if offsets else 3, interleaved, bshd, False)
    torch.library.opcheck(torch.ops.kernelbench.rotary.default, args)


class Block(torch.nn.Module):
    """RMSNorm (fused residual), linear, rotary, RMSNorm: the layers as a model uses them."""

    def __init__(self, impl):
        super().__init__()
        self.impl = impl
        self.norm1 = RMSNorm(HIDDEN, impl=impl)
        self.proj = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.norm2 = RMSNorm(HIDDEN, impl=impl)

    def forward(self, x, residual, cos, sin):
        b, s, _ = x.shape
        y, h = self.norm1(x, residual)
        q, k = self.proj(y).view(b, s, 2 * HEADS, HEAD_DIM).transpose(1, 2).chunk(2, dim=1)
        q, k = apply_rotary(q, k, cos, sin, impl=self.impl)
        return self.norm2((q + k).transpose(1, 2).reshape(b, s, HIDDEN)) + rms_norm(h, impl=self.impl)


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, HIDDEN, generator=gen, requires_grad=True)
    r = torch.randn(2, 4, HIDDEN, generator=gen, requires_grad=True)
    angles = torch.rand(4, HEAD_DIM, generator=gen)
    return x, r, angles.cos(), angles.sin()


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_no_graph_breaks(impl):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(Block(impl))(*_inputs(0))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_compiled_matches_eager_and_does_not_recompile():
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block("triton")
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    from torch._dynamo.utils import counters

    counters.clear()
    for step in range(5):
        x, r, cos, sin = _inputs(step)
        out = compiled(x, r, cos, sin)
        out.square().sum().backward()
        got = [out.detach(), x.grad, r.grad] + [p.grad for p in block.parameters()]
        block.zero_grad(set_to_none=True)
        x2, r2 = x.detach().clone().requires_grad_(True), r.detach().clone().requires_grad_(True)
        ref = block(x2, r2, cos, sin)
        ref.square().sum().backward()
        want = [ref.detach(), x2.grad, r2.grad] + [p.grad for p in block.parameters()]
        block.zero_grad(set_to_none=True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]


def test_auto_is_decided_outside_the_trace(tmp_path, monkeypatch):
    """impl='auto' under compile reads no file and builds no version string: the choice is a
    trace-time constant from what eager calls decided."""
    monkeypatch.setenv(autoselect.CACHE_ENV, str(tmp_path))
    autoselect.clear_memory_cache()
    calls = []
    monkeypatch.setattr(autoselect, "_read_file", lambda: calls.append("read") or {})
    monkeypatch.setattr(autoselect, "cache_key", lambda *a, **k: calls.append("key") or "k")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: rms_norm(x, impl="auto"), backend="eager", fullgraph=True)
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), rms_norm(x, impl="torch"))
    assert calls == []


def _traced_ops(fn, *args) -> set[str]:
    """The kernelbench ops in the graph torch.compile traces for fn(*args)."""
    seen: set[str] = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if str(n.target).startswith("kernelbench."))
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return seen


def test_auto_rotary_is_torch_under_compile_whatever_eager_chose(tmp_path, monkeypatch):
    """Eager calls that chose Triton make a traced RMSNorm take Triton, but a traced rotary takes
    torch's formula (rotary's Candidates.traced), so Inductor can fuse it with its neighbours."""
    monkeypatch.setenv(autoselect.CACHE_ENV, str(tmp_path))
    autoselect.clear_memory_cache()
    def triton_faster(runners):
        return {"triton": 0.1, "torch": 0.2}

    autoselect_report("rmsnorm", (4, HIDDEN), torch.float32, mode="fwd", timer=triton_faster)
    autoselect_report("rotary", (1, HEADS, 1, 4, HEAD_DIM, HEAD_DIM), torch.float32, mode="fwd",
                                 variant="half-bhsd", timer=triton_faster)
    x = torch.randn(4, HIDDEN)
    q, k = torch.randn(1, HEADS, 4, HEAD_DIM), torch.randn(1, 1, 4, HEAD_DIM)
    angles = torch.rand(4, HEAD_DIM)
    cos, sin = angles.cos(), angles.sin()
    try:
        with torch.no_grad():  # eager calls record their choice: "triton", timed above
            rms_norm(x, impl="auto")
            apply_rotary(q, k, cos, sin, impl="auto")
        assert set(autoselect.choices_made().values()) == {"triton"}
        with torch.no_grad():
            assert _traced_ops(lambda t: rms_norm(t, impl="auto"), x) == {"kernelbench.rms_norm_fwd"}
            assert _traced_ops(lambda a, b: apply_rotary(a, b, cos, sin, impl="auto"), q, k) == set()
            assert _traced_ops(lambda a, b: apply_rotary(a, b, cos, sin, impl="triton"), q, k) == {
                "kernelbench.rotary"}
    finally:
        autoselect.clear_memory_cache()


@pytest.mark.parametrize("call, message", [
    (lambda: rms_norm(torch.randn(4, 8), torch.ones(7), impl="triton"), r"weight has shape \(7,\), expected \(8,\)"),
    (lambda: rms_norm(torch.randn(4, 8).int(), torch.ones(8), impl="triton"), "unsupported dtype torch.int32"),
    (lambda: rms_norm(torch.randn(2, 70000), impl="triton"), "last dimension 70000 > 65536"),
    (lambda: rms_norm(torch.randn(4, 8), residual=torch.randn(4, 9), impl="triton"), r"residual has shape \(4, 9\)"),
    (lambda: apply_rotary(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.ones(4, 8), torch.ones(4, 8),
                          impl="triton"), "must share batch, sequence and head dimension"),
    (lambda: apply_rotary(torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8), torch.ones(4, 8), torch.ones(4, 8),
                          impl="triton"), "shorter than the 9 needed"),
    (lambda: apply_rotary(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.ones(4, 8), torch.ones(4, 8),
                          layout="sbhd", impl="triton"), "layout must be one of bhsd, bshd, got 'sbhd'"),
])
def test_bad_input_under_compile_raises_the_eager_message(call, message):
    with pytest.raises((ValueError, TypeError)) as eager:
        call()
    # torch.compile's default: the eager error itself, same type and text, at the first call.
    torch._dynamo.reset()
    with pytest.raises(type(eager.value), match=message) as compiled:
        torch.compile(call, backend="aot_eager")()
    assert str(compiled.value) == str(eager.value)
    # fullgraph=True: Dynamo reports the same exception, raised in traced code.
    torch._dynamo.reset()
    with pytest.raises(Exception, match=message):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def _rotary_inputs():
    angles = torch.rand(4, HEAD_DIM)
    return torch.randn(1, 2, 4, HEAD_DIM), torch.randn(1, 1, 4, HEAD_DIM), angles.cos(), angles.sin()


IMPL_HINT = "; use impl='torch' or impl='auto'"


@pytest.mark.parametrize("call, message", [
    (lambda: rms_norm(torch.randn(4, 8), impl="triton"), "rms_norm(impl='triton'): {}" + IMPL_HINT),
    (lambda: apply_rotary(*_rotary_inputs(), impl="triton"), "apply_rotary(impl='triton'): {}" + IMPL_HINT),
    (lambda: apply_rotary_(*_rotary_inputs()), "apply_rotary_: {}"),
    (lambda: silu_mul(torch.randn(2, 8), torch.randn(2, 8), impl="triton"), "silu_mul(impl='triton'): {}" + IMPL_HINT),
    (lambda: cross_entropy(torch.randn(3, 10), torch.tensor([1, 2, 3]), impl="triton"),
     "cross_entropy(impl='triton'): {}" + IMPL_HINT),
], ids=["rms_norm", "apply_rotary", "apply_rotary_", "silu_mul", "cross_entropy"])
def test_triton_path_where_it_cannot_run_under_compile(monkeypatch, call, message):
    """The Triton path on CPU tensors without the interpreter: the eager call's ValueError, and
    under torch.compile the same one, not an error inside Dynamo."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # what a trace reads
    monkeypatch.setattr(_triton_support, "interpreter", lambda: False)  # what an eager call reads
    message = message.format(_triton_support.NEEDS_CUDA)
    with pytest.raises(ValueError) as eager:
        call()
    assert str(eager.value) == message
    torch._dynamo.reset()
    with pytest.raises(ValueError) as compiled:
        torch.compile(call, backend="aot_eager")()
    assert str(compiled.value) == message
    torch._dynamo.reset()
    with pytest.raises(Exception, match=re.escape(message)):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_inplace_rotary_compiles_whole():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 4, HEAD_DIM, generator=gen), torch.randn(1, 1, 4, HEAD_DIM, generator=gen)
    angles = torch.rand(4, HEAD_DIM, generator=gen)
    want = apply_rotary(q, k, angles.cos(), angles.sin(), impl="triton")
    torch._dynamo.reset()
    torch.compile(lambda a, b: apply_rotary_(a, b, angles.cos(), angles.sin()), backend="aot_eager",
                  fullgraph=True)(q, k)
    torch.testing.assert_close(q, want[0])
    torch.testing.assert_close(k, want[1])


def test_compiled_strided_inputs_match_eager():
    """A strided weight (every other element of a buffer) and a column-major x go through the
    ops' copies, forward and backward, as in eager."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, 6, generator=gen).t().requires_grad_(True)  # (6, 16), column-major
    buffer = torch.randn(32, generator=gen)

    def fn(a, b):
        return rms_norm(a, b[::2], 1e-6, impl="triton")

    torch._dynamo.reset()
    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        b = buffer.clone().requires_grad_(True)
        out = f(x, b)
        out.square().sum().backward()
        results.append((out.detach(), x.grad.clone(), b.grad.clone()))
        x.grad = None
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_tracing_under_inductor_registers_the_fallback_inductor_would_create():
    """Once Inductor's lowering is loaded, tracing one of our ops registers every functional
    kernelbench op's fallback with the layout constraint of its tags, so Inductor never builds
    its implicit-fallback log text (minutes on a bf16 Llama graph before torch 2.13)."""
    import torch._inductor.lowering as lowering
    from torch._library.utils import get_layout_constraint_tag
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kernelbench.nn import _inductor_fallbacks, crossentropy, swiglu  # noqa: F401

    with FakeTensorMode():
        x = torch.empty(4, HIDDEN)
        torch.ops.kernelbench.rms_norm_fwd(x, torch.empty(HIDDEN), None, 1e-6)
    names = {op.name() for op in _inductor_fallbacks._ops}
    assert {"kernelbench::rms_norm_fwd", "kernelbench::rms_norm_bwd", "kernelbench::rotary",
            "kernelbench::silu_mul_fwd", "kernelbench::silu_mul_bwd", "kernelbench::cross_entropy_fwd"} <= names
    for op in _inductor_fallbacks._ops:
        assert op in lowering.lowerings, op
        expected = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        assert lowering._maybe_layout_constraints.get(op) is expected, op


def test_compile_caches_find_every_kernel_an_op_launches():
    """torch.compile's AOT autograd cache keys a graph on the kernels each triton_op launches,
    which torch finds by reading the op's body and the functions it calls, and only where a
    ``wrap_triton`` call names the kernel. Checked where the ops are triton_ops: outside the
    interpreter, in a process of its own (the GPU test checks the same on CUDA)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("this torch has no torch.library.triton_op")
    expected = {
        "kernelbench::rms_norm_fwd": ["_rmsnorm_fwd_kernel"],
        "kernelbench::rms_norm_bwd": ["_rmsnorm_bwd_kernel", "_rmsnorm_bwd_wide_kernel", "_rmsnorm_dw_kernel",
                                      "_sum_rows_kernel"],
        "kernelbench::rotary": ["_rotary_kernel"],
        "kernelbench::rotary_": ["_rotary_kernel"],
        "kernelbench::silu_mul_fwd": ["_silu_mul_fwd_kernel"],
        "kernelbench::silu_mul_bwd": ["_silu_mul_bwd_kernel"],
        "kernelbench::cross_entropy_fwd": ["_xent_fwd_kernel"],
    }
    code = (
        "import json, sys\n"
        "from torch._library.triton import get_triton_kernels_for_op\n"
        "import kernelbench.nn.rmsnorm, kernelbench.nn.rotary, kernelbench.nn.swiglu, kernelbench.nn.crossentropy\n"
        "ops = json.loads(sys.argv[1])\n"
        "print(json.dumps({op: sorted(k.fn.__name__ for k in get_triton_kernels_for_op(op)) for op in ops}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(list(expected))], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    for op, kernels in expected.items():
        missing = sorted(set(kernels) - set(found.get(op, [])))
        assert not missing, f"{op}: the compile cache would not key on {missing}"
