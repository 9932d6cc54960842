"""Every op module in this package registers itself on import; this imports them all."""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Candidate, Op, Requires, Tolerance, UsageError, Workload, unknown_name_error

_INFRASTRUCTURE = {"base", "function_op", "optimizer_op", "optim_workloads"}


def load_all() -> dict[str, Op]:
    """Import every op module (discovery is automatic: add a file, it is found)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _INFRASTRUCTURE and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return REGISTRY


def get_op(name: str) -> Op:
    ops = load_all()
    if name not in ops:
        raise unknown_name_error("op", name, ops)
    return ops[name]


__all__ = ["REGISTRY", "Candidate", "Op", "Requires", "Tolerance", "UsageError", "Workload", "get_op", "load_all"]
