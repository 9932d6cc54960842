"""Linear cross-entropy: the loss of a language model's head, ``F.cross_entropy((hidden @
weight.T).float(), targets)``, with its gradients for hidden and weight, computed chunk by chunk
over the tokens so neither the fp32 logits nor the full logits in the input dtype ever exist.

``linear_cross_entropy_ref`` is the reference (the plain loss).

Below this file: ``function.py`` (autograd and the op torch.compile sees), ``host.py`` (checks,
chunk plan, ``forward`` / ``backward``), ``kernels.py`` (the Triton kernels it launches).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._triton_support import foreign, on_input_device, runs_here_const
from .._triton_support import why_not_here as triton_usable
from .function import LinearCrossEntropyFunction, forward_no_grad, linear_cross_entropy_compiled
from .host import check_inputs

__all__ = ["LinearCrossEntropyLoss", "linear_cross_entropy", "linear_cross_entropy_ref", "triton_usable"]


def linear_cross_entropy_ref(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """The plain loss: logits = hidden @ weight.T in the input dtype, then ``F.cross_entropy`` on
    them upcast to fp32 (fp64 stays fp64), as Hugging Face models compute it."""
    compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.t()
    return F.cross_entropy(logits.to(compute), targets.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction)


@on_input_device
def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of the logits ``hidden @ weight.T`` against int64 ``targets``: hidden (N, H)
    or (B, S, H), weight (V, H) of hidden's dtype (fp32 / bf16 / fp16; fp64 too), targets of
    hidden's leading shape.

    Same value and gradients as ``linear_cross_entropy_ref``: ``reduction`` "mean" (over the rows
    whose target is not ``ignore_index``; NaN when there is none) or "sum". The loss is fp32 (fp64
    for fp64 inputs); the gradients have the inputs' dtype. ``chunk_rows``: tokens per chunk (None:
    ``host.plan_chunk_rows``'s rule). The gradients are computed during the forward, so a call
    that records a gradient holds them (N * H + V * H elements) until its backward; a backward that
    does not keep the graph scales them in place and hands them over. Nothing waits
    for the host: targets outside [0, V) give a NaN loss instead of an error. Where the
    Triton kernels cannot run (CPU tensors without TRITON_INTERPRET=1, no triton) or must not take
    an input (a tensor subclass such as DTensor) it computes the reference.
    """
    check_inputs(hidden, weight, targets, ignore_index, reduction, chunk_rows)
    compiling = torch.compiler.is_compiling()
    runs = (runs_here_const(hidden.is_cuda) if compiling
            else triton_usable(hidden) is None and not foreign(hidden, weight, targets))
    if not runs:
        return linear_cross_entropy_ref(hidden, weight, targets, ignore_index, reduction)
    grad_hidden = torch.is_grad_enabled() and hidden.requires_grad
    grad_weight = torch.is_grad_enabled() and weight.requires_grad
    if compiling:
        return linear_cross_entropy_compiled(hidden, weight, targets, ignore_index, reduction, chunk_rows,
                                             grad_hidden, grad_weight)
    if grad_hidden or grad_weight:
        return LinearCrossEntropyFunction.apply(hidden, weight, targets, ignore_index, reduction, chunk_rows)
    # No gradient to record: no gradient GEMMs, no autograd bookkeeping.
    return forward_no_grad(hidden, weight, targets, ignore_index, reduction, chunk_rows)


class LinearCrossEntropyLoss(torch.nn.Module):
    """``linear_cross_entropy`` as a module: ``loss = LinearCrossEntropyLoss()(hidden, lm_head.weight,
    targets)``."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", chunk_rows: int | None = None) -> None:
        super().__init__()
        self.ignore_index, self.reduction, self.chunk_rows = ignore_index, reduction, chunk_rows

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, targets, ignore_index=self.ignore_index,
                                    reduction=self.reduction, chunk_rows=self.chunk_rows)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, chunk_rows={self.chunk_rows}"
