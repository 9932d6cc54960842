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
"""

from __future__ import annotations

from ..crossentropy.kernels import _xent_bwd_kernel, _xent_fwd_kernel, _xent_reduce_kernel

__all__ = ["_xent_bwd_kernel", "_xent_fwd_kernel", "_xent_reduce_kernel"]
