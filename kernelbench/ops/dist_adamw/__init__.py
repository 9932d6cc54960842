"""dist-adamw: a data-parallel AdamW step on N ranks, ZeRO-1 sharded against all-reduce + fused.

Both candidates run in every launch (:mod:`kernelbench.ops.dist_adamw.worker` on each rank,
started through ``torch.distributed.run`` by :mod:`kernelbench.distributed.launch`), from the
same params and per-rank gradients, so their times are interleaved rep by rep and their params
compared after one step (the ``parity`` row, with the op's fp32 tolerance). On GPUs each rank
takes one GPU and NCCL; without them the ranks are CPU processes on Gloo with the Triton
interpreter: a run-through, not a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbench.distributed.launch import launch
from kernelbench.harness.rows import ERROR, FAIL, NOT_MEASURED, OK, PASS, Row

from .. import optim_workloads
from ..base import Requires, Tolerance, UsageError, Workload
from ..launched_op import DEFAULT_NPROC, LaunchedOp, OpOption, bucket_mb_option, nproc_option

WORKER = f"{__name__}.worker"
# Interpreter-sized on CPU ranks (the run takes seconds); the model-sized step on GPUs.
DEFAULT_WORKLOADS = {"gpu": ["model-370m"], "cpu": ["model-tiny"]}
DEFAULT_STEPS = {"cuda": 50, "cpu": 10}
METRICS = ("sharded_step", "sharded_comm", "sharded_update", "allreduce_fused_step", "allreduce", "fused_adamw")
HYPERPARAMS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
# What each of the worker's timings is, as (candidate, what) rows of a kernelbench report.
_METRIC_ROWS = {
    "sharded_step": ("sharded-zero1", "step: reduce-scatter + Triton update + all-gather, pipelined"),
    "sharded_comm": ("sharded-zero1:comm", "reduce-scatter + all-gather alone"),
    "sharded_update": ("sharded-zero1:update", "Triton AdamW on this rank's shard alone"),
    "allreduce_fused_step": ("allreduce+torch-fused", "step: all-reduce of grads + torch fused AdamW on everything"),
    "allreduce": ("allreduce+torch-fused:comm", "all-reduce alone"),
    "fused_adamw": ("allreduce+torch-fused:update", "torch fused AdamW alone"),
}


def parity_tolerance() -> Tolerance:
    """fp32 params after one step of each path: rounding apart, they agree (the op's fp32 default)."""
    return OP.tolerance_for(None, "fp32")


class DistAdamWOp(LaunchedOp):
    def settings(self, device: str, given: Mapping[str, Any], timing=None) -> dict[str, Any]:
        values = self.given_values(given)
        return {"nproc": values.get("nproc", DEFAULT_NPROC), "steps": values.get("steps", DEFAULT_STEPS[device]),
                "bucket_mb": values.get("bucket_mb"), "gather_group": values.get("gather_group", True)}

    def run_workload(self, workload: str, device: str, folder: Path,
                     settings: Mapping[str, Any]) -> tuple[list[Row], str | None]:
        try:
            result = launch_workload(settings["nproc"], workload, settings["steps"],
                                     folder / f"{self.name}-{workload}.json", bucket_mb=settings["bucket_mb"],
                                     gather_group=settings["gather_group"], cpu=device == "cpu")
        except RuntimeError as exc:
            return self.launch_error(workload, settings, "sharded-zero1", exc)
        return result_rows(result), None


def defaults(device: str) -> tuple[list[str], int]:
    """The workloads and timed steps per rank a run on ``device`` ("cuda" or "cpu") takes by default."""
    return list(DEFAULT_WORKLOADS["gpu" if device == "cuda" else "cpu"]), DEFAULT_STEPS[device]


OP = DistAdamWOp(
    "dist-adamw",
    doc="One AdamW step of a data-parallel model on N ranks.",
    workloads=[w for w in vars(optim_workloads).values() if isinstance(w, Workload)],
    reference="allreduce+torch-fused",
    speed_anchor="allreduce+torch-fused",
    default_workloads=DEFAULT_WORKLOADS,
    options=[
        nproc_option(),
        OpOption("--steps", "steps", "timed steps per rank [default: 50 on GPUs, 10 on CPU ranks]. "
                 "For parity steps of other ops see --parity-steps.", minimum=1,
                 elsewhere_hint="parity steps are --parity-steps", kind="int"),
        bucket_mb_option(),
        OpOption("--gather-group", "gather_group", "ShardedAdamW all-gathers on a second communicator, beside "
                 "the reduce-scatters [default: on].", shown="--gather-group/--no-gather-group", kind="bool"),
    ],
)


# Both candidates run in every launch; parity is the worker's own comparison of the two (the
# op's parity row), not the harness's, hence parity=False here.
@OP.candidate("sharded-zero1", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_zero1(named_params, *, bucket_bytes=None, gather_group=None, **hyperparams):
    """ZeRO-1 ShardedAdamW: reduce-scatter, Triton AdamW on this rank's shard, all-gather, pipelined."""
    from kernelbench.optim.sharded_adamw import ShardedAdamW

    return ShardedAdamW(named_params, **hyperparams, bucket_bytes=bucket_bytes, gather_group=gather_group)


@OP.candidate("allreduce+torch-fused", requires=Requires(min_gpus=2), baseline=True, parity=False)
def allreduce_torch_fused(named_params, **hyperparams):
    """All-reduce of one flat gradient buffer, then torch.optim.AdamW(fused=True) on every parameter."""
    import torch

    return torch.optim.AdamW([p for _, p in named_params], **hyperparams, fused=True)


def launch_workload(nproc: int, workload: str, steps: int, output: Path, *, warmup: int = 10,
                    bucket_mb: float | None = None, gather_group: bool = False, timeout_s: float = 900.0,
                    cpu: bool = False) -> dict[str, Any]:
    """Runs the worker on ``nproc`` ranks and returns the JSON rank 0 wrote to ``output``.

    Raises UsageError for bad arguments (checked here, before any process starts), and
    RuntimeError when the run fails or passes ``timeout_s`` (see
    :func:`kernelbench.distributed.launch.launch`)."""
    OP.check_launch(workload, nproc, cpu)
    if bucket_mb is not None and bucket_mb <= 0:
        raise UsageError(f"--bucket-mb must be > 0, got {bucket_mb:g}")
    if steps < 1 or warmup < 0:
        raise UsageError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}")
    args = ["--workload", workload, "--steps", steps, "--warmup", warmup]
    args += ["--bucket-mb", bucket_mb] if bucket_mb is not None else []
    args += ["--gather-group"] if gather_group else []
    return launch(WORKER, nproc, [str(a) for a in args], output, timeout_s=timeout_s, cpu=cpu, name=OP.name)


def result_rows(result: dict[str, Any]) -> list[Row]:
    """The worker's JSON as kernelbench result rows (long format, as the harness's runner writes)."""
    workload = result["workload"]
    mode = f"{result['world_size']} ranks, {result['bucket_mb']:g} MiB buckets" + (
        ", all-gathers on a second communicator" if result.get("gather_group") else "")

    def row(candidate, metric, value, unit, message="", status=OK, flags=""):
        return Row(result["op"], workload, mode, candidate, metric, value, unit, status, flags, message=message)

    rows = []
    anchor = result["metrics_ms"]["allreduce_fused_step"]["median"]
    # Without GPUs the shard update runs in the Triton interpreter: its times are no measurement.
    interpreted = "Triton interpreter" in result["timing"]
    for metric, stats in result["metrics_ms"].items():
        candidate, what = _METRIC_ROWS[metric]
        if interpreted and candidate.startswith("sharded"):
            rows.append(row(candidate, "time_median_ms", None, "ms", "Triton interpreter (no GPU): time not measured",
                            status=NOT_MEASURED))
            continue
        flags = "noisy" if stats.get("noisy") else ""
        rows.append(row(candidate, "time_median_ms", stats["median"], "ms", f"{what}; {result['timing']}", flags=flags))
        for key in ("p25", "p75", "iqr", "min"):
            rows.append(row(candidate, f"time_{key}_ms", stats[key], "ms"))
        rows.append(row(candidate, "reps", stats["reps"], ""))
        if metric == "sharded_step" and not interpreted:
            rows.append(row(candidate, "ratio_vs_anchor", stats["median"] / anchor, "x",
                            "median / median of allreduce+torch-fused in the same run (below 1: faster)"))
    for candidate, key in (("sharded-zero1", "sharded"), ("allreduce+torch-fused", "allreduce_fused")):
        per_rank = result["state_bytes_per_rank"][key]["allocated_delta"]
        if per_rank and all(v is not None for v in per_rank):
            rows.append(row(candidate, "state_bytes", max(per_rank), "B",
                            "per rank (largest): allocated after the first step minus before construction"))
    rows += _parity_rows(result["parity"], row)
    if "teardown_error" in result:
        rows.append(row("sharded-zero1", "teardown", None, "", result["teardown_error"], status=ERROR))
    return rows


def _parity_rows(parity: dict[str, Any], row) -> list[Row]:
    """The worker's comparison of the two paths' params as a parity check (what the parity
    table and junit.xml show) and its figures."""
    what = f"params after {parity['after_steps']} step(s) vs allreduce+torch-fused, both from the same params and grads"
    rows = [row("sharded-zero1", "parity_max_rel_vs_allreduce_fused", parity["max_rel_diff"], "", what)]
    passed = parity["n_outside"] == 0
    status = PASS if passed else FAIL
    tol = f"atol {parity['atol']:g}, rtol {parity['rtol']:g}"
    rows.append(row("sharded-zero1", "parity_max_abs", parity["max_abs_diff"], "", tol, status=status))
    rows.append(row("sharded-zero1", "parity_n_outside", parity["n_outside"], "", tol, status=status))
    verdict = (f"{parity['numel']:,} elements within {tol}" if passed
               else f"{parity['n_outside']:,} of {parity['numel']:,} elements outside {tol}")
    rows.append(row("sharded-zero1", "parity", 1.0 if passed else 0.0, "", status=status,
                    message=f"{what}: {verdict}"))
    return rows
