"""Drop-in modules and functions on kernelbench's Triton kernels.

    from kernelbench.nn import RMSNorm, apply_rotary, cross_entropy, patch_hf_model

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
    "silu_mul": "kernelbench.nn.swiglu",
    "cross_entropy": "kernelbench.nn.crossentropy",
    "patch_hf_model": "kernelbench.nn.hf_patch",
    "linear_cross_entropy": "kernelbench.nn.linear_crossentropy",
    "LinearCrossEntropyLoss": "kernelbench.nn.linear_crossentropy",
}
# The modules whose AUTOSELECT candidates impl="auto" times, by op name.
_AUTOSELECT_OPS = {"rmsnorm": "kernelbench.nn.rmsnorm", "rotary": "kernelbench.nn.rotary",
                   "swiglu": "kernelbench.nn.swiglu"}

__all__ = [*_EXPORTS, "autoselect_report"]


def autoselect_report(op: str, shape: tuple, dtype: Any, **options: Any) -> dict:
    """``kernelbench.nn.autoselect.autoselect_report`` for an op named "rmsnorm" (shape: the
    input's, (..., N); ``variant`` "residual" for the call with a residual add), "rotary" (shape:
    (B, Hq, Hk, S, D, rotary_dim); ``variant`` "<style>-<layout>", default "half-bhsd") or
    "swiglu" (shape: gate's); the options are that function's."""
    if op not in _AUTOSELECT_OPS:
        raise ValueError(f"autoselect: unknown op {op!r}; known: {', '.join(_AUTOSELECT_OPS)}")
    from .autoselect import autoselect_report as report

    return report(importlib.import_module(_AUTOSELECT_OPS[op]).AUTOSELECT, shape, dtype, **options)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernelbench.nn' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
