"""Linear cross-entropy (a language model's head and its loss, fused chunk by chunk) on
kernelbench's cross-entropy kernels, one concern per file:

- ``module.py``: ``linear_cross_entropy``, ``LinearCrossEntropyLoss`` and the reference
  ``linear_cross_entropy_ref``;
- ``function.py``: the autograd Function and the op torch.compile sees;
- ``host.py``: checks, the chunk plan (``plan_chunk_rows``), ``forward`` / ``backward``;
- ``kernels.py``: the Triton kernels it launches (cross-entropy's).
"""

from .host import (
    FUSE_MIN_LOGITS,
    LOGITS_BUDGET_BYTES,
    MIN_CHUNK_ROWS,
    REDUCTIONS,
    ROWS_PER_HIDDEN,
    SUPPORTED_DTYPES,
    fusing_pays,
    plan_chunk_rows,
)
from .module import LinearCrossEntropyLoss, linear_cross_entropy, linear_cross_entropy_ref, triton_usable

__all__ = ["FUSE_MIN_LOGITS", "LOGITS_BUDGET_BYTES", "MIN_CHUNK_ROWS", "REDUCTIONS", "ROWS_PER_HIDDEN",
           "SUPPORTED_DTYPES", "LinearCrossEntropyLoss", "fusing_pays", "linear_cross_entropy",
           "linear_cross_entropy_ref", "plan_chunk_rows", "triton_usable"]
