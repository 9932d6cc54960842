"""Every op module in this package registers itself on import; this imports them all."""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Candidate, Op, Requires, Tolerance, UsageError, Workload, unknown_name_error

_INFRASTRUCTURE = {"base", "function_op", "launched_op", "optimizer_op", "optim_workloads"}

# Op modules that failed to import, by module name: one broken op must not take the CLI down
# with it; `kernelbench list` shows these, and a test requires it to stay empty.
LOAD_ERRORS: dict[str, str] = {}


def load_all() -> dict[str, Op]:
    """Import every op module (discovery is automatic: add a file, it is found)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name in _INFRASTRUCTURE or module.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{__name__}.{module.name}")
        except Exception as exc:  # reported, not hidden
            LOAD_ERRORS[module.name] = f"{type(exc).__name__}: {exc}"
    return REGISTRY


def get_op(name: str) -> Op:
    ops = load_all()
    if name not in ops:
        raise unknown_name_error("op", name, ops)
    return ops[name]


__all__ = [
    "LOAD_ERRORS",
    "REGISTRY",
    "Candidate",
    "Op",
    "Requires",
    "Tolerance",
    "UsageError",
    "Workload",
    "get_op",
    "load_all",
]
