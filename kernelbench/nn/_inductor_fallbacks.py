"""Inductor fallbacks for kernelbench's custom ops, registered before Inductor lowers them.

Inductor runs an op it has no lowering for through a fallback it creates on first sight ("implicit
fallback"). Before creating it, torch before 2.13 formats every argument's IR for a log line even
with that log off; for our ops inside a bf16 Llama graph that text takes minutes to build
(results/2026-11-24-h100-gpu-tests/README.md). Registering the fallback up front (same layout
constraint, from the op's tags) skips that.

The fallback calls a twin of the op: the same schema and Python body behind a bare
``torch.library`` kernel, with no Python autograd kernel and none of torch.library's wrappers
(output-alias check, Dynamo guard). A compiled graph calls the op without grad, so the twin does
the same work; in a compiled training graph it costs the host about half as much per call
(results/2026-11-24-h100-model-step/README.md). The public op keeps its fake and autograd formula
for tracing.

Inductor's lowering table is private API: where it differs, nothing is registered and Inductor's
own implicit fallback applies as before.
"""

from __future__ import annotations

import sys

import torch

TWIN_NAMESPACE = "kernelbench_inductor"

_ops: list = []  # (op, body): body None registers the op itself as its fallback
_registered = 0  # how many of _ops have been looked at
_twin_library: torch.library.Library | None = None


def declare(op, body=None) -> None:
    """An op (``OpOverload``) to give an explicit fallback once Inductor is loaded; ``body``: the
    op's Python implementation, which the fallback then calls through a twin op."""
    _ops.append((op, body))


def twin(op, body):
    """The twin of ``op``: ``kernelbench_inductor::<name>`` with the same schema, ``body`` as its
    kernel for every device, and the public op (its fake) as its fake."""
    global _twin_library
    if _twin_library is None:
        _twin_library = torch.library.Library(TWIN_NAMESPACE, "DEF")
    name = op._schema.name.split("::")[1]
    packet = getattr(torch.ops, TWIN_NAMESPACE)
    if not hasattr(packet, name):
        schema = str(op._schema)
        _twin_library.define(name + schema[schema.index("("):])
        _twin_library.impl(name, body, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{TWIN_NAMESPACE}::{name}", lambda *args: op(*args), lib=_twin_library)
    return getattr(packet, name).default


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

        for op, body in pending:
            if op in lowering.lowerings:
                continue
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            if body is None:
                lowering.make_fallback(op, layout_constraint=constraint)
                continue
            # What make_fallback does, with the twin as the kernel the fallback calls.
            lowering.add_needs_realized_inputs(op)
            lowering.add_layout_constraint(op, constraint)
            lowering.register_lowering(op, type_promotion_kind=None)(
                lowering.fallback_handler(twin(op, body), add_to_fallback_set=False))
    except (AttributeError, ImportError, TypeError):  # another torch's private API
        pass
