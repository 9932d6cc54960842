"""Cross-entropy of logits against class indices on kernelbench's Triton kernels, one concern per file:

- ``module.py``: ``cross_entropy`` and the reference ``cross_entropy_ref_fp32``;
- ``function.py``: the autograd Function and the op torch.compile sees;
- ``host.py``: the launch configuration (``XentConfig``), checks, ``forward`` / ``backward``;
- ``kernels.py``: the Triton kernels.
"""

from .host import REDUCTIONS, SUPPORTED_DTYPES, XentConfig, bwd_config, fwd_config
from .module import IMPLS, cross_entropy, cross_entropy_ref_fp32, triton_usable

__all__ = ["IMPLS", "REDUCTIONS", "SUPPORTED_DTYPES", "XentConfig", "bwd_config", "cross_entropy",
           "cross_entropy_ref_fp32", "fwd_config", "triton_usable"]
