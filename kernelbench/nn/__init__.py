"""Drop-in modules and functions on kernelbench's Triton kernels.

    from kernelbench.nn import RMSNorm, apply_rotary

Names resolve lazily (see kernelbench.optim for why).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RMSNorm": "kernelbench.nn.rmsnorm",
    "rms_norm": "kernelbench.nn.rmsnorm",
    "apply_rotary": "kernelbench.nn.rotary",
    "apply_rotary_": "kernelbench.nn.rotary",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernelbench.nn' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
