"""Cross-entropy's autograd: the eager ``CrossEntropyFunction`` (``host.forward`` /
``host.backward``), and the op torch.compile sees (``kernelbench::cross_entropy_fwd``,
``compiled_op``: a triton_op, so Inductor launches the kernels from its generated code) with a
fake and an autograd formula in ATen ops, so a model compiles with fullgraph=True.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import _inductor_fallbacks
from .._triton_support import acc_dtype, compiled_op, static_int, wrap_triton
from . import host
from .host import as_rows, as_targets, check_inputs, fwd_config, fwd_meta
from .kernels import _xent_fwd_kernel


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction):
        x2d, t1d = as_rows(logits), as_targets(targets)
        loss, lse, n_valid = host.forward(x2d, t1d, ignore_index, reduction)
        ctx.save_for_backward(x2d, t1d, lse, n_valid)
        ctx.shape, ctx.ignore_index, ctx.reduction = logits.shape, ignore_index, reduction
        return loss.view(targets.shape) if reduction == "none" else loss

    @staticmethod
    @once_differentiable  # the backward kernel has no derivative: a double backward is an error
    def backward(ctx, grad):
        x2d, t1d, lse, n_valid = ctx.saved_tensors
        dx = host.backward(grad, x2d, t1d, lse, n_valid, ctx.ignore_index, ctx.reduction)
        return dx.view(ctx.shape), None, None, None


def forward_no_grad(logits, targets, ignore_index, reduction):
    loss, _, _ = host.forward(as_rows(logits), as_targets(targets), ignore_index, reduction)
    return loss.view(targets.shape) if reduction == "none" else loss


# ------------------------------------------------------------------------------------------------
# The op torch.compile sees
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::cross_entropy_fwd", mutates_args=())
def _cross_entropy_fwd_op(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, n_valid); lse of shape (M,), n_valid a scalar (empty for "none"). The body is
    ``host.forward``'s row kernel, traceably; the sum over rows is ATen ops here, which Inductor
    turns into a reduction of its own: one launch of a user kernel fewer per step, whose host
    time decides small compiled steps (results/2026-11-29-h200-host-bound-swaps)."""
    check_inputs(logits, targets, ignore_index, reduction)
    x2d, t1d = as_rows(logits), as_targets(targets)
    m, v = x2d.shape
    acc = acc_dtype(x2d.dtype)
    lse = torch.empty(m, dtype=acc, device=x2d.device)
    loss_rows = torch.empty(m, dtype=acc, device=x2d.device)
    if m:
        cfg = fwd_config(static_int(v))  # the vocabulary: specialized under dynamic shapes
        wrap_triton(_xent_fwd_kernel)[(m,)](x2d, x2d.stride(0), t1d, loss_rows, lse, v, ignore_index,
                                            **fwd_meta(cfg, x2d.dtype))
    if reduction == "none":
        return loss_rows.view(targets.shape), lse, lse.new_empty(0)
    if not m:
        empty = float("nan") if reduction == "mean" else 0.0
        return torch.full((), empty, dtype=acc, device=x2d.device), lse, torch.zeros((), dtype=acc, device=x2d.device)
    # Ignored rows hold a zero loss; a mean over none is 0 / 0 = NaN, as torch's.
    n_valid = (t1d != ignore_index).sum(dtype=acc)
    total = loss_rows.sum()
    return (total / n_valid if reduction == "mean" else total), lse, n_valid


@_cross_entropy_fwd_op.register_fake
def _(logits, targets, ignore_index, reduction):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    check_inputs(logits, targets, ignore_index, reduction)
    acc = acc_dtype(logits.dtype)
    loss = logits.new_empty(targets.shape if reduction == "none" else (), dtype=acc)
    n_valid = logits.new_empty(0 if reduction == "none" else (), dtype=acc)
    return loss, logits.new_empty((targets.numel(),), dtype=acc), n_valid


def _op_setup_context(ctx, inputs, output):
    logits, targets, ignore_index, reduction = inputs
    _, lse, n_valid = output
    ctx.save_for_backward(logits, targets, lse, n_valid)
    ctx.ignore_index, ctx.reduction = ignore_index, reduction


def _op_backward(ctx, grad, _dlse, _dn_valid):
    """The backward torch.compile traces: ``_xent_bwd_kernel``'s formula as ATen ops, which Inductor
    fuses with what else the graph adds to dlogits. A compiled step that also returns its logits
    adds their zero gradient, which beside an opaque op costs a pass of its own over M x V
    (results/2026-11-24-h100-small-call/README.md); alone the formula is one pass, like the kernel.
    Eager calls take ``CrossEntropyFunction`` and the kernel."""
    logits, targets, lse, n_valid = ctx.saved_tensors
    acc = acc_dtype(logits.dtype)
    g = grad.to(acc)
    if ctx.reduction == "mean":
        g = g / n_valid
    g = g.expand(targets.shape).unsqueeze(-1)
    p = torch.exp(logits.to(acc) - lse.view(targets.shape).unsqueeze(-1))
    onehot = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)
    dx = (p - onehot.to(acc)) * g
    # Ignored rows: zeros, whatever their lse holds (the forward skips them).
    dx = torch.where((targets != ctx.ignore_index).unsqueeze(-1), dx, 0.0).to(logits.dtype)
    return dx, None, None, None


_cross_entropy_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def cross_entropy_compiled(logits, targets, ignore_index, reduction):
    """The path taken under torch.compile: one op, lse and n_valid kept for the backward."""
    loss, _, _ = torch.ops.kernelbench.cross_entropy_fwd(logits, targets, ignore_index, reduction)
    return loss


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(torch.ops.kernelbench.cross_entropy_fwd.default)
