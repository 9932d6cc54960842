"""The SwiGLU activation ``silu(gate) * up`` on kernelbench's Triton kernels, one concern per file:

- ``module.py``: ``silu_mul`` and the fp32 reference ``silu_mul_ref_fp32``;
- ``function.py``: the autograd Function and the ops torch.compile sees;
- ``host.py``: the launch configuration (``SiluMulConfig``), checks, ``forward`` / ``backward``;
- ``kernels.py``: the Triton kernels.
"""

from .host import SUPPORTED_DTYPES, SiluMulConfig, default_config
from .module import AUTOSELECT, IMPLS, silu_mul, silu_mul_ref_fp32, triton_usable

__all__ = ["AUTOSELECT", "IMPLS", "SUPPORTED_DTYPES", "SiluMulConfig", "default_config", "silu_mul",
           "silu_mul_ref_fp32", "triton_usable"]
