"""Optimizers built on kernelbench's Triton kernels, usable without the harness.

    from kernelbench.optim import TritonAdamW, AdamMini

Names resolve lazily so that importing this package does not define Triton kernels before a
caller has had the chance to set ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TritonAdamW": "kernelbench.optim.adamw",
    "AdamMini": "kernelbench.optim.adam_mini",
    "Adafactor8bit": "kernelbench.optim.adafactor",
    "Muon": "kernelbench.optim.muon",
    "ShardedAdamW": "kernelbench.optim.sharded_adamw",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernelbench.optim' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
