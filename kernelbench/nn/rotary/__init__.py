"""Rotary position embeddings on kernelbench's Triton kernel, one concern per file:

- ``module.py``: ``apply_rotary``, ``apply_rotary_`` (in place), the PyTorch reference ``rotary_ref``;
- ``function.py``: the autograd Function and the ops torch.compile sees;
- ``host.py``: the launch configuration (``RotaryConfig``), checks, ``forward`` / ``backward``;
- ``kernels.py``: the Triton kernel.
"""

from .host import LAYOUTS, STYLES, SUPPORTED_DTYPES, RotaryConfig, rotary_config
from .module import AUTOSELECT, IMPLS, apply_rotary, apply_rotary_, rotary_ref, triton_usable

__all__ = ["AUTOSELECT", "IMPLS", "LAYOUTS", "STYLES", "SUPPORTED_DTYPES", "RotaryConfig", "apply_rotary",
           "apply_rotary_", "rotary_config", "rotary_ref", "triton_usable"]
