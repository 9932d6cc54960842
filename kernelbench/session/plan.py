"""Entries checked against the registry and turned into the harness's plan.

Checks run before torch is imported: an unknown name, a mode an op lacks or a candidate that a
tag contradicts is a UsageError naming what is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..ops import get_op
from ..ops.base import Op, UsageError, Workload, unknown_name_error
from ..ops.launched_op import LaunchedOp
from .request import Entry

if TYPE_CHECKING:
    from ..harness.runner import PlanItem


def resolve_workload(op: Op, name: str) -> Workload:
    """The workload an entry names (every entry's workload names are resolved here): one of the
    op's named workloads, else one written as a spec the op reads (``16384x4096:bf16`` for an op
    that declares its dimensions, ``model:NAME`` or a parameter-list file for an optimizer op)."""
    if name in op.workloads:
        return op.workloads[name]
    custom = op.custom_workload(name)
    if custom is not None:
        return custom
    error = unknown_name_error(f"workload of op '{op.name}'", name, op.workloads)
    forms = op.workload_forms()
    if forms:
        raise UsageError(f"{str(error).rstrip('.')}; or {forms}.")
    raise error


def check_sweep(op: Op, sweep: str, workloads: Sequence[str] | None) -> None:
    """A sweep the op can make around the one shape given (or its own example shape)."""
    if workloads and len(workloads) > 1:
        raise UsageError(f"--sweep takes at most one -w, the shape it varies; got {', '.join(workloads)}")
    op.sweep(sweep, workloads[0] if workloads else None, "cpu")


def _sweep(op: Op, entry: Entry, device: str) -> list[Workload]:
    texts = op.sweep(entry.sweep, entry.workloads[0] if entry.workloads else None, tier(device))
    return [resolve_workload(op, text) for text in texts]


def is_launched(entry: Entry) -> bool:
    """Whether the entry's op starts processes of its own (its candidates run in each launch)."""
    return isinstance(get_op(entry.op), LaunchedOp)


def check_entry(entry: Entry, *, parity: bool = False) -> None:
    """Every name the entry gives exists, the tags allow the named candidates, and a parity entry
    names at least one candidate that takes part in parity."""
    op = get_op(entry.op)
    if parity and isinstance(op, LaunchedOp):
        raise UsageError(op.not_a_case())
    op.select(entry.candidates, entry.tags)
    if entry.sweep is not None:
        check_sweep(op, entry.sweep, entry.workloads)
    else:
        for name in entry.workloads or []:
            resolve_workload(op, name)
    for mode in entry.modes or []:
        if mode not in op.modes():
            raise UsageError(f"op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")
    for name in entry.candidates or []:
        cand = op.get_candidate(name)
        for key, value in entry.tags.items():
            if cand.tags.get(key) != value:
                raise UsageError(f"-c {name} has {key}={cand.tags.get(key, '(none)')}, not --{key} {value}: "
                                 f"drop one of the two")
    if parity:
        _check_parity_candidates(entry)


def _check_parity_candidates(entry: Entry) -> None:
    """Candidates named for parity must include one that takes part in it (the reference and
    anchors computing something else are not checked)."""
    op = get_op(entry.op)
    names = entry.candidates
    if not names:
        return
    checked = [c.name for c in op.candidates.values() if c.parity and c.name != op.reference]
    if any(name in checked for name in names):
        return
    why = {name: ("the reference: the others are checked against it" if name == op.reference else
                  "an anchor computing something else, timed beside the others") for name in names}
    raise UsageError("no named candidate is checked for parity: " + "; ".join(f"'{n}' is {w}" for n, w in why.items())
                     + f". Checked candidates of '{op.name}': {', '.join(checked)}")


def tier(device: str) -> str:
    """The workload tier a device runs by default."""
    return "gpu" if device == "cuda" else "cpu"


def workload_names(entry: Entry, device: str) -> list[str]:
    """The entry's workloads, else its op's default ones for ``device``."""
    return [w.name for w in entry_workloads(get_op(entry.op), entry, device)]


def entry_workloads(op: Op, entry: Entry, device: str) -> list[Workload]:
    """The workloads an entry names, sweeps over, or leaves to the device's tier."""
    if entry.sweep is not None:
        return _sweep(op, entry, device)
    if entry.workloads:
        return [resolve_workload(op, name) for name in entry.workloads]
    return op.workloads_for(tier(device))


def plan(entries: Sequence[Entry], device: str, seed: int) -> list[PlanItem]:
    """The harness's plan for ``entries``: names resolved, the device's tier by default, every
    workload's seed moved by ``seed``."""
    from ..harness.runner import PlanItem

    items = []
    for e in entries:
        op = get_op(e.op)
        candidates = [c for c in op.select(e.candidates, e.tags) if c.name not in e.exclude]
        workloads = entry_workloads(op, e, device)
        if seed:
            workloads = [dataclasses.replace(w, seed=w.seed + seed) for w in workloads]
        modes = e.modes or list(op.default_modes())
        for mode in modes:
            if mode not in op.modes():
                raise UsageError(f"op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")
        if not workloads:
            raise UsageError(f"op '{op.name}' has no {tier(device)} workload; pass --workload (its workloads: "
                             f"{', '.join(op.workloads)})")
        items.append(PlanItem(op, candidates, workloads, modes))
    return items
