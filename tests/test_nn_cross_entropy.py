"""kernelbench.nn.cross_entropy: the Triton kernels (interpreter on CPU) against the fp64 reference,
edge cases torch defines (ignored rows, empty input, -inf logits), gradcheck, the custom ops
(opcheck, aot_eager fullgraph compile) and the errors for bad input, eager and traced."""

import pytest
import torch
import torch.nn.functional as F

from kernelbench.nn import _triton_support as support
from kernelbench.nn import cross_entropy
from kernelbench.nn.crossentropy import cross_entropy_ref_fp32
from kernelbench.nn.crossentropy import host as K

# (atol, rtol) for the loss (fp32 math whatever the logits' dtype) and for the gradient, which is
# rounded once to the logits' dtype.
LOSS_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-5, 1e-5), torch.bfloat16: (1e-5, 1e-5)}
GRAD_TOL = {torch.float32: (1e-7, 1e-5), torch.float16: (1e-7, 2e-3), torch.bfloat16: (1e-7, 1e-2)}


def make(shape, dtype, seed, ignored=(), scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(shape, generator=gen)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    flat = targets.view(-1)
    for row in ignored:
        flat[row] = -100
    return logits, targets


def run_both(logits, targets, reduction, config=None, impl="triton"):
    """(loss, dlogits) of kernelbench and of the fp64 reference, same upstream gradient."""
    if config is None:
        loss = cross_entropy(logits, targets, reduction=reduction, impl=impl)
    else:  # a launch other than the default (small chunks: the chunk loop on small shapes)
        x2d, t1d = K.as_rows(logits.detach()), K.as_targets(targets)
        loss, lse, n_valid = K.forward(x2d, t1d, -100, reduction, config=config)
    gen = torch.Generator().manual_seed(99)
    grad = torch.randn(loss.shape, generator=gen)
    if config is None:
        loss.backward(grad)
        dlogits = logits.grad
    else:
        dlogits = K.backward(grad, x2d, t1d, lse, n_valid, -100, reduction, config=config).view(logits.shape)
        loss = loss.view(targets.shape) if reduction == "none" else loss
    ref_logits = logits.detach().double().requires_grad_(True)
    ref = cross_entropy_ref_fp32(ref_logits, targets, -100, reduction)
    ref.backward(grad.double())
    return (loss.detach(), dlogits), (ref.detach(), ref_logits.grad)


def check(got, want, dtype):
    (loss, dx), (ref_loss, ref_dx) = got, want
    assert loss.dtype == torch.float32 and dx.dtype == dtype
    assert loss.shape == ref_loss.shape and dx.shape == ref_dx.shape
    torch.testing.assert_close(loss.double(), ref_loss, atol=LOSS_TOL[dtype][0], rtol=LOSS_TOL[dtype][1])
    # The reference gradient rounded to the logits' dtype is what one rounding allows.
    torch.testing.assert_close(dx.double(), ref_dx.to(dtype).double(), atol=GRAD_TOL[dtype][0],
                               rtol=GRAD_TOL[dtype][1])


CASES = [
    ((1, 5), torch.float32, ()),  # one row, V not a power of two
    ((7, 300), torch.float16, (2, 6)),  # ignored rows
    ((2, 3, 50), torch.bfloat16, (4,)),  # 3-D: leading dims flattened to rows
    ((2, 9000), torch.float32, ()),  # V > the widest chunk: two chunks, pipelined loop
]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape, dtype, ignored", CASES,
                         ids=[f"{'x'.join(map(str, s))}-{str(d)[6:]}" for s, d, _ in CASES])
def test_matches_reference(shape, dtype, ignored, reduction):
    logits, targets = make(shape, dtype, sum(shape), ignored)
    check(*run_both(logits, targets, reduction), dtype)


@pytest.mark.parametrize("config", [K.XentConfig(64, 2, 1), K.XentConfig(32, 1, 3)], ids=["chunks", "pipelined"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_rows_match_reference(config, reduction):
    logits, targets = make((5, 300), torch.float32, 7, ignored=(1,))
    check(*run_both(logits, targets, reduction, config=config), torch.float32)


def test_default_configs_cover_wide_vocabularies():
    for v in (100, 32000, 128256, 262144):
        for cfg in (K.fwd_config(v), K.bwd_config(v)):
            # Chunks, not whole rows, in registers: at most 16 values a thread, whatever V.
            assert min(v, 4096) <= cfg.block_v <= 8192
            assert cfg.block_v // (32 * cfg.num_warps) <= 16
    with pytest.raises(ValueError, match="block_v must be a power of two, got 100"):
        K.XentConfig(100, 4)
    with pytest.raises(ValueError, match="num_stages must be 1 to 4, got 0"):
        K.XentConfig(128, 4, 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, in the interpreter, on -inf - -inf
def test_leading_minus_inf_chunk_and_inf_targets():
    """A row whose first chunks are all -inf (a masked vocabulary) stays finite, as in torch."""
    logits, targets = make((3, 300), torch.float32, 3)
    with torch.no_grad():
        logits[0, :128] = float("-inf")
        logits[1, :] = float("-inf")  # nothing finite: torch's loss is NaN too
    targets[0] = 200
    got, want = run_both(logits, targets, "none", config=K.XentConfig(64, 2, 1))
    torch.testing.assert_close(got[0].double(), want[0], equal_nan=True)
    assert torch.isfinite(got[0][0]) and torch.isnan(got[0][1])
    torch.testing.assert_close(got[1][0].double(), want[1][0])


def test_gradcheck_fp64():
    logits, targets = make((3, 9), torch.float64, 11, ignored=(1,))
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda x, r=reduction: cross_entropy(x, targets, reduction=r, impl="triton"), (logits,))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, in the interpreter, on 0 / 0
def test_every_row_ignored_and_no_rows_match_torch():
    logits, targets = make((3, 20), torch.float32, 5, ignored=(0, 1, 2))
    loss = cross_entropy(logits, targets, impl="triton")
    loss.backward()
    assert torch.isnan(loss) and torch.equal(logits.grad, torch.zeros_like(logits))
    assert cross_entropy(logits, targets, reduction="sum", impl="triton").item() == 0.0
    empty, no_targets = make((0, 20), torch.float32, 5)
    for reduction in ("mean", "sum", "none"):
        got = cross_entropy(empty, no_targets, reduction=reduction, impl="triton")
        want = F.cross_entropy(empty.detach(), no_targets, reduction=reduction)
        torch.testing.assert_close(got, want, equal_nan=True)


def test_out_of_range_target_gives_nan_without_a_sync():
    logits, targets = make((3, 20), torch.float32, 6)
    targets[1] = 20
    loss = cross_entropy(logits, targets, reduction="none", impl="triton")
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()


def test_strided_inputs_and_expanded_gradient():
    """Rows of a wider buffer, targets with a stride, and reduction "none" differentiated
    through .sum() (an upstream gradient of stride 0)."""
    gen = torch.Generator().manual_seed(8)
    buffer = torch.randn(6, 80, generator=gen, requires_grad=True)
    logits = buffer[:, :70]  # row stride 80
    targets = torch.randint(0, 70, (12,), generator=gen)[::2]
    cross_entropy(logits, targets, reduction="none", impl="triton").sum().backward()
    got = buffer.grad.clone()
    buffer.grad = None
    cross_entropy_ref_fp32(logits, targets, reduction="none").sum().backward()
    torch.testing.assert_close(got, buffer.grad, atol=1e-7, rtol=1e-5)


def test_impl_torch_and_auto():
    logits, targets = make((4, 30), torch.bfloat16, 9, ignored=(3,))
    torch.testing.assert_close(cross_entropy(logits, targets, impl="torch"),
                               F.cross_entropy(logits.float(), targets))
    torch.testing.assert_close(cross_entropy(logits, targets, impl="auto"),
                               cross_entropy(logits, targets, impl="triton"))


def test_auto_falls_back_to_torch_where_triton_cannot_run(monkeypatch):
    monkeypatch.setattr(support, "interpreter", lambda: False)  # a CPU tensor without the interpreter
    logits, targets = make((4, 30), torch.float32, 10)
    torch.testing.assert_close(cross_entropy(logits, targets), F.cross_entropy(logits, targets))
    with pytest.raises(ValueError, match=r"impl='triton'\): Triton kernels need CUDA tensors"):
        cross_entropy(logits, targets, impl="triton")


BAD_INPUT = [
    (lambda: cross_entropy(torch.randn(4, 8).int(), torch.zeros(4, dtype=torch.long)),
     "unsupported logits dtype torch.int32; accepted: float32, bfloat16, float16, float64"),
    (lambda: cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.int32)),
     "targets must be int64 class indices, got dtype torch.int32"),
    (lambda: cross_entropy(torch.randn(4, 8), torch.zeros(5, dtype=torch.long)),
     r"targets has shape \(5,\), expected \(4,\)"),
    (lambda: cross_entropy(torch.randn(4, 0), torch.zeros(4, dtype=torch.long)), "have no classes"),
    (lambda: cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), reduction="avg"),
     "reduction must be one of mean, sum, none, got 'avg'"),
    (lambda: cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), ignore_index=1.5),
     "ignore_index must be an int, got float"),
]


@pytest.mark.parametrize("call, message", BAD_INPUT)
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_bad_impl_and_device_mismatch():
    with pytest.raises(ValueError, match="impl must be one of auto, triton, torch, got 'cuda'"):
        cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), impl="cuda")
    with pytest.raises(ValueError, match="targets are on meta, logits on cpu"):
        cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long, device="meta"))


# ------------------------------------------------------------------------------------------------
# The custom ops and torch.compile (aot_eager: the kernels still run in the interpreter)
# ------------------------------------------------------------------------------------------------
def test_schemas():
    ops = torch.ops.kernelbench
    assert str(ops.cross_entropy_fwd.default._schema) == (
        "kernelbench::cross_entropy_fwd(Tensor logits, Tensor targets, SymInt ignore_index, str reduction) "
        "-> (Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_opcheck(reduction):
    logits, targets = make((2, 3, 40), torch.float32, 12, ignored=(1,))
    torch.library.opcheck(torch.ops.kernelbench.cross_entropy_fwd.default, (logits, targets, -100, reduction))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", [(1, 4), tuple(range(6))], ids=["some-ignored", "all-ignored"])
def test_op_reduces_like_the_eager_kernels(reduction, ignored):
    """The op torch.compile sees sums the rows in ATen ops, eager calls in the reduce kernel: the
    same loss and count of valid rows, NaN for a mean over no row (as torch)."""
    logits, targets = make((2, 3, 40), torch.float32, 21, ignored=ignored)
    loss, lse, n_valid = torch.ops.kernelbench.cross_entropy_fwd(logits.detach(), targets, -100, reduction)
    want_loss, want_lse, want_n = K.forward(K.as_rows(logits.detach()), K.as_targets(targets), -100, reduction)
    assert n_valid.item() == want_n.item() == 6 - len(ignored)
    torch.testing.assert_close(lse, want_lse)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6, equal_nan=True)
    if reduction == "mean" and len(ignored) == 6:
        assert loss.isnan()


def _loss_fn(impl, reduction):
    def fn(hidden, weight, targets):
        logits = hidden @ weight  # the loss as a model computes it, behind the head
        loss = cross_entropy(logits, targets, reduction=reduction, impl=impl)
        return loss if reduction != "none" else loss.sum()

    return fn


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_no_graph_breaks(impl):
    gen = torch.Generator().manual_seed(13)
    hidden, weight = torch.randn(2, 4, 8, generator=gen), torch.randn(8, 50, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (2, 4), generator=gen)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_loss_fn(impl, "mean"))(hidden, weight, targets)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert "kernelbench.cross_entropy_fwd" in explained.graphs[0].code


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_traced_backward_is_aten_ops_equal_to_the_kernel(reduction, dtype):
    """Under torch.compile the backward is traced as ATen ops (so Inductor can fuse it with the
    zero gradient of logits a step also returns); it must give the eager kernel's gradients,
    ignored rows and a target outside [0, V) included."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    backward_graphs = []

    def keep_backward(gm, _):
        backward_graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=keep_backward)
    gen = torch.Generator().manual_seed(7)
    logits0 = (3 * torch.randn(2, 5, 40, generator=gen)).to(dtype)
    targets = torch.randint(0, 40, (2, 5), generator=gen)
    targets[0, 1] = targets[1, 4] = -100
    if reduction == "none":
        targets[1, 2] = 40  # outside [0, V): a NaN loss, the gradient without its one-hot term

    def step(logits):  # returns the logits too, as a training step does
        loss = cross_entropy(logits, targets, reduction=reduction, impl="triton")
        return (loss.nansum() if reduction == "none" else loss), logits

    grads = []
    for f in (torch.compile(step, backend=backend, fullgraph=True), step):
        logits = logits0.clone().requires_grad_(True)
        f(logits)[0].backward()
        grads.append(logits.grad)
    torch._dynamo.reset()
    assert "kernelbench" not in backward_graphs[0].code and "aten.exp" in backward_graphs[0].code
    atol = 1e-6 if dtype == torch.float32 else 4e-3  # bf16: one rounding of an fp32 value below 1
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=atol)
    assert torch.equal(grads[0][0, 1], torch.zeros_like(grads[0][0, 1]))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_matches_eager_without_recompiling(reduction):
    from torch._dynamo.utils import counters

    fn = _loss_fn("triton", reduction)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    counters.clear()
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        hidden = torch.randn(2, 4, 8, generator=gen)
        targets = torch.randint(0, 50, (2, 4), generator=gen)
        targets[0, step] = -100
        results = []
        for f in (compiled, fn):
            weight = torch.randn(8, 50, generator=torch.Generator().manual_seed(100), requires_grad=True)
            loss = f(hidden, weight, targets)
            loss.backward()
            results.append((loss.detach(), weight.grad))
        torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]


@pytest.mark.parametrize("call, message", BAD_INPUT[:3])
def test_bad_input_under_compile_raises_the_eager_message(call, message):
    torch._dynamo.reset()
    with pytest.raises(Exception, match=message):
        torch.compile(lambda: call(), backend="aot_eager", fullgraph=True)()


def test_double_backward_is_refused():
    logits, targets = make((3, 20), torch.float32, 14)
    (dx,) = torch.autograd.grad(cross_entropy(logits, targets, impl="triton"), logits, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        dx.sum().backward()
