"""What ``kernelbench list`` shows: every op's candidates (their role, whether they run here and
why not, where they come from: kernelbench or a plugin) and workloads, named or written on the
command line, from the registry."""

from __future__ import annotations

import os
from typing import Any

from ..ops import load_all
from ..ops.base import UsageError
from .options import DEVICES, nvidia_device_present


def list_device(requested: str) -> str:
    """The device a listing judges for: no torch import and no CUDA probe unless asked for CUDA
    or an NVIDIA device node exists."""
    if requested not in DEVICES:
        raise UsageError(f"--device {requested}: accepted values are {', '.join(DEVICES)}")
    if requested == "cuda" or (requested == "auto" and nvidia_device_present()):
        from ..harness.runner import resolve_device

        return resolve_device(requested)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # what a CPU run sets before building kernels
    return "cpu"


def candidate_rows(device: str) -> list[dict[str, Any]]:
    rows = []
    for op in load_all().values():
        anchors = {op.anchor_for(name) for name in op.candidates} | {op.speed_anchor}
        for cand in op.candidates.values():
            role = ", ".join(r for r, on in (("reference", cand.name == op.reference),
                                              ("anchor", cand.name in anchors),
                                              ("baseline", cand.baseline)) if on)
            rows.append({"op": op.name, "candidate": cand.name,
                         "tags": ", ".join(f"{k}={v}" for k, v in cand.tags.items()),
                         "role": role, "runs here": op.availability(cand, device), "source": cand.source,
                         "what": cand.doc})
    return rows


def workload_rows() -> list[dict[str, Any]]:
    return [{"op": op.name, "workload": w.name, "tier": w.tier, "modes": ", ".join(op.modes()), "seed": w.seed,
             "note": w.note}
            for op in load_all().values() for w in op.workloads.values()]


def workload_form_rows() -> list[dict[str, Any]]:
    """How -w may write each op's workloads besides their names, and what --sweep varies."""
    return [{"op": op.name, "-w also takes": op.workload_forms(),
             "--sweep": f"one of {', '.join(op.dims.names)}" if getattr(op, "dims", None) else ""}
            for op in load_all().values() if op.workload_forms()]
