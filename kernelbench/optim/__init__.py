"""Optimizers built on kernelbench's Triton kernels, usable without the harness.

    from kernelbench.optim import TritonAdamW, AdamMini

Names resolve lazily so that importing this package does not define Triton kernels before a
caller has had the chance to set ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import importlib
from typing import Any

# exported name: (module, name there)
_EXPORTS = {
    "TritonAdamW": ("kernelbench.optim.adamw.optimizer", "TritonAdamW"),
    "AdamMini": ("kernelbench.optim.adam_mini.optimizer", "AdamMini"),
    "AdamMiniLaunchConfig": ("kernelbench.optim.adam_mini.host", "LaunchConfig"),
    "AdamMiniReference": ("kernelbench.optim.adam_mini.reference", "AdamMiniReference"),
    "Adafactor8bit": ("kernelbench.optim.adafactor.optimizer", "Adafactor8bit"),
    "Muon": ("kernelbench.optim.muon", "Muon"),
    "ShardedAdamW": ("kernelbench.optim.sharded_adamw", "ShardedAdamW"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernelbench.optim' has no attribute '{name}'")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
