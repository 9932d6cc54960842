"""kernelbench.nn's ops under Inductor as ``torch.library.triton_op``s: Inductor's generated code
launches our Triton kernels itself (no call of a kernelbench op is left in it), Inductor finds
that our kernels write none of their inputs (else it copies them first), and the compiled
forward and backward equal eager's bit for bit (same kernels, same configurations; eps cast to
fp32 in the kernel whatever float width Inductor passes); the cross-entropy's sum over rows and
its backward are Inductor's under compile, so those are close instead."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from kernelbench.nn import apply_rotary, apply_rotary_, cross_entropy, rms_norm, silu_mul

pytestmark = pytest.mark.gpu


def _leaves(*shapes, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, generator=gen, device="cuda").to(dtype).requires_grad_(True) for s in shapes]


def _compiled_and_eager(fn, leaves, seed=1):
    """(outputs, gradients) of fn compiled by Inductor and eager, and the code Inductor generated
    for the forward and the backward."""

    def step(run):
        for t in leaves:
            t.grad = None
        out = run(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, device="cuda").to(o.dtype) for o in outs])
        return [o.detach() for o in outs], [t.grad.clone() for t in leaves]

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    got, code = run_and_get_code(step, compiled)
    return got, step(fn), "\n".join(code)


def _assert_launched_by_inductor(code, kernels):
    assert "torch.ops.kernelbench" not in code, "a kernelbench op is still called from the compiled code"
    for name in kernels:
        assert name in code, f"{name} is not launched from the compiled code"


def _assert_bitwise(got, want):
    for kind, a_list, b_list in (("output", got[0], want[0]), ("gradient", got[1], want[1])):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            differ = int((a != b).sum())
            assert differ == 0, f"{kind} {i}: {differ} of {a.numel()} elements differ from eager"


@pytest.mark.parametrize("residual, weight", [(False, True), (True, True), (False, False)])
@pytest.mark.parametrize("n", [256, 2048, 4096, 12288])
def test_rms_norm_compiled_equals_eager(residual, weight, n):
    # 8 x 512 rows: more than one program's worth, so eager keeps rstd as the compiled graph does.
    shapes = [(8, 512, n)] + ([(n,)] if weight else []) + ([(8, 512, n)] if residual else [])

    def fn(x, *rest):
        w = rest[0] if weight else None
        r = rest[-1] if residual else None
        return rms_norm(x, w, 1e-6, residual=r, impl="triton")

    got, want, code = _compiled_and_eager(fn, _leaves(*shapes))
    _assert_launched_by_inductor(code, ["_rmsnorm_fwd_kernel", "_rmsnorm_bwd"])
    _assert_bitwise(got, want)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_rotary_compiled_equals_eager(layout):
    q_shape, k_shape = ((2, 16, 512, 128), (2, 4, 512, 128)) if layout == "bhsd" else \
        ((2, 512, 16, 128), (2, 512, 4, 128))
    q, k = _leaves(q_shape, k_shape)
    angles = torch.rand(512, 128, device="cuda") * 6
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    got, want, code = _compiled_and_eager(
        lambda a, b: apply_rotary(a, b, cos, sin, layout=layout, impl="triton"), [q, k])
    _assert_launched_by_inductor(code, ["_rotary_kernel"])
    _assert_bitwise(got, want)


def test_silu_mul_compiled_equals_eager():
    # impl="triton": "auto" may take torch's formula at this shape (whatever its timing said).
    got, want, code = _compiled_and_eager(lambda g, u: silu_mul(g, u, impl="triton"),
                                          _leaves((4, 1000, 768), (4, 1000, 768)))
    # The compiled backward writes dgate over dy (silu_mul_bwd_into_dy); eager's leaves dy alone.
    _assert_launched_by_inductor(code, ["_silu_mul_fwd_kernel", "_silu_mul_bwd_in_place_kernel"])
    _assert_bitwise(got, want)


def test_inplace_rotary_compiled_equals_eager():
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 8, 256, 64, generator=gen, device="cuda").bfloat16()
    k = torch.randn(2, 2, 256, 64, generator=gen, device="cuda").bfloat16()
    angles = torch.rand(256, 64, generator=gen, device="cuda")
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    want = apply_rotary(q, k, cos, sin, impl="triton")
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(lambda a, b: apply_rotary_(a, b, cos, sin), fullgraph=True), q, k)
    _assert_launched_by_inductor("\n".join(code), ["_rotary_kernel"])
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_kernels_see_only_their_own_stores():
    """Inductor copies any input a user kernel may write; our kernels write only their outputs."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_functional

    seen = {}
    original = type(triton_kernel_wrapper_functional).__call__

    def spy(self, **kwargs):
        name = kernel_side_table.get_kernel(kwargs["kernel_idx"]).fn.__name__
        seen.setdefault(name, set()).update(kwargs["tensors_to_clone"])
        return original(self, **kwargs)

    x, w, r = _leaves((4, 512, 1024), (1024,), (4, 512, 1024))
    q, k = _leaves((2, 8, 128, 64), (2, 2, 128, 64))
    angles = torch.rand(128, 64, device="cuda")
    targets = torch.randint(0, 1024, (4, 512), device="cuda")

    def fn(x, w, r, q, k):
        y, h = rms_norm(x, w, 1e-6, residual=r, impl="triton")
        qr, kr = apply_rotary(q, k, angles.cos(), angles.sin(), impl="triton")
        z = rms_norm(silu_mul(y, h, impl="triton"), None, 1e-6, impl="triton")  # no weight: placeholder pointers
        return cross_entropy(z, targets), qr, kr

    torch._dynamo.reset()
    type(triton_kernel_wrapper_functional).__call__ = spy
    try:
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, w, r, q, k)
        torch.autograd.backward(out, [torch.ones_like(o) for o in out])
    finally:
        type(triton_kernel_wrapper_functional).__call__ = original
    read_only = {
        "_rmsnorm_fwd_kernel": {"x_ptr", "res_ptr", "w_ptr"},
        "_rmsnorm_bwd_kernel": {"x_ptr", "w_ptr", "dy_ptr", "dres_ptr", "rstd_ptr"},
        "_rotary_kernel": {"q_ptr", "k_ptr", "cos_ptr", "sin_ptr", "offsets_ptr"},
        "_silu_mul_fwd_kernel": {"gate_ptr", "up_ptr"},
        "_silu_mul_bwd_in_place_kernel": {"gate_ptr", "up_ptr"},  # dy receives dgate by design
        "_xent_fwd_kernel": {"x_ptr", "t_ptr"},
    }
    assert set(read_only) <= set(seen), sorted(seen)
    for name, inputs in read_only.items():
        assert not seen[name] & inputs, f"{name}: Inductor would copy {sorted(seen[name] & inputs)}"


def test_cross_entropy_compiled_loss_equals_eager():
    (logits,) = _leaves((4, 512, 4096))
    targets = torch.randint(0, 4096, (4, 512), device="cuda")
    targets[0, :7] = -100
    got, want, code = _compiled_and_eager(lambda x: cross_entropy(x, targets), [logits])
    _assert_launched_by_inductor(code, ["_xent_fwd_kernel"])
    # The sum over rows is Inductor's reduction under compile, the reduce kernel eagerly: the same
    # row losses summed in another order.
    torch.testing.assert_close(got[0][0], want[0][0], rtol=1e-6, atol=1e-6)
    # The compiled backward is the kernel's formula in ATen ops (fused by Inductor): close, not equal.
    err = ((got[1][0].float() - want[1][0].float()).norm() / want[1][0].float().norm()).item()
    assert err < 1e-2, err


def test_dynamic_shapes_trace_and_match_eager():
    """torch.compile(dynamic=True) with two sequence lengths: the op bodies trace with symbolic
    batch and sequence sizes (the model's dims specialized), one graph serves both, and the
    results match eager."""
    from torch._dynamo.utils import counters

    hidden, heads, kv_heads, head_dim = 256, 4, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(hidden, generator=gen, device="cuda").requires_grad_(True)

    def fn(x, r, q, k, cos, sin, targets):
        y, h = rms_norm(x, w, 1e-6, residual=r, impl="triton")
        qr, kr = apply_rotary(q, k, cos, sin, impl="triton")
        return cross_entropy(silu_mul(y, h), targets), qr, kr

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)
    counters.clear()
    for seq in (1024, 2048):
        x, r = (torch.randn(4, seq, hidden, generator=gen, device="cuda").requires_grad_(True) for _ in range(2))
        q = torch.randn(4, heads, seq, head_dim, generator=gen, device="cuda").requires_grad_(True)
        k = torch.randn(4, kv_heads, seq, head_dim, generator=gen, device="cuda").requires_grad_(True)
        angles = torch.rand(seq, head_dim, generator=gen, device="cuda") * 6
        targets = torch.randint(0, hidden, (4, seq), generator=gen, device="cuda")
        results = []
        for run in (compiled, fn):
            for t in (x, r, q, k, w):
                t.grad = None
            out = run(x, r, q, k, angles.cos(), angles.sin(), targets)
            torch.autograd.backward(out, [torch.ones_like(o) for o in out])
            results.append([o.detach() for o in out] + [t.grad.clone() for t in (x, r, q, k, w)])
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_compile_caches_key_on_every_kernel_an_op_launches():
    """torch.compile's AOT autograd cache keys a graph on the source of the kernels each triton_op
    launches, found by reading the op's body: every kernel must be found there, or a changed
    kernel could be served from the cache."""
    from torch._library.triton import get_triton_kernels_for_op

    expected = {
        "kernelbench::rms_norm_fwd": {"_rmsnorm_fwd_kernel"},
        "kernelbench::rms_norm_bwd": {"_rmsnorm_bwd_kernel", "_rmsnorm_bwd_wide_kernel", "_rmsnorm_dw_kernel",
                                      "_sum_rows_kernel"},
        "kernelbench::rotary": {"_rotary_kernel"},
        "kernelbench::rotary_": {"_rotary_kernel"},
        "kernelbench::silu_mul_fwd": {"_silu_mul_fwd_kernel"},
        "kernelbench::silu_mul_bwd": {"_silu_mul_bwd_kernel"},
        "kernelbench::cross_entropy_fwd": {"_xent_fwd_kernel"},
    }
    for op, kernels in expected.items():
        found = {kernel.fn.__name__ for kernel in get_triton_kernels_for_op(op)}
        assert kernels <= found, f"{op}: the compile cache would not key on {sorted(kernels - found)}"
