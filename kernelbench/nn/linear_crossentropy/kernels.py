"""The Triton kernels linear cross-entropy launches: cross-entropy's own (``nn/crossentropy``),
run on one chunk of logits at a time. Host code and chunk planning: ``host.py``.

Math, for hidden rows h (N, H), weight W (V, H) and targets t, chunk by chunk over the rows:

    logits = h_c @ W.T                          (cuBLAS, in the input dtype; one chunk's buffer)
    lse    = log(sum_j exp(logits_j))           (``_xent_fwd_kernel``, fp32 inside)
    loss  += sum over the chunk of lse - logits_t   (0 for rows whose target is ignore_index)
    dlogits_j = (exp(logits_j - lse) - [j == t]) * g    (``_xent_bwd_kernel``, into the buffer)
    dh_c   = dlogits @ W,   dW += dlogits.T @ h_c    (cuBLAS)

g = 1 / n_valid for "mean" (n_valid: the rows not ignored in the whole batch, counted on the
device), 1 for "sum"; the backward scales dh and dW by the upstream gradient.

- ``_scale_unless_one_kernel``: that scaling in place, where the graph is not kept; every program
  reads the upstream gradient and, where it is 1 (``loss.backward()``), touches nothing, so the
  common step skips a pass over dW (V x H: 1 GiB at 128k x 4096 in bf16).
"""

from __future__ import annotations

from .._triton_support import tl, triton
from ..crossentropy.kernels import _xent_bwd_kernel, _xent_fwd_kernel, _xent_reduce_kernel

__all__ = ["_scale_unless_one_kernel", "_xent_bwd_kernel", "_xent_fwd_kernel", "_xent_reduce_kernel"]


@triton.jit
def _scale_unless_one_kernel(
    x_ptr,  # (n,) contiguous, the gradient's dtype; scaled in place
    g_ptr,  # () the upstream gradient, ACC
    n,
    BLOCK: tl.constexpr,
    ACC: tl.constexpr,
):
    g = tl.load(g_ptr).to(ACC)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < tl.where(g != 1.0, n, 0)  # no element at all where g is 1
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # As torch's ``x * g.to(x.dtype)``: g rounded to x's dtype, the product in ACC, rounded once.
    g_x = g.to(x_ptr.dtype.element_ty).to(ACC)
    tl.store(x_ptr + offs, (x.to(ACC) * g_x).to(x_ptr.dtype.element_ty), mask=mask)
