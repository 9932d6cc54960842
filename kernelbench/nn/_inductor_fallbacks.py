"""Inductor fallbacks for kernelbench's ops, registered before Inductor lowers them. Inductor sees
the ops themselves only where they are opaque custom ops (the Triton interpreter, a torch without
``triton_op``); elsewhere their Triton launches are traced and the fallbacks go unused.

Inductor runs an op it has no lowering for through a fallback it creates on first sight ("implicit
fallback"). Before creating it, torch before 2.13 formats every argument's IR for a log line even
with that log off; for our ops inside a bf16 Llama graph that text takes minutes to build
(results/2026-11-24-h100-gpu-tests/README.md). Registering the very fallback Inductor would create
(same layout constraint, from the op's tags) skips that.

Inductor's lowering table is private API: where it differs, nothing is registered and Inductor's
own implicit fallback applies as before.
"""

from __future__ import annotations

import sys

_ops: list = []
_registered = 0  # how many of _ops have been looked at


def declare(*ops) -> None:
    """Ops (``OpOverload``) to give an explicit fallback once Inductor is loaded."""
    _ops.extend(ops)


def ensure_registered() -> None:
    """Register the declared ops' fallbacks if Inductor's lowering is loaded and has none yet.

    Called from the ops' fake implementations: they run while a graph with our ops is traced,
    and Inductor's lowering module is loaded by then whenever Inductor compiles that graph."""
    global _registered
    if _registered == len(_ops):
        return
    lowering = sys.modules.get("torch._inductor.lowering")
    if lowering is None:
        return
    pending, _registered = _ops[_registered:], len(_ops)
    try:
        from torch._library.utils import get_layout_constraint_tag

        for op in pending:
            if op not in lowering.lowerings:
                tag = get_layout_constraint_tag(op, with_default=True)
                lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag))
    except (AttributeError, ImportError, TypeError):  # another torch's private API
        pass
