"""Checks that a candidate's result is a result, for parity and for the timed calls.

A kernel can look correct, or fast, without computing anything: by returning zeros where the
tolerance is loose, returning its input, returning what it computed for earlier inputs, finishing
its work on a side stream after the call returned, or overwriting its inputs. What is checked here,
through the optional parts of the :class:`~kernelbench.ops.base.Case` protocol:

- the inputs (``case.input_tensors()``) are as they were before the call, except those the op
  declares as in-place outputs (``case.inplace_inputs``);
- for pure cases (``case.pure``: the result depends on this call's inputs only), the results a
  consumer on the caller's stream would read right after the call (copied on that stream, before
  any synchronisation) equal those read after a device synchronisation;
- results are read after a device synchronisation;
- a result equal to one of its inputs, where the reference's differs from it, is named as such;
- a result that fails against this step's reference but matches the previous step's is named stale.

The all-zero baseline itself is part of every comparison (:data:`.parity.TRIVIAL_MARGIN`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .parity import TensorDiff


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())


@dataclass
class Call:
    """One observed call: its results (read after a synchronisation), the inputs as they were
    before it, and what the guards found."""

    tensors: dict[str, torch.Tensor]
    inputs_before: dict[str, torch.Tensor] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


def observe(case, device: str) -> Call:
    """Runs ``case.run()`` (after the caller's ``prepare``) under the guards that need no reference."""
    input_tensors = getattr(case, "input_tensors", None)
    before = {k: v.detach().clone() for k, v in input_tensors().items()} if input_tensors else {}
    case.run()
    on_stream = None
    if device == "cuda" and getattr(case, "pure", False):
        # Enqueued on the caller's stream right behind the call: what the next kernel there reads.
        on_stream = {k: v.detach().clone() for k, v in case.tensors().items()}
    synchronize(device)
    call = Call(case.tensors(), before)
    if on_stream is not None:
        late = [k for k, v in on_stream.items() if k in call.tensors and not _same(v, call.tensors[k])]
        if late:
            call.findings.append(
                f"{_names(late)} changed after the call returned: written on a stream the caller's stream does "
                "not wait for, so the next kernel on it reads unfinished results")
        # The allocator may hand these blocks to the next call's results: with this call's results
        # still in them, a later result written too late would read back as if it were on time.
        for copy in on_stream.values():
            copy.fill_(float("nan") if copy.is_floating_point() else -1)
    if before:
        allowed = getattr(case, "inplace_inputs", frozenset())
        after = input_tensors()
        modified = [k for k, v in before.items() if k not in allowed and k in after and not _same(v, after[k])]
        if modified:
            declared = f" (in-place outputs it declares: {', '.join(sorted(allowed))})" if allowed else ""
            call.findings.append(f"modified its input {_names(modified)}: the op declares no in-place output "
                                 f"there{declared}")
    return call


def passthrough(call: Call, diffs: dict[str, TensorDiff]) -> list[str]:
    """Failing results that are exactly one of the call's inputs (the input returned as the result)."""
    found = []
    for name, diff in diffs.items():
        if diff.passed:
            continue
        out = call.tensors.get(name)
        for in_name, value in call.inputs_before.items():
            if out is not None and _same(out.detach(), value):
                found.append(f"'{name}' is its input '{in_name}' returned unchanged, where the reference's differs")
                break
    return found


def stale(diffs: dict[str, TensorDiff], previous: dict[str, TensorDiff] | None) -> list[str]:
    """Results that fail against this step's reference but pass against the previous step's."""
    if not previous:
        return []
    names = [n for n, d in diffs.items() if not d.passed and n in previous and previous[n].passed]
    if not names:
        return []
    verb = "matches" if len(names) == 1 else "match"
    return [f"{_names(names)} {verb} the reference of the previous inputs, not of these: a cached or stale result"]


def clone_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


def _names(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)
