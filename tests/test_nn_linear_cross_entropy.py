"""kernelbench.nn.linear_cross_entropy: the chunked head + loss (cross-entropy kernels in the
interpreter on CPU) against the fp64 plain loss, over chunk counts (a ragged last chunk
included), ignored rows, both reductions, an all-ignored and an empty batch; the chunk rule; the
in-place entry point of cross-entropy's backward it relies on; the custom op (opcheck, aot_eager
fullgraph compile); the errors for bad input, eager and traced."""

import pytest
import torch

from kernelbench.nn import LinearCrossEntropyLoss, linear_cross_entropy
from kernelbench.nn import _triton_support as support
from kernelbench.nn.crossentropy import host as xent_host
from kernelbench.nn.linear_crossentropy import (
    LOGITS_BUDGET_BYTES,
    MIN_CHUNK_ROWS,
    ROWS_PER_HIDDEN,
    linear_cross_entropy_ref,
    plan_chunk_rows,
)
from kernelbench.nn.linear_crossentropy import host as lce_host

V = 37


def make(shape, vocab, dtype, seed, ignored=()):
    """hidden of ``shape`` (..., H), weight (vocab, H) giving logits of std ~2, targets with the
    rows ``ignored`` (flat indices) set to -100."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)
    weight = (2 / shape[-1] ** 0.5 * torch.randn(vocab, shape[-1], generator=gen)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, shape[:-1], generator=gen)
    flat = targets.view(-1)
    for row in ignored:
        flat[row] = -100
    return hidden, weight, targets


def run_both(hidden, weight, targets, reduction, chunk_rows=None, fn=None):
    """(loss, dh, dW) of kernelbench and of the fp64 plain loss, same upstream gradient."""
    fn = fn or (lambda h, w, t: linear_cross_entropy(h, w, t, reduction=reduction, chunk_rows=chunk_rows))
    grad = torch.tensor(1.7)  # an upstream gradient other than 1: the backward's scaling is checked
    loss = fn(hidden, weight, targets)
    loss.backward(grad)
    ref_h = hidden.detach().double().requires_grad_(True)
    ref_w = weight.detach().double().requires_grad_(True)
    ref = linear_cross_entropy_ref(ref_h, ref_w, targets, -100, reduction)
    ref.backward(grad.double())
    return (loss.detach(), hidden.grad, weight.grad), (ref.detach(), ref_h.grad, ref_w.grad)


def check(got, want, dtype=torch.float32, rtol=1e-5, atol=1e-6):
    (loss, dh, dw), (ref, ref_dh, ref_dw) = got, want
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert dh.dtype == dtype and dw.dtype == dtype
    assert dh.shape == ref_dh.shape and dw.shape == ref_dw.shape
    torch.testing.assert_close(loss.double(), ref, rtol=rtol, atol=atol, equal_nan=True)
    torch.testing.assert_close(dh.double(), ref_dh, rtol=rtol, atol=atol)
    torch.testing.assert_close(dw.double(), ref_dw, rtol=rtol, atol=atol)


# chunk_rows over 24 rows: None (the rule: one chunk here), one chunk, three equal chunks, a
# ragged last chunk (5 + 5 + 5 + 5 + 4), one row a chunk.
@pytest.mark.parametrize("chunk_rows", [None, 24, 8, 5, 1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_matches_fp64_reference(chunk_rows, reduction):
    hidden, weight, targets = make((24, 16), V, torch.float32, 1, ignored=(0, 7, 23))
    check(*run_both(hidden, weight, targets, reduction, chunk_rows))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_batch_sequence_hidden(reduction):
    hidden, weight, targets = make((3, 5, 16), V, torch.float32, 2, ignored=(4, 11))
    got, want = run_both(hidden, weight, targets, reduction, chunk_rows=4)
    assert got[1].shape == (3, 5, 16)
    check(got, want)


@pytest.mark.parametrize("dtype, rtol", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_half_precision_inputs(dtype, rtol):
    """fp16 / bf16 logits, dlogits and GEMM outputs are each rounded once: gradients judged by
    their norm (elements cross zero), the fp32 loss to the logits' rounding."""
    hidden, weight, targets = make((20, 16), V, dtype, 3, ignored=(2,))
    (loss, dh, dw), (ref, ref_dh, ref_dw) = run_both(hidden, weight, targets, "mean", chunk_rows=6)
    assert loss.dtype == torch.float32 and dh.dtype == dtype and dw.dtype == dtype
    torch.testing.assert_close(loss.double(), ref, rtol=1e-3, atol=0)
    for got, want in ((dh, ref_dh), (dw, ref_dw)):
        err = (got.double() - want).norm() / want.norm()
        assert err <= rtol, f"relative Frobenius error {err:.3g} > {rtol}"


def test_fp16_mean_gradients_do_not_underflow():
    """A mean over many rows and a wide vocabulary: each logit's gradient, about 1 / (V * N) =
    1.2e-7, is near fp16's smallest subnormal (6e-8); kept unscaled through the GEMMs."""
    hidden, weight, targets = make((1024, 8), 8192, torch.float16, 6)
    (_, dh, dw), (_, ref_dh, ref_dw) = run_both(hidden, weight, targets, "mean", chunk_rows=512)
    for got, want in ((dh, ref_dh), (dw, ref_dw)):
        err = (got.double() - want).norm() / want.norm()
        assert err <= 3e-3, f"relative Frobenius error {err:.3g} > 3e-3"


def test_gradcheck_fp64():
    hidden, weight, targets = make((5, 3), 7, torch.float64, 4, ignored=(1,))
    for reduction in ("mean", "sum"):
        assert torch.autograd.gradcheck(
            lambda h, w, r=reduction: linear_cross_entropy(h, w, targets, reduction=r, chunk_rows=2),
            (hidden, weight))


@pytest.mark.parametrize("reduction, loss", [("mean", float("nan")), ("sum", 0.0)])
@pytest.mark.parametrize("rows", [6, 0], ids=["all-ignored", "empty"])
def test_all_ignored_and_empty_batch_match_torch(reduction, loss, rows):
    hidden, weight, targets = make((rows, 8), V, torch.float32, 5, ignored=range(rows))
    got, want = run_both(hidden, weight, targets, reduction, chunk_rows=4)
    check(got, want)
    torch.testing.assert_close(got[0], torch.tensor(loss), equal_nan=True)
    assert torch.equal(got[1], torch.zeros_like(got[1])) and torch.equal(got[2], torch.zeros_like(got[2]))


def test_one_input_needing_a_gradient():
    hidden, weight, targets = make((10, 8), V, torch.float32, 6, ignored=(3,))
    ref = linear_cross_entropy_ref(hidden.double(), weight.double(), targets)
    frozen = weight.detach()
    linear_cross_entropy(hidden, frozen, targets, chunk_rows=3).backward()
    (ref_dh,) = torch.autograd.grad(linear_cross_entropy_ref(hidden.double(), frozen.double(), targets),
                                    hidden)
    torch.testing.assert_close(hidden.grad.double(), ref_dh.double(), rtol=1e-5, atol=1e-6)
    linear_cross_entropy(hidden.detach(), weight, targets, chunk_rows=3).backward()
    (ref_dw,) = torch.autograd.grad(ref, weight)
    torch.testing.assert_close(weight.grad.double(), ref_dw.double(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, chunk_rows=3)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-6)


def test_strided_inputs():
    """A transposed weight and a sliced hidden are made contiguous before any launch."""
    hidden, weight, targets = make((12, 16), V, torch.float32, 7, ignored=(5,))
    weight_t = weight.detach().t().contiguous().t()  # (V, H) with strides (1, V)
    hidden_s = torch.cat([hidden.detach(), hidden.detach()], dim=1)[:, ::2]
    assert not weight_t.is_contiguous() and not hidden_s.is_contiguous()
    loss = linear_cross_entropy(hidden_s, weight_t, targets, chunk_rows=5)
    ref = linear_cross_entropy_ref(hidden_s.double(), weight_t.double(), targets)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)


def test_module():
    hidden, weight, targets = make((9, 8), V, torch.float32, 8, ignored=(0,))
    module = LinearCrossEntropyLoss(reduction="sum", chunk_rows=4)
    assert "reduction='sum', chunk_rows=4" in repr(module)
    check(*run_both(hidden, weight, targets, "sum", fn=module))


def test_falls_back_to_the_reference_where_triton_cannot_run(monkeypatch):
    monkeypatch.setattr(support, "interpreter", lambda: False)  # a CPU tensor without the interpreter
    hidden, weight, targets = make((6, 8), V, torch.float32, 9)
    assert type(linear_cross_entropy(hidden, weight, targets).grad_fn).__name__ == "NllLossBackward0"
    check(*run_both(hidden, weight, targets, "mean"))


def test_double_backward_is_refused():
    hidden, weight, targets = make((4, 8), V, torch.float32, 10)
    (dh,) = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets), hidden, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        dh.sum().backward()


# ------------------------------------------------------------------------------------------------
# The chunk rule and cross-entropy's in-place backward
# ------------------------------------------------------------------------------------------------
def test_chunk_rule():
    # Qwen2.5-0.5B's head in bf16: the budget holds fewer rows than the minimum, which decides.
    assert LOGITS_BUDGET_BYTES // (151936 * 2) < MIN_CHUNK_ROWS
    assert plan_chunk_rows(8192, 896, 151936, 2) == MIN_CHUNK_ROWS
    assert plan_chunk_rows(8192, 896, 128256, 2) == MIN_CHUNK_ROWS  # Llama-3's: 2093 rows, 2048 in whole tiles
    assert plan_chunk_rows(100, 896, 128256, 2) == 100  # fewer rows than a chunk: one chunk
    # A wide hidden: chunks of ROWS_PER_HIDDEN * H rows, so few chunks re-read dW (V x H).
    assert ROWS_PER_HIDDEN * 2048 == 4096
    assert plan_chunk_rows(8192, 2048, 128256, 2) == 4096  # Llama-3.2-1B: 2 chunks, not 4
    assert plan_chunk_rows(4096, 4096, 128256, 2) == 4096  # Llama-3-8B at 1x4096: one chunk
    assert plan_chunk_rows(8192, 1536, 151936, 2) == 2816  # Qwen2.5-1.5B: 3072 rows, evened over 3 chunks
    # A narrow vocabulary: the budget's rows (a multiple of 128), evened out over the chunks:
    # 16384 rows over a budget of 5376 take 4 chunks of 4096, not 3 full ones and a sliver.
    assert LOGITS_BUDGET_BYTES // (49152 * 2) // 128 * 128 == 5376
    rows = plan_chunk_rows(16384, 576, 49152, 2)
    assert rows == 4096 and rows * 49152 * 2 <= LOGITS_BUDGET_BYTES
    # Rows not a multiple of the chunk: the even split rounds up to 128, the last chunk is ragged.
    assert plan_chunk_rows(11000, 576, 49152, 2) == 3712  # 3 chunks: 3712 + 3712 + 3576
    assert plan_chunk_rows(50, 16, 1000, 4, chunk_rows=7) == 7
    assert plan_chunk_rows(50, 16, 1000, 4, chunk_rows=70) == 50
    assert plan_chunk_rows(0, 16, 1000, 4) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("upstream", [1.0, 1.7, 0.0])
def test_backward_in_place_equals_out_of_place(dtype, upstream):
    """The backward of a graph that is not kept scales the forward's gradients in place (and
    touches nothing where the upstream gradient is 1): the same values as the out-of-place product."""
    gen = torch.Generator().manual_seed(12)
    dh, dw = torch.randn(7, 5, generator=gen).to(dtype), torch.randn(9000, 3, generator=gen).to(dtype)
    grad = torch.tensor(upstream)
    want = lce_host.backward(grad, dh, dw)
    got = lce_host.backward_in_place(grad, dh.clone(), dw.clone())
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    kept_dw = dw.clone()
    _, same = lce_host.backward_in_place(grad, None, kept_dw)
    assert same is kept_dw  # handed over, not copied


def test_backward_hands_over_its_gradients_unless_the_graph_is_kept():
    """``loss.backward()`` takes the in-place path, ``retain_graph=True`` the out-of-place one, so
    a second backward through a kept graph accumulates the right gradient."""
    hidden, weight, targets = make((10, 8), V, torch.float32, 13, ignored=(2,))
    ref = linear_cross_entropy_ref(hidden.double(), weight.double(), targets)
    ref_dh, ref_dw = torch.autograd.grad(3 * ref, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, targets, chunk_rows=4)
    (3 * loss).backward(retain_graph=True)
    (3 * loss).backward()
    torch.testing.assert_close(hidden.grad, 2 * ref_dh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, 2 * ref_dw, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        (3 * loss).backward()


def test_cross_entropy_backward_in_place_equals_out_of_place():
    gen = torch.Generator().manual_seed(11)
    logits = 2 * torch.randn(6, 50, generator=gen)
    targets = torch.randint(0, 50, (6,), generator=gen)
    targets[2] = -100
    loss, lse, n_valid = xent_host.forward(logits, targets, -100, "mean")
    grad = torch.tensor(1.3)
    want = xent_host.backward(grad, logits, targets, lse, n_valid, -100, "mean")
    buffer = logits.clone()
    got = xent_host.backward(grad, buffer, targets, lse, n_valid, -100, "mean", out=buffer)
    assert got.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
def _lce(h_shape=(4, 8), w_shape=(V, 8), t_shape=(4,), h_dtype=torch.float32, w_dtype=None,
         t_dtype=torch.long, t_device="cpu", **kw):
    return lambda: linear_cross_entropy(torch.randn(h_shape).to(h_dtype), torch.randn(w_shape).to(w_dtype or h_dtype),
                                        torch.zeros(t_shape, dtype=t_dtype, device=t_device), **kw)


BAD_INPUT = [
    (_lce(h_dtype=torch.int32), "unsupported hidden dtype torch.int32; accepted: float32, bfloat16"),
    (_lce(w_dtype=torch.bfloat16), "weight has dtype torch.bfloat16, hidden torch.float32; they must match"),
    (_lce(h_shape=(8,), t_shape=()), r"hidden of shape \(8,\); expected \(N, H\) or \(B, S, H\)"),
    (_lce(w_shape=(V, 9)), r"weight of shape \(37, 9\) does not match hidden of shape \(4, 8\)"),
    (_lce(w_shape=(0, 8)), r"weight of shape \(0, 8\); expected \(V, H\) with V >= 1"),
    (_lce(t_dtype=torch.int32), "targets must be int64 class indices, got dtype torch.int32"),
    (_lce(t_shape=(5,)), r"targets has shape \(5,\), expected \(4,\)"),
    (_lce(t_device="meta"), "hidden is on cpu, weight on cpu, targets on meta; they must share one device"),
    (_lce(reduction="none"), "reduction must be one of mean, sum, got 'none'"),
    (_lce(ignore_index=1.5), "ignore_index must be an int, got float"),
    (_lce(chunk_rows=0), "chunk_rows must be None or an int >= 1, got 0"),
]


@pytest.mark.parametrize("call, message", BAD_INPUT)
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


@pytest.mark.parametrize("call, message", [BAD_INPUT[1], BAD_INPUT[6]])
def test_bad_input_under_compile_raises_the_eager_message(call, message):
    torch._dynamo.reset()
    with pytest.raises(Exception, match=message):
        torch.compile(lambda: call(), backend="aot_eager", fullgraph=True)()


# ------------------------------------------------------------------------------------------------
# The custom op and torch.compile (aot_eager: the kernels still run in the interpreter)
# ------------------------------------------------------------------------------------------------
def test_schema():
    assert str(torch.ops.kernelbench.linear_cross_entropy.default._schema) == (
        "kernelbench::linear_cross_entropy(Tensor hidden, Tensor weight, Tensor targets, SymInt ignore_index, "
        "str reduction, SymInt? chunk_rows, bool grad_hidden, bool grad_weight) -> (Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_opcheck(reduction):
    hidden, weight, targets = make((2, 3, 8), V, torch.float32, 12, ignored=(1,))
    torch.library.opcheck(torch.ops.kernelbench.linear_cross_entropy.default,
                          (hidden, weight, targets, -100, reduction, 2, True, True))


def test_no_graph_breaks():
    hidden, weight, targets = make((2, 4, 8), V, torch.float32, 13)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda h, w, t: linear_cross_entropy(h, w, t, chunk_rows=3))(
        hidden, weight, targets)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert "kernelbench.linear_cross_entropy" in explained.graphs[0].code


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_compiled_matches_eager_without_recompiling(reduction):
    from torch._dynamo.utils import counters

    def fn(h, w, t):
        return linear_cross_entropy(h, w, t, reduction=reduction, chunk_rows=5)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    counters.clear()
    for step in range(3):
        results = []
        for f in (compiled, fn):
            hidden, weight, targets = make((2, 6, 8), V, torch.float32, 20 + step, ignored=(step, 11))
            got, want = run_both(hidden, weight, targets, reduction, fn=f)
            check(got, want)
            results.append(got)
        torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
