"""RMSNorm on kernelbench's Triton kernels, one concern per file:

- ``module.py``: ``rms_norm``, ``RMSNorm`` (a drop-in for ``torch.nn.RMSNorm``), the fp32 reference;
- ``function.py``: the autograd Function and the ops torch.compile sees;
- ``host.py``: launch configurations (``FwdConfig``, ``BwdConfig``), plans, ``forward`` / ``backward``;
- ``fast_path.py``: launch-bound eager calls (``kernelbench.fast_launch`` switches it off);
- ``kernels.py``: the Triton kernels.
"""

from .host import MAX_N, SUPPORTED_DTYPES, BwdConfig, FwdConfig, bwd_config, fwd_config, triton_usable
from .module import AUTOSELECT, IMPLS, RMSNorm, rms_norm, rmsnorm_ref_fp32

__all__ = ["AUTOSELECT", "IMPLS", "MAX_N", "SUPPORTED_DTYPES", "BwdConfig", "FwdConfig", "RMSNorm", "bwd_config",
           "fwd_config", "rms_norm", "rmsnorm_ref_fp32", "triton_usable"]
