"""dist-train-step: a whole data-parallel training step of a Llama on N ranks, per wrapper and optimizer.

Every candidate builds the same model from one seed on every rank, wraps it its own way and trains
on each rank's own seeded tokens: forward and backward under bf16 autocast (fp32 params), gradient
clipping, the optimizer step, zero_grad. The worker (:mod:`kernelbench.ops.dist_train_step.worker`,
started through ``torch.distributed.run``) builds one candidate at a time, so only one holds
memory, and interleaves them round by round (rebuilt each round). Rank 0 rewrites its JSON after
every candidate's round, so what was measured survives a later failure or the deadline.

Rows per candidate: the whole step's median (slowest rank per rep), tokens/s over all ranks, peak
memory and optimizer state per rank (largest rank), exposed communication, the step's phases, and
the loss check.

- exposed_comm_ms: the step's median minus the median of the same candidate's step with its
  gradient communication switched off (DDP's ``no_sync``; ShardedAdamW's ``no_sync`` and
  ``update_only``), timed in the same rounds; not measured where a wrapper cannot switch it off
  without changing the work (FSDP2's all-gathers, ZeRO's step inside DDP's hook).
- phases (``step_forward_ms``, ``comm_free_backward_ms``, ``step_host_optimizer_ms``, ...): where the
  step goes, from CUDA events the compute stream reaches and the host clock at the same points.
- loss check: each candidate's losses over the first ``CHECK_STEPS`` steps from the seed weights
  on fixed tokens, against the DDP baseline's, within ``LOSS_RTOL``. Losses, not parameters: Adam's
  first update is lr * sign(g), so a reduction order that flips the sign of a near-zero gradient
  moves a parameter by 2 lr without changing the loss beyond rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbench.distributed.launch import launch
from kernelbench.harness.rows import ERROR, FAIL, NOT_MEASURED, OK, PASS, SKIPPED, Row
from kernelbench.models.grid import BY_NAME

from ..base import Requires, Workload
from ..launched_op import DEFAULT_NPROC, LaunchedOp, OpOption, bucket_mb_option, nproc_option

WORKER = f"{__name__}.worker"
BASELINE = "ddp+torch-fused"
DEFAULT_WORKLOADS = {"gpu": ["llama-1b-1x2048", "llama-1b-4x2048"], "cpu": ["llama-tiny-1x32"]}
LR = 1e-3  # large enough that the checked losses fall by far more than the tolerance
MAX_GRAD_NORM = 1.0
# Two: the third step at LR overshoots on random tokens (the reference's loss rises again), and there
# any reduction order's rounding grows past the tolerance (results/2026-11-27-4xh200-dist-train-step).
CHECK_STEPS = 2
LOSS_RTOL = 1e-2  # bf16 autocast: the relative tolerance of a bf16 result
# CPU ranks run the interpreter: one short round is a run-through, whatever the timing settings say.
CPU_RUN_THROUGH = {"rounds": 1, "warmup_steps": 0, "reps": 1}
LAUNCH_TIMEOUT_S = {"cuda": 1500.0, "cpu": 300.0}
# The worker stops starting candidates this long before the launch's deadline, so its JSON is final.
BUDGET_MARGIN_S = 60.0
# A round of a 1B workload takes under 30 s on 4 H200s (results/2026-11-27-4xh200-dist-train-step); one
# with no result after this long, beyond its timed steps, has a rank stuck in a collective. CPU ranks:
# the launch's deadline only.
ROUND_STALL_S = 240.0
MAX_HUNG = 3  # hung candidates left out before the run gives up on relaunching

# The model grid's Llama-3.2-1B at its full 16 layers, and its toy model for CPU ranks.
LLAMA_1B = dataclasses.asdict(dataclasses.replace(BY_NAME["llama-3.2-1b-layer4"].config, n_layers=16))
LLAMA_TINY = dataclasses.asdict(BY_NAME["llama-tiny"].config)


def _workload(name: str, tier: str, config: dict[str, Any], batch: int, seq: int, note: str = "") -> Workload:
    return Workload(name, tier, {"config": config, "batch": batch, "seq": seq}, seed=0, note=note)


WORKLOADS = [
    _workload("llama-1b-1x2048", "gpu", LLAMA_1B, 1, 2048, "Llama-3.2-1B-like, 1 x 2048 tokens per rank"),
    _workload("llama-1b-4x2048", "gpu", LLAMA_1B, 4, 2048, "Llama-3.2-1B-like, 4 x 2048 tokens per rank"),
    _workload("llama-tiny-1x32", "cpu", LLAMA_TINY, 1, 32, "interpreter-sized, CPU ranks"),
]


class DistTrainStepOp(LaunchedOp):
    # The harness's timing options set the rounds and reps of the worker (CUDA ranks).
    takes = ("-c/--candidate", "-w/--workload", "--rounds", "--warmup-ms", "--rep-ms")
    takes_shown = ("-c", "-w", "--rounds", "--warmup-ms", "--rep-ms", "--device", "-o", "--format")

    def settings(self, device: str, given: Mapping[str, Any], timing=None) -> dict[str, Any]:
        from kernelbench.harness.settings import DEFAULT_TIMING

        timing = timing or DEFAULT_TIMING
        values = self.given_values(given)
        return {"nproc": values.get("nproc", DEFAULT_NPROC), "rounds": timing.rounds, "warmup_ms": timing.warmup_ms,
                "rep_ms": timing.rep_ms, "min_reps": timing.min_reps, "max_reps": timing.max_reps,
                "bucket_mb": values.get("bucket_mb"), "stall_s": values.get("stall_s")}

    def run_workload(self, workload: str, device: str, folder: Path,
                     settings: Mapping[str, Any]) -> tuple[list[Row], str | None]:
        try:
            result = launch_workload(settings, workload, folder / f"{self.name}-{workload}.json",
                                     cpu=device == "cpu", stall_s=settings.get("stall_s"))
        except RuntimeError as exc:
            return self.launch_error(workload, settings, BASELINE, exc)
        rows = result_rows(result)
        error = result.get("teardown_error")
        return rows, (error.split(" | ")[0] if error else None)


OP = DistTrainStepOp(
    "dist-train-step",
    doc="A whole training step (forward, backward, clipping, optimizer) of a Llama on N ranks.",
    workloads=WORKLOADS,
    reference=BASELINE,
    speed_anchor=BASELINE,
    default_workloads=DEFAULT_WORKLOADS,
    options=[nproc_option(),
             bucket_mb_option(),
             OpOption("--stall-s", "stall_s", "seconds after which a candidate's round with no result counts as hung: "
                      "it becomes an error row and the other candidates run again without it (default on GPUs: 240 "
                      "plus twice a round's --warmup-ms and --rep-ms; none on CPU ranks)", above=0)],
)

# The order is the run's order: the comparison the op exists for first (DDP, ShardedAdamW overlapped,
# FSDP2 with and without resharding, FSDP2 + TritonAdamW, ZeRO overlapped with DDP), then the variants
# and the step-only diagnostic, so a deadline cuts those.
# Each factory takes the worker's Setup and returns a worker.TrainStep; the check is the op's own.
_GPUS = Requires(min_gpus=2)


@OP.candidate(BASELINE, requires=_GPUS, baseline=True, parity=False)
def ddp_torch_fused(setup):
    """DistributedDataParallel (gradient_as_bucket_view) + torch.optim.AdamW(fused=True)."""
    from . import worker

    return worker.ddp_step(setup)


@OP.candidate("sharded-adamw-overlap", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap(setup):
    """ShardedAdamW(overlap_grad_reduce=True, free_grads=True): reduce-scatters issued during
    backward, each full gradient bucket released once reduced (ZeRO-2), the update on this rank's shard."""
    from . import worker

    return worker.sharded_step(setup, overlap=True)


@OP.candidate("fsdp2-noreshard+torch-fused", requires=_GPUS, parity=False)
def fsdp2_noreshard_torch_fused(setup):
    """FSDP2 fully_shard(reshard_after_forward=False) per attention / MLP + root, torch fused AdamW."""
    from . import worker

    return worker.fsdp_step(setup, reshard_after_forward=False, optimizer="torch-fused")


@OP.candidate("fsdp2+torch-fused", requires=_GPUS, parity=False)
def fsdp2_torch_fused(setup):
    """FSDP2 fully_shard(reshard_after_forward=True) per attention / MLP + root, torch fused AdamW."""
    from . import worker

    return worker.fsdp_step(setup, reshard_after_forward=True, optimizer="torch-fused")


@OP.candidate("fsdp2+triton-adamw", requires=Requires(triton=True, min_gpus=2), parity=False)
def fsdp2_triton_adamw(setup):
    """FSDP2 fully_shard(reshard_after_forward=True), kernelbench's TritonAdamW on the local shards."""
    from . import worker

    return worker.fsdp_step(setup, reshard_after_forward=True, optimizer="triton")


@OP.candidate("zero-overlap+torch-foreach", requires=_GPUS, parity=False)
def zero_overlap_torch_foreach(setup):
    """ZeroRedundancyOptimizer(AdamW foreach, overlap_with_ddp=True) stepped in DDP's comm hook. Not
    fused: the functional AdamW that overlap_with_ddp steps keeps ``step`` on the CPU, which fused
    AdamW rejects inside the hook on the ranks that own a bucket, and the others then wait forever."""
    from . import worker

    return worker.zero_overlap_step(setup)


@OP.candidate("sharded-adamw-overlap+bf16-comm", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap_bf16_comm(setup):
    """sharded-adamw-overlap with grad_comm_dtype=torch.bfloat16: half the gradient traffic (fp32
    moments and update); compare with ddp-bf16-comm+torch-fused, which rounds the same way."""
    from . import worker

    return worker.sharded_step(setup, overlap=True, bf16_comm=True)


@OP.candidate("ddp-bf16-comm+torch-fused", requires=_GPUS, parity=False)
def ddp_bf16_comm_torch_fused(setup):
    """DDP with torch's bf16_compress_hook (gradients all-reduced in bf16) + torch fused AdamW."""
    from . import worker

    return worker.ddp_step(setup, bf16_comm=True)


@OP.candidate("fsdp2-bf16-noreshard+torch-fused", requires=_GPUS, parity=False)
def fsdp2_bf16_noreshard_torch_fused(setup):
    """FSDP2 as large runs configure it: MixedPrecisionPolicy(bf16 parameters, fp32 reduction),
    reshard_after_forward=False, torch fused AdamW on the fp32 shards."""
    from . import worker

    return worker.fsdp_step(setup, reshard_after_forward=False, optimizer="torch-fused", bf16_params=True)


@OP.candidate("sharded-adamw-overlap+bf16-params", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap_bf16_params(setup):
    """sharded-adamw-overlap with the layers' parameter all-gathers in bf16 (param_comm_dtype): half
    their traffic. Each rank's own shard stays fp32; the linears compute what fp32 gathers give, the
    norms' weights are rounded to bf16 on the ranks that do not own them."""
    from . import worker

    return worker.sharded_step(setup, overlap=True, bf16_params=True)


@OP.candidate("sharded-adamw-overlap+prefetch", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap_prefetch(setup):
    """sharded-adamw-overlap with prefetch_params=True: step() returns with the parameter all-gathers
    in flight, each module's forward waits for its own bucket's."""
    from . import worker

    return worker.sharded_step(setup, overlap=True, prefetch=True)


@OP.candidate("sharded-adamw-overlap+prefetch+bf16-params", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap_prefetch_bf16_params(setup):
    """sharded-adamw-overlap+prefetch with the layers' parameter all-gathers in bf16: half the
    traffic the next forward overlaps."""
    from . import worker

    return worker.sharded_step(setup, overlap=True, prefetch=True, bf16_params=True)


@OP.candidate("sharded-adamw-overlap+gather-group", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw_overlap_gather_group(setup):
    """sharded-adamw-overlap with its all-gathers on a second communicator (gather_group), so the
    parameter gathers of the step's first updated buckets run beside its last reduce-scatters."""
    from . import worker

    return worker.sharded_step(setup, overlap=True, gather_group=True)


@OP.candidate("sharded-adamw", requires=Requires(triton=True, min_gpus=2), parity=False)
def sharded_adamw(setup):
    """ShardedAdamW after backward (reduce-scatter, Triton update, all-gather, pipelined in step())."""
    from . import worker

    return worker.sharded_step(setup, overlap=False)


def worker_plan(settings: Mapping[str, Any], cpu: bool) -> dict[str, Any]:
    """The rounds and rep budget the worker gets (CPU ranks: the fixed run-through)."""
    if cpu:
        return dict(CPU_RUN_THROUGH)
    return {"rounds": settings["rounds"], "warmup_ms": settings["warmup_ms"], "rep_ms": settings["rep_ms"],
            "min_reps": settings["min_reps"], "max_reps": settings["max_reps"]}


def launch_workload(settings: Mapping[str, Any], workload: str, output: Path, *, cpu: bool = False,
                    timeout_s: float | None = None, stall_s: float | None = None) -> dict[str, Any]:
    """Runs the worker on ``settings['nproc']`` ranks; returns rank 0's JSON (complete or as far
    as it got). Raises UsageError for bad arguments before any process starts, RuntimeError when
    the ranks bring back nothing.

    A candidate whose round gives no result within ``stall_s`` (a rank stuck in a collective) is
    recorded as an error; the ranks are stopped and every other candidate runs again, in a new
    launch, so that the anchor and the rest are still measured in one run."""
    nproc = settings["nproc"]
    OP.check_launch(workload, nproc, cpu)
    timeout_s = timeout_s or LAUNCH_TIMEOUT_S["cpu" if cpu else "cuda"]
    if stall_s is None and not cpu:
        stall_s = default_stall_s(settings)
    names = list(settings.get("candidates") or OP.candidates)
    deadline = time.monotonic() + timeout_s
    hung: dict[str, dict[str, Any]] = {}
    while True:
        left = deadline - time.monotonic()
        chosen = [n for n in names if n not in hung] if hung or settings.get("candidates") else None
        result = _launch_once(settings, workload, output, cpu, left, chosen, stall_s)
        running = result.get("running")
        if "stalled" not in result or not running:
            break
        hung[running["candidate"]] = {
            "status": "error",
            "reason": f"hung: its round {running['round']} gave no result within {stall_s:.0f} s (a rank stuck in "
                      "a collective); the ranks were stopped and the other candidates measured again without it"}
        others = [n for n in names if n not in hung]
        if len(hung) >= MAX_HUNG or not others or deadline - time.monotonic() < BUDGET_MARGIN_S:
            result.pop("running", None)
            break
    if hung:
        result["candidates"] = {n: hung.get(n) or result["candidates"].get(n) or
                                {"status": "pending", "reason": "not reached before the run ended"} for n in names}
    return result


def _launch_once(settings: Mapping[str, Any], workload: str, output: Path, cpu: bool, timeout_s: float,
                 candidates: list[str] | None, stall_s: float | None) -> dict[str, Any]:
    args = ["--workload", workload, "--budget-s", max(1.0, timeout_s - BUDGET_MARGIN_S)]
    for key, value in worker_plan(settings, cpu).items():
        args += [f"--{key.replace('_', '-')}", value]
    if settings.get("bucket_mb") is not None:
        args += ["--bucket-mb", settings["bucket_mb"]]
    if candidates:  # -c, or the candidates left after a hung one
        args += ["--candidates", ",".join(candidates)]
    return launch(WORKER, settings["nproc"], [str(a) for a in args], output, timeout_s=timeout_s, cpu=cpu,
                  name=OP.name, stalled=None if stall_s is None else functools.partial(round_stalled, stall_s))


def default_stall_s(settings: Mapping[str, Any]) -> float:
    """ROUND_STALL_S beyond twice a round's timing budget (warm-up, then the timed and comm-free reps)."""
    per_round_ms = settings["warmup_ms"] + 2 * settings["rep_ms"] / settings["rounds"]
    return ROUND_STALL_S + 2 * per_round_ms / 1e3


def round_stalled(stall_s: float, partial: dict[str, Any] | None) -> str | None:
    """The launcher's watch: a message when the worker's current round has run past ``stall_s``."""
    running = (partial or {}).get("running")
    if running and time.time() - running["since_unix"] > stall_s:
        return f"{running['candidate']}'s round {running['round']} gave no result within {stall_s:.0f} s"
    return None


# ------------------------------------------------------------------------------------------------
def slowest_rank_stats(per_rank: list[list[float]]) -> dict[str, Any]:
    """Median, quartiles and reps of the slowest rank's time per rep (a step ends when every rank's does)."""
    slowest = [max(times) for times in zip(*per_rank)]
    if not slowest:
        return {"median": None, "reps": 0}
    q = statistics.quantiles(slowest, n=4, method="inclusive") if len(slowest) > 1 else [slowest[0]] * 3
    median = statistics.median(slowest)
    return {"median": median, "p25": q[0], "p75": q[2], "iqr": q[2] - q[0], "min": min(slowest),
            "reps": len(slowest), "noisy": median > 0 and (q[2] - q[0]) / median > 0.10}


def exposed_comm_ms(step: dict[str, Any], comm_free: dict[str, Any]) -> float | None:
    """Step median minus the comm-free step's median (never below zero: overlap can only hide)."""
    if step.get("median") is None or comm_free.get("median") is None:
        return None
    return max(0.0, step["median"] - comm_free["median"])


def loss_check(losses: list[list[float]], reference: list[list[float]], rtol: float = LOSS_RTOL) -> dict[str, Any]:
    """Each rank's losses step by step against the reference's on the same rank; passes when every
    one is within ``rtol`` of the reference. ``discriminating``: the reference's losses fell by
    more than twice the tolerance, so a candidate that did not step would fail."""
    worst, outside = 0.0, 0
    for mine, ref in zip(losses, reference, strict=True):
        for a, b in zip(mine, ref, strict=True):
            rel = abs(a - b) / max(abs(b), 1e-12)
            worst = max(worst, rel)
            outside += not rel <= rtol  # a NaN is outside
    fall = min(ref[0] - ref[-1] for ref in reference)
    scale = max(abs(ref[0]) for ref in reference)
    return {"max_rel_diff": worst, "n_outside": outside, "rtol": rtol, "passed": outside == 0,
            "reference_fall": fall, "discriminating": fall > 2 * rtol * scale}


def result_rows(result: dict[str, Any]) -> list[Row]:
    """The worker's JSON as report rows, one group per candidate that got as far as a status."""
    workload = result["workload"]
    world = result["world_size"]
    tokens = result["tokens_per_rank"] * world
    mode = f"{world} ranks, {result['tokens_per_rank']} tokens per rank, bf16 autocast"
    interpreted = result["backend"] != "nccl"
    reference_losses = result["candidates"].get(BASELINE, {}).get("losses")

    def row(candidate, metric, value, unit, message="", status=OK, flags=""):
        return Row(result["op"], workload, mode, candidate, metric, value, unit, status, flags, message=message)

    rows: list[Row] = []
    anchor = None
    for name, c in result["candidates"].items():
        if c["status"] in ("skipped", "pending"):
            rows.append(row(name, "time_median_ms", None, "ms", c["reason"], status=SKIPPED))
            continue
        if c["status"] == "error":
            rows.append(row(name, "time_median_ms", None, "ms", c["reason"], status=ERROR))
            continue
        step = slowest_rank_stats(c["step_ms"])
        free = slowest_rank_stats(c["comm_free_ms"]) if c.get("comm_free_ms") else {}
        what = f"{c['what']}; clipping: {c['clipping']}; {result['timing']}"
        if interpreted:
            rows.append(row(name, "time_median_ms", None, "ms", "CPU ranks (Gloo, Triton interpreter): time not "
                            f"measured; {what}", status=NOT_MEASURED))
        else:
            rows.append(row(name, "time_median_ms", step["median"], "ms", what, flags="noisy" if step["noisy"] else ""))
            for key in ("p25", "p75", "iqr", "min"):
                rows.append(row(name, f"time_{key}_ms", step[key], "ms"))
            rows.append(row(name, "reps", step["reps"], ""))
            rows.append(row(name, "tokens_per_s", tokens / (step["median"] / 1e3), "tok/s", f"{tokens} tokens over "
                            f"{world} ranks per step"))
            if name == BASELINE:
                anchor = step["median"]
            elif anchor:
                rows.append(row(name, "ratio_vs_anchor", step["median"] / anchor, "x",
                                f"median / median of {BASELINE} in the same run (below 1: faster)"))
            exposed = exposed_comm_ms(step, free)
            if exposed is None:
                rows.append(row(name, "exposed_comm_ms", None, "ms", c.get("comm_free_reason", ""),
                                status=NOT_MEASURED))
            else:
                rows.append(row(name, "exposed_comm_ms", exposed, "ms", "step median minus the median of the same "
                                f"step with gradient communication off ({c['comm_free_how']}), same rounds"))
            rows += _phase_rows(name, c.get("phase_ms", []), row)
        if c.get("peak_bytes") and all(v is not None for v in c["peak_bytes"]):
            rows.append(row(name, "peak_bytes", max(c["peak_bytes"]), "B", "per rank (largest): peak allocated over "
                            "the candidate's build and steps minus allocated before it"))
        if c.get("state_bytes"):
            rows.append(row(name, "state_bytes", max(c["state_bytes"]), "B",
                            "per rank (largest): the optimizer's state tensors on this rank"))
        rows += _check_rows(name, c.get("losses"), reference_losses, row)
    if "teardown_error" in result:
        rows.append(row(BASELINE, "teardown", None, "", result["teardown_error"], status=ERROR))
    return rows


def phase_medians(phase_ms: list[list[dict[str, dict[str, float]]]]) -> dict[str, dict[str, float]]:
    """The worker's per-round, per-rank phase medians as one median per metric and phase."""
    values: dict[str, dict[str, list[float]]] = {}
    for per_rank in phase_ms:
        for phases_by_metric in per_rank:
            for metric, phases in phases_by_metric.items():
                for phase, ms in phases.items():
                    values.setdefault(metric, {}).setdefault(phase, []).append(ms)
    return {metric: {phase: statistics.median(v) for phase, v in phases.items()} for metric, phases in values.items()}


def _phase_rows(name: str, phase_ms, row) -> list[Row]:
    """Where the step goes: ``<metric>_<phase>_ms`` (metric step or comm_free), median over ranks and
    rounds of each rank's median step."""
    on_gpu = "on the compute stream (CUDA events): waits on communication count in the phase that waits"
    on_host = "on the host: a GPU phase as long as its host phase ran dry behind the host"
    return [row(name, f"{metric}_{phase}_ms", ms, "ms", on_host if phase.startswith("host_") else on_gpu)
            for metric, phases in phase_medians(phase_ms).items() for phase, ms in phases.items()]


def _check_rows(name: str, losses, reference, row) -> list[Row]:
    what = f"losses of the first {CHECK_STEPS} steps from the seed weights vs {BASELINE}, per rank"
    if losses is None:
        return []
    if name == BASELINE:
        return [row(name, "loss_first", max(r[0] for r in losses), "", what)]
    if reference is None:
        return [row(name, "loss_check", None, "", f"{BASELINE} has no losses to compare with", status=NOT_MEASURED)]
    check = loss_check(losses, reference)
    status = PASS if check["passed"] else FAIL
    verdict = (f"every loss within rtol {check['rtol']:g}" if check["passed"]
               else f"{check['n_outside']} losses outside rtol {check['rtol']:g}")
    if not check["discriminating"]:
        verdict += f" (the baseline's losses fell by {check['reference_fall']:.3g} only: a weak check)"
    return [row(name, "loss_max_rel_vs_baseline", check["max_rel_diff"], "", what, status=status),
            row(name, "parity", 1.0 if check["passed"] else 0.0, "", f"{what}: {verdict}", status=status)]
