"""pytest helpers for kernel authors: the harness's parity check and training band as assertions.

    from kernelbench.testing import assert_parity, assert_trains_like

    def test_my_rmsnorm_matches_the_reference():
        assert_parity("rmsnorm", "my-triton", workloads=["64x256:fp32", "1x760-fp32"], steps=2)

    def test_my_rmsnorm_trains_like_torchs():
        assert_trains_like("rmsnorm", "my-triton", steps=8)

Both run on the GPU when one is visible, else on the CPU, where Triton kernels run in the Triton
interpreter (``TRITON_INTERPRET=1`` is set here if unset; it must be set before the module that
defines the kernels is imported, so a test suite sets it in its conftest.py). A candidate that
cannot run on the device (it needs CUDA, a package) skips the test, saying why. The op and the
candidate are given by name, or as the ``Op`` and the factory ``@op.candidate`` decorated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from .harness.rows import ERROR, FAIL, PASS, SKIPPED
from .ops import Candidate, Op, get_op

__all__ = ["assert_parity", "assert_trains_like"]

# Tensors listed in a failure, worst first: enough to see the pattern, short enough to read.
SHOWN_TENSORS = 5


def _device(device: str | None) -> str:
    from .harness.runner import resolve_device

    return resolve_device(device or "auto")


def _op(op: str | Op) -> Op:
    return op if isinstance(op, Op) else get_op(op)


def _candidate(op: Op, candidate: str | Candidate | Callable[..., Any]) -> Candidate:
    if isinstance(candidate, Candidate):
        return candidate
    if isinstance(candidate, str):
        return op.get_candidate(candidate)
    for cand in op.candidates.values():
        if cand.build is candidate:
            return cand
    raise ValueError(f"{candidate!r} is not a candidate factory registered on op '{op.name}'")


def _skip(reason: str) -> None:
    import pytest

    pytest.skip(reason)


def assert_parity(op: str | Op, candidate: str | Candidate | Callable[..., Any], *,
                  workloads: Sequence[str] | str | None = None, steps: int = 2, modes: Sequence[str] | None = None,
                  device: str | None = None, atol: float | None = None, rtol: float | None = None) -> list[dict]:
    """The harness's parity check of ``candidate`` against the op's reference: ``steps`` fresh
    input draws (or optimizer steps) per workload and mode, every result tensor compared in fp64
    with the op's tolerances (``atol`` / ``rtol`` override them), and the guards (inputs left
    unmodified, results that beat an all-zero output, ...). ``workloads``: names or shapes
    (``"64x256:fp32"``), default the op's CPU-sized ones; ``modes``: default all of the op's.

    Raises AssertionError listing each failing check and its worst tensors; returns the rows."""
    from .harness.runner import PlanItem, run_parity
    from .session.plan import resolve_workload

    the_op = _op(op)
    cand = _candidate(the_op, candidate)
    if not cand.parity or cand.name == the_op.reference:
        raise ValueError(f"{the_op.name}/{cand.name} is not checked for parity (the reference, or an anchor "
                         "computing something else)")
    dev = _device(device)
    unmet = cand.requires.unmet(dev)
    if unmet:
        _skip(f"{the_op.name}/{cand.name} cannot run on {dev} here: {unmet}")
    names = [workloads] if isinstance(workloads, str) else list(workloads or [])
    chosen = [resolve_workload(the_op, w) for w in names] if names else the_op.workloads_for("cpu")
    if not chosen:
        raise ValueError(f"op '{the_op.name}' has no CPU-sized workload: pass workloads=[...]")
    modes = list(modes or the_op.default_modes())
    for mode in modes:
        if mode not in the_op.modes():
            raise ValueError(f"op '{the_op.name}' has no mode '{mode}'; modes: {', '.join(the_op.modes())}")
    rows = _Rows()
    run_parity([PlanItem(the_op, [cand], chosen, modes)], dev, rows, steps=steps, atol=atol, rtol=rtol,
               detail="full")
    checks = [r for r in rows.rows if r["metric"] == "parity"]
    bad = [r for r in checks if r["status"] != PASS]
    if bad or not checks:
        raise AssertionError(_parity_report(the_op, cand, dev, steps, rows.rows, bad))
    return rows.rows


class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)


def _parity_report(op: Op, cand: Candidate, device: str, steps: int, rows: list[dict], bad: list[dict]) -> str:
    lines = [f"parity of {op.name}/{cand.name} on {device} ({steps} step(s)) failed:"]
    if not bad:
        lines.append("  no check ran")
    for check in bad:
        where = (check["workload"], check["mode"])
        lines.append(f"  {where[0]} {where[1]}: {check['status']}: {check['message']}")
        per_tensor: dict[str, dict] = {}
        for r in rows:
            if (r["workload"], r["mode"]) == where and r["tensor"] and r["metric"].startswith("parity_"):
                entry = per_tensor.setdefault(r["tensor"], {"status": r["status"], "tolerance": r["message"]})
                entry[r["metric"]] = r["value"]
        ranked = sorted(per_tensor.items(),
                        key=lambda kv: (kv[1]["status"] == PASS, -_num(kv[1].get("parity_rel_fro"))))
        for tensor, m in ranked[:SHOWN_TENSORS]:
            first = m.get("parity_first_failed_step")
            lines.append(
                f"    {tensor}: {m['status']}; max abs {_fmt(m.get('parity_max_abs'))}, max rel "
                f"{_fmt(m.get('parity_max_rel'))}, rel Frobenius {_fmt(m.get('parity_rel_fro'))}, "
                f"{_fmt(m.get('parity_n_outside'))} elements outside ({m['tolerance']})"
                + (f", first failed at step {_fmt(first)}" if first is not None else ""))
        if len(ranked) > SHOWN_TENSORS:
            lines.append(f"    ... {len(ranked) - SHOWN_TENSORS} more tensors")
    return "\n".join(lines)


def _num(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return float("inf") if value != value else value


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e6):
        return str(int(value))
    return f"{value:.3g}"


def assert_trains_like(op: str | Op, candidate, *, steps: int = 20, model: str | None = None,
                       device: str | None = None, batch: int | None = None, seq: int | None = None,
                       ref_seeds: int | None = None, rtol: float | None = None, lr: float | None = None,
                       seed: int = 0):
    """``kernelbench train``'s verdict as an assertion: a small Llama-style model (``model``, a
    kernelbench.models config; default llama-tiny on the CPU, llama-7m on a GPU) is trained with
    the op's reference under ``ref_seeds`` data orders, whose spread (widened by ``rtol``) is the
    band (both default to ``kernelbench train``'s), and then with ``candidate``, from the same
    weights and batches; the candidate's final loss must lie in the band. An optimizer op's
    candidate is the optimizer; a layer op's (one that declares its ``model_layer``: rmsnorm,
    rotary, swiglu, cross-entropy) replaces that layer of torch's layers. ``candidate`` may also
    be a ``TrainCandidate`` (e.g. ``kernelbench.train.with_changes(reference, ...)``).

    Raises AssertionError with the final loss, the band and the first step outside it; returns
    the TrainResult."""
    from .train import TrainCandidate, TrainSettings, layer_ops, resolve, train

    the_op = _op(op)
    dev = _device(device)
    settings = TrainSettings.defaults(dev, model=model, steps=steps, batch=batch, seq=seq, seed=seed, lr=lr,
                                      rtol=rtol, ref_seeds=ref_seeds)
    config = settings.validate()
    reference_name = "torch" if the_op.name in layer_ops() else the_op.reference
    if isinstance(candidate, TrainCandidate):
        chosen = [resolve(the_op.name, config, lr=lr, names=[reference_name])[0], candidate]
    else:
        name = candidate if isinstance(candidate, str) else _candidate(the_op, candidate).name
        if name == reference_name:
            raise ValueError(f"'{name}' is the reference of op '{the_op.name}' under train: it makes the band")
        chosen = resolve(the_op.name, config, lr=lr, names=[name])
        chosen = [chosen[0]] + [c for c in chosen[1:] if c.name == name]
    judged = chosen[-1]
    unmet = judged.requires.unmet(dev)
    if unmet:
        _skip(f"{the_op.name}/{judged.name} cannot train on {dev} here: {unmet}")
    with tempfile.TemporaryDirectory(prefix="kernelbench-train-") as folder:
        result = train(the_op.name, chosen, settings, _Rows(), folder)
    outcome = next((o for o in result.outcomes if o.name == judged.name), None)
    what = f"{the_op.name}/{judged.name} ({settings.model}, {settings.steps} steps, {dev})"
    if outcome is None or outcome.status in (FAIL, ERROR, SKIPPED):
        reference = result.outcomes[0] if result.outcomes else None
        why = outcome.message if outcome is not None else "it was not trained"
        if result.band is None and reference is not None:
            why = f"no band: {reference.message}"
        raise AssertionError(f"{what} did not train like the reference: {why}")
    return result

