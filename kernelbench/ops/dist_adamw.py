"""dist-adamw: a data-parallel AdamW step on N ranks, ZeRO-1 sharded against all-reduce + fused.

Both candidates run in every launch (``kernelbench.dist.bench`` on each rank, started through
``torch.distributed.run``), from the same params and per-rank gradients, so their times are
interleaved rep by rep and their results compared after one step. On GPUs each rank takes one
GPU and NCCL; without them the ranks are CPU processes on Gloo with the Triton interpreter: a
run-through, not a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import optim_workloads
from .base import Requires, Workload
from .launched_op import LaunchedOp, OpOption

# Interpreter-sized on CPU ranks (the run takes seconds); the model-sized step on GPUs.
DEFAULT_WORKLOADS = {"gpu": ["model-370m"], "cpu": ["model-tiny"]}
DEFAULT_STEPS = {"cuda": 50, "cpu": 10}
DEFAULT_NPROC = 2


class DistAdamWOp(LaunchedOp):
    def settings(self, device: str, given: Mapping[str, Any]) -> dict[str, Any]:
        values = {self.options[flag].key: value for flag, value in given.items() if value is not None}
        return {"nproc": values.get("nproc", DEFAULT_NPROC), "steps": values.get("steps", DEFAULT_STEPS[device]),
                "bucket_mb": values.get("bucket_mb"), "gather_group": values.get("gather_group", True)}

    def availability(self, candidate, device: str) -> str:
        if device != "cuda":
            return "CPU ranks on Gloo: a run-through, not a measurement"
        import torch

        gpus = torch.cuda.device_count()
        return "yes" if gpus >= 2 else f"no: needs 2 GPUs, {gpus} visible"

    def device_note(self, device: str) -> str | None:
        if device == "cuda":
            return None
        return (f"{self.name} on CPU ranks (Gloo, Triton interpreter): a run-through, not a measurement; "
                f"default workload {DEFAULT_WORKLOADS['cpu'][0]}.")

    def progress_text(self, workload: str, settings: Mapping[str, Any]) -> str:
        return f"{self.name} {workload} on {settings['nproc']} ranks (torch.distributed.run)"


def defaults(device: str) -> tuple[list[str], int]:
    """The workloads and timed steps per rank a run on ``device`` ("cuda" or "cpu") takes by default."""
    return list(DEFAULT_WORKLOADS["gpu" if device == "cuda" else "cpu"]), DEFAULT_STEPS[device]


OP = DistAdamWOp(
    "dist-adamw",
    doc="One AdamW step of a data-parallel model on N ranks.",
    workloads=[w for w in vars(optim_workloads).values() if isinstance(w, Workload)],
    reference="allreduce+torch-fused",
    speed_anchor="allreduce+torch-fused",
    runner="kernelbench.dist.launch:run_workload",
    default_workloads=DEFAULT_WORKLOADS,
    options=[
        OpOption("--nproc", "nproc", f"ranks to start through torch.distributed.run [default: {DEFAULT_NPROC}].",
                 minimum=1),
        OpOption("--steps", "steps", "timed steps per rank [default: 50 on GPUs, 10 on CPU ranks]. "
                 "For parity steps of other ops see --parity-steps.", minimum=1,
                 elsewhere_hint="parity steps are --parity-steps"),
        OpOption("--bucket-mb", "bucket_mb", "ShardedAdamW bucket size in MiB, > 0 (default: ShardedAdamW's, "
                 "256 with a gather group, 1024 without).", above=0),
        OpOption("--gather-group", "gather_group", "ShardedAdamW all-gathers on a second communicator, beside "
                 "the reduce-scatters [default: on].", shown="--gather-group/--no-gather-group"),
    ],
)


# Both candidates run in every launch; parity is the worker's own comparison of the two (its
# parity_max_rel_vs_allreduce_fused row), not the harness's, hence parity=False here.
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
