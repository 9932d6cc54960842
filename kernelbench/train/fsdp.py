"""``kernelbench parity OP --fsdp`` and ``kernelbench train OP --fsdp``: the launching side.

Both start :mod:`kernelbench.train.fsdp_worker` on ``nproc`` ranks through
:func:`kernelbench.distributed.launch.launch` (ranks end with the caller however it ends) and turn
what rank 0 returns into the rows and logs of an ordinary report: parity rows with per-tensor
detail, and training logs the caller judges against the band as on one device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..distributed.launch import launch
from ..harness.rows import ERROR, SKIPPED, Row
from ..models import CONFIGS
from ..ops import get_op
from ..ops.base import UsageError, unknown_name_error
from ..ops.optimizer_op import OptimizerOp

WORKER = "kernelbench.train.fsdp_worker"
DEFAULT_MODEL = {"cuda": "llama-7m", "cpu": "llama-tiny"}


def check_nproc(nproc: int, device: str) -> None:
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: must be at least 1")
    if device == "cuda":
        import torch

        if nproc > torch.cuda.device_count():
            raise UsageError(f"--nproc {nproc} needs {nproc} GPUs; {torch.cuda.device_count()} visible")


def _optimizer_op(name: str) -> OptimizerOp:
    op = get_op(name)
    if not isinstance(op, OptimizerOp):
        from ..ops import load_all

        accepted = sorted(o.name for o in load_all().values() if isinstance(o, OptimizerOp))
        raise UsageError(f"--fsdp shards an optimizer's parameters; op '{op.name}' is not an optimizer op "
                         f"(accepted: {', '.join(accepted)})")
    return op


def parity_candidates(op: OptimizerOp, names: Sequence[str] | None, tags: dict[str, str]) -> list[str]:
    """The candidates checked: those named, else every one that computes the op's algorithm."""
    if names:
        for n in names:
            if n not in op.candidates:
                raise unknown_name_error(f"candidate of op '{op.name}'", n, op.candidates)
        return list(names)
    return [c.name for c in op.candidates.values()
            if c.parity and all(c.tags.get(k) == v for k, v in tags.items())]


def parity_rows(op_name: str, *, device: str, nproc: int, folder: Path, candidates: Sequence[str] | None = None,
                tags: dict[str, str] | None = None, models: Sequence[str] | None = None, steps: int = 3,
                seed: int = 0, detail: str = "worst", atol: float | None = None, rtol: float | None = None,
                on_progress=None) -> list[dict[str, Any]]:
    """Every candidate of ``op_name`` under FSDP2 on ``nproc`` ranks against itself unsharded."""
    from .fsdp_worker import mode_name

    op = _optimizer_op(op_name)
    check_nproc(nproc, device)
    models = list(models or [DEFAULT_MODEL[device]])
    for m in models:
        if m not in CONFIGS:
            raise unknown_name_error("model (under --fsdp, -w names a kernelbench.models config)", m, CONFIGS)
    names = parity_candidates(op, candidates, tags or {})
    rows: list[dict[str, Any]] = []
    for model in models:
        runnable = []
        for name in names:
            unmet = op.candidates[name].requires.unmet(device)
            if unmet:
                rows.append(Row(op.name, model, mode_name(nproc), name, "parity", None, "", SKIPPED,
                                message=unmet).as_dict())
            else:
                runnable.append(name)
        if not runnable:
            continue
        if on_progress:
            on_progress(f"{op.name} under FSDP2 on {nproc} ranks, {model}: {', '.join(runnable)}")
        args = ["parity", "--op", op.name, "--model", model, "--candidates", ",".join(runnable), "--steps", steps,
                "--seed", seed, "--detail", detail]
        args += ["--atol", atol] if atol is not None else []
        args += ["--rtol", rtol] if rtol is not None else []
        try:
            result = launch(WORKER, nproc, [str(a) for a in args], folder / f"fsdp-parity-{op.name}-{model}.json",
                            cpu=device == "cpu", name=f"{op.name} under --fsdp")
        except RuntimeError as exc:
            rows += [Row(op.name, model, mode_name(nproc), name, "parity", None, "", ERROR,
                         message=str(exc)[-2000:]).as_dict() for name in runnable]
            continue
        for item in result["results"]:
            if "error" in item:
                rows.append(Row(op.name, model, mode_name(nproc), item["candidate"], "parity", None, "", ERROR,
                                message=item["error"]).as_dict())
            else:
                rows.append(item["row"])
    return rows


def train_logs(op_label: str, runs: Sequence[tuple[str, int]], settings, folder: Path, *,
               unsharded: bool = False) -> dict[tuple[str, int], Any]:
    """The runs ``(candidate, order seed)`` of ``kernelbench train`` with the model under FSDP2 on
    ``settings.fsdp_nproc`` ranks, in one launch: a RunLog, or the error text, by run. ``unsharded``:
    the model whole, on one rank that sees one GPU."""
    import dataclasses
    import json

    import numpy as np

    from .loop import RunLog

    nproc = 1 if unsharded else settings.fsdp_nproc
    check_nproc(nproc, settings.device)
    if settings.batch % nproc:
        raise UsageError(f"--batch {settings.batch} does not split over --nproc {nproc} ranks; pass a multiple")
    args = ["train", "--op", op_label, "--model", settings.model,
            "--candidates", ",".join(dict.fromkeys(name for name, _ in runs)),
            "--settings", json.dumps(dataclasses.asdict(settings)),
            "--runs", ",".join(f"{name}:{seed}" for name, seed in runs)] + (["--unsharded"] if unsharded else [])
    suffix = "unsharded" if unsharded else f"fsdp-{nproc}"
    result = launch(WORKER, nproc, args, folder / f"train-{op_label}-{suffix}.json", cpu=settings.device == "cpu",
                    timeout_s=3600.0, name=f"train {op_label} under --fsdp", one_gpu=unsharded)
    logs: dict[tuple[str, int], Any] = {}
    for item in result["results"]:
        key = (item["candidate"], item["order_seed"])
        if "error" in item:
            logs[key] = item["error"]
            continue
        log = dict(item["log"])
        for name in ("losses", "grad_norms", "step_ms"):
            if log[name] is not None:
                log[name] = np.array([math.nan if v is None else v for v in log[name]], dtype=np.float64)
        logs[key] = RunLog(**log)
    return logs
