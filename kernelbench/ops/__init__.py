"""The registry: every op module in this package registers itself on import, and installed
plugins (the ``kernelbench.plugins`` entry points, see :mod:`kernelbench.ops.plugins`) add theirs."""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Candidate, Op, Requires, Tolerance, UsageError, Workload, unknown_name_error
from .function_op import FunctionOp
from .optimizer_op import OptimizerOp
from .shapes import Dims

_INFRASTRUCTURE = {"base", "function_op", "launched_op", "optimizer_op", "optim_workloads", "plugins", "shapes"}

# Op modules that failed to import, by module name: one broken op must not take the CLI down
# with it; `kernelbench list` shows these, and a test requires it to stay empty.
LOAD_ERRORS: dict[str, str] = {}
_builtin_loaded = False


def load_builtin() -> dict[str, Op]:
    """Import every op module of kernelbench (discovery is automatic: add a file, it is found)."""
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        for module in pkgutil.iter_modules(__path__):
            if module.name in _INFRASTRUCTURE or module.name.startswith("_"):
                continue
            try:
                importlib.import_module(f"{__name__}.{module.name}")
            except Exception as exc:  # reported, not hidden
                LOAD_ERRORS[module.name] = f"{type(exc).__name__}: {exc}"
    return REGISTRY


def load_all() -> dict[str, Op]:
    """kernelbench's ops, then the installed plugins' (each loaded once per process)."""
    from . import plugins

    load_builtin()
    plugins.load_entry_points()
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
    "Dims",
    "FunctionOp",
    "Op",
    "OptimizerOp",
    "Requires",
    "Tolerance",
    "UsageError",
    "Workload",
    "get_op",
    "load_all",
    "load_builtin",
]
