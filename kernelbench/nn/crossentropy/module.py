"""Cross-entropy of logits against class indices on kernelbench's Triton kernels: the value and
gradient of ``torch.nn.functional.cross_entropy(logits.float(), targets)`` (what Hugging Face
models compute) without materialising the fp32 logits, their log-softmax or its gradient.

``cross_entropy_ref_fp32`` is the reference.

Below this file: ``function.py`` (autograd and the op torch.compile sees), ``host.py`` (launch
configuration, checks, ``forward`` / ``backward``), ``kernels.py`` (the Triton kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...fast_launch import fast_apply
from .._triton_support import foreign, on_input_device, require_const, runs_here_const
from .._triton_support import why_not_here as triton_usable
from .function import CrossEntropyFunction, cross_entropy_compiled, forward_no_grad
from .host import REDUCTIONS, SUPPORTED_DTYPES, check_inputs

__all__ = ["IMPLS", "REDUCTIONS", "SUPPORTED_DTYPES", "cross_entropy", "cross_entropy_ref_fp32", "triton_usable"]

# Eager calls skip autograd.Function.apply's Python wrapper (host time of small calls).
_cross_entropy_autograd = fast_apply(CrossEntropyFunction)


IMPLS = ("auto", "triton", "torch")


def cross_entropy_ref_fp32(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """``F.cross_entropy`` on the logits upcast to fp32 (fp64 stays fp64), any leading shape
    flattened to rows; the loss of "none" has the targets' shape."""
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(compute), targets.reshape(-1),
                           ignore_index=ignore_index, reduction=reduction)
    return loss.view(targets.shape) if reduction == "none" else loss


@on_input_device
def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    impl: str = "auto",
) -> torch.Tensor:
    """Cross-entropy of ``logits`` (..., V) in fp32 / bf16 / fp16 (fp64 too) against int64
    ``targets`` of the logits' leading shape, computed in fp32.

    Same value and gradient as ``F.cross_entropy(logits.float(), targets, ignore_index=...,
    reduction=...)`` on the rows: ``reduction`` "mean" (over the rows whose target is not
    ``ignore_index``; NaN when there is none), "sum" or "none" (the targets' shape). The loss is
    fp32 (fp64 for fp64 logits); the gradient has the logits' dtype. Nothing waits for the host:
    targets outside [0, V) give NaN losses instead of an error.
    ``impl``: "triton", "torch" (the expression above) or "auto" (Triton where it runs: CUDA
    tensors with triton installed, or TRITON_INTERPRET=1; else torch). A tensor subclass (DTensor)
    takes torch's path under "auto" and is an error under "triton".
    """
    if impl not in IMPLS:
        raise ValueError(f"cross_entropy: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    compiling = torch.compiler.is_compiling()
    # Traced too: under torch.compile a bad input then raises this same error (fullgraph=True
    # wraps it in Dynamo's "Observed exception"); valid inputs trace to shape guards only.
    check_inputs(logits, targets, ignore_index, reduction)
    unsafe = None if compiling else foreign(logits, targets)
    if impl == "auto":
        runs = runs_here_const(logits.is_cuda) if compiling else triton_usable(logits) is None and not unsafe
        impl = "triton" if runs else "torch"
    if impl == "torch":
        return cross_entropy_ref_fp32(logits, targets, ignore_index, reduction)
    if compiling:
        require_const(logits.is_cuda, "cross_entropy(impl='triton')")
        return cross_entropy_compiled(logits, targets, ignore_index, reduction)
    why_not = unsafe or triton_usable(logits)
    if why_not:
        raise ValueError(f"cross_entropy(impl='triton'): {why_not}; use impl='torch' or impl='auto'")
    if torch.is_grad_enabled() and logits.requires_grad:
        return _cross_entropy_autograd(logits, targets, ignore_index, reduction)
    # No gradient to record: skip autograd.Function's bookkeeping.
    return forward_no_grad(logits, targets, ignore_index, reduction)
