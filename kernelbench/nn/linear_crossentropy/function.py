"""Linear cross-entropy's autograd: the eager ``LinearCrossEntropyFunction`` (``host.forward`` /
``host.backward``), and the op torch.compile sees (``kernelbench::linear_cross_entropy``) with a
fake and an autograd formula, so a model compiles with fullgraph=True.

The op is an opaque custom op, not a traced ``triton_op`` like cross-entropy's: its body reuses
one logits buffer across chunks and writes the gradients into slices of their outputs, which a
traced body would have functionalized into copies of that buffer; its launches are a handful per
chunk of multi-millisecond GEMMs, so launching them from Python costs nothing that shows.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import _inductor_fallbacks
from . import host
from .host import as_rows, as_targets, check_inputs


class LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, reduction, chunk_rows):
        loss, dh, dw = host.forward(as_rows(hidden).contiguous(), weight.contiguous(), as_targets(targets),
                                    ignore_index, reduction, chunk_rows,
                                    ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        ctx.save_for_backward(dh, dw)
        ctx.hidden_shape = hidden.shape
        return loss

    @staticmethod
    @once_differentiable  # the gradients are made in the forward: a double backward is an error
    def backward(ctx, grad):
        dh, dw = ctx.saved_tensors
        # A graph that is not kept runs this backward once: the forward's gradients are scaled in
        # place and handed over, a pass over dW saved where the upstream gradient is 1.
        scale = host.backward if _graph_kept() else host.backward_in_place
        dh, dw = scale(grad, dh, dw)
        return None if dh is None else dh.view(ctx.hidden_shape), dw, None, None, None, None


def _graph_kept() -> bool:
    """Whether the running backward keeps the graph (``retain_graph`` / ``create_graph``, as
    gradcheck does): then this node may run again. True where torch cannot say."""
    kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if kept is None else bool(kept())


def forward_no_grad(hidden, weight, targets, ignore_index, reduction, chunk_rows):
    loss, _, _ = host.forward(as_rows(hidden).contiguous(), weight.contiguous(), as_targets(targets),
                              ignore_index, reduction, chunk_rows, False, False)
    return loss


# ------------------------------------------------------------------------------------------------
# The op torch.compile sees
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("kernelbench::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy_op(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
    chunk_rows: int | None, grad_hidden: bool, grad_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dh, dW): dh / dW of the loss itself, empty where not asked for."""
    check_inputs(hidden, weight, targets, ignore_index, reduction, chunk_rows)
    loss, dh, dw = host.forward(as_rows(hidden).contiguous(), weight.contiguous(), as_targets(targets),
                                ignore_index, reduction, chunk_rows, grad_hidden, grad_weight)
    return (loss, hidden.new_empty(0) if dh is None else dh.view(hidden.shape),
            weight.new_empty(0) if dw is None else dw)


@_linear_cross_entropy_op.register_fake
def _(hidden, weight, targets, ignore_index, reduction, chunk_rows, grad_hidden, grad_weight):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    check_inputs(hidden, weight, targets, ignore_index, reduction, chunk_rows)
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    return (hidden.new_empty((), dtype=acc),
            hidden.new_empty(hidden.shape if grad_hidden else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)))


def _op_setup_context(ctx, inputs, output):
    _, dh, dw = output
    ctx.save_for_backward(dh, dw)
    ctx.grad_hidden, ctx.grad_weight = inputs[6], inputs[7]


def _op_backward(ctx, grad, _ddh, _ddw):
    dh, dw = ctx.saved_tensors
    dh, dw = host.backward(grad, dh if ctx.grad_hidden else None, dw if ctx.grad_weight else None)
    return dh, dw, None, None, None, None, None, None


_linear_cross_entropy_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def linear_cross_entropy_compiled(hidden, weight, targets, ignore_index, reduction, chunk_rows,
                                  grad_hidden, grad_weight):
    """The path taken under torch.compile: one op, its gradients kept for the backward."""
    loss, _, _ = torch.ops.kernelbench.linear_cross_entropy(hidden, weight, targets, ignore_index, reduction,
                                                            chunk_rows, grad_hidden, grad_weight)
    return loss


# Inductor runs this op through a fallback registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(torch.ops.kernelbench.linear_cross_entropy.default)
