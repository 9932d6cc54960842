"""dist-adamw's worker, on every rank: ZeRO-1 ShardedAdamW against all-reduce + torch fused AdamW.

Started by torch's launcher, one process per GPU (the op's ``launch_workload`` does this):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m kernelbench.ops.dist_adamw.worker \\
        --workload model-370m --steps 50 --warmup 10 --output results/dist-adamw.json

Both candidates hold the workload's fp32 params (the same seeded values on every rank) with each
rank's own seeded gradients, which live in flat buffers as a DDP-style trainer keeps them:

- ``sharded``: ShardedAdamW: reduce-scatter (AVG) of each gradient bucket, the Triton AdamW
  kernel on this rank's shard, all-gather of the params, buckets pipelined.
  ``sharded_comm`` times its reduce-scatters and all-gathers alone, ``sharded_update`` its
  kernel alone (on the shards, no communication).
- ``allreduce_fused``: all-reduce (AVG) of one flat gradient buffer, then
  torch.optim.AdamW(fused=True) on every parameter. ``allreduce`` and ``fused_adamw`` time the
  two halves alone.

The six metrics are interleaved round by round so drift hits all of them (timing:
:class:`kernelbench.distributed.worker.RankTimer`); the JSON has the slowest rank's statistics and
each rank's median. State bytes per rank: memory allocated after the first step minus before the
optimizer was built (CUDA), and the bytes of its state tensors. After one step from the same
params and grads the two candidates' params are compared element-wise with the op's tolerance.
Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernelbench.distributed.worker import (
    RankTimer,
    allocated,
    compare,
    environment,
    init_ranks,
    summary,
    tensor_bytes,
)
from kernelbench.ops.base import Workload, unknown_name_error
from kernelbench.ops.dist_adamw import HYPERPARAMS, METRICS, OP, WORKER, parity_tolerance


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER}", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="model-370m",
                        help="optimizer workload: " + ", ".join(sorted(OP.workloads)))
    parser.add_argument("--steps", type=int, default=50, help="timed reps per metric")
    parser.add_argument("--warmup", type=int, default=10, help="untimed reps per metric first")
    parser.add_argument(
        "--bucket-mb", type=float, default=None, help="ShardedAdamW bucket size in MiB (default: ShardedAdamW's own)"
    )
    parser.add_argument(
        "--gather-group",
        action="store_true",
        help="ShardedAdamW all-gathers on a second communicator (overlap with the reduce-scatters)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="process group timeout: a rank waiting longer on a peer fails"
    )
    parser.add_argument("--output", type=Path, required=True, help="JSON written by rank 0")
    args = parser.parse_args(argv)
    if args.workload not in OP.workloads:
        parser.error(str(unknown_name_error("workload", args.workload, OP.workloads)))
    if args.steps < 1 or args.warmup < 0 or (args.bucket_mb is not None and args.bucket_mb <= 0):
        parser.error("--steps must be >= 1, --warmup >= 0 and --bucket-mb > 0")
    return args


def make_params(workload: Workload, device: torch.device, rank: int) -> list[tuple[str, torch.nn.Parameter]]:
    """The workload's params (same values on every rank) with this rank's own gradients."""
    params_gen = torch.Generator(device=device).manual_seed(workload.seed)
    grads_gen = torch.Generator(device=device).manual_seed(workload.seed * 7919 + 1 + rank)
    named = []
    for name, shape in workload.spec["shapes"]:
        p = torch.nn.Parameter(torch.randn(shape, generator=params_gen, device=device) * 0.02)
        p.grad = torch.randn(shape, generator=grads_gen, device=device)
        named.append((name, p))
    return named


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    device, backend, rank, world = init_ranks(args.timeout_s)
    workload = OP.workloads[args.workload]
    gather_group = dist.new_group() if args.gather_group else None

    # Candidate A: ShardedAdamW. Params and grads exist before the snapshot, so the delta is
    # what the optimizer adds (its moments, padding), not the buckets it moves them into.
    named_a = make_params(workload, device, rank)
    before = allocated(device)
    bucket_bytes = None if args.bucket_mb is None else int(args.bucket_mb * 2**20)
    sharded = OP.get_candidate("sharded-zero1").build(
        named_a, **HYPERPARAMS, bucket_bytes=bucket_bytes, gather_group=gather_group
    )
    sharded.step()
    sharded_delta = None if before is None else allocated(device) - before

    # Candidate B: one flat gradient buffer (DDP's gradient_as_bucket_view), all-reduce, fused AdamW.
    named_b = make_params(workload, device, rank)
    params_b = [p for _, p in named_b]
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params_b])
    offset = 0
    for p in params_b:
        p.grad = flat_grad[offset : offset + p.numel()].view(p.shape)
        offset += p.numel()
    before = allocated(device)
    fused = OP.get_candidate("allreduce+torch-fused").build(named_b, **HYPERPARAMS)

    def allreduce() -> None:
        dist.all_reduce(flat_grad, op=dist.ReduceOp.AVG)

    def allreduce_fused_step() -> None:
        allreduce()
        fused.step()

    allreduce_fused_step()
    fused_delta = None if before is None else allocated(device) - before

    # One step each from the same params and grads: the two must agree (fp32 rounding only).
    tol = parity_tolerance()
    parity = compare([p.detach() for _, p in named_a], [p.detach() for p in params_b], tol.atol, tol.rtol)

    runs: dict[str, Callable[[], None]] = {
        "sharded_step": sharded.step,
        "sharded_comm": sharded.communicate_only,
        "sharded_update": sharded.update_only,
        "allreduce_fused_step": allreduce_fused_step,
        "allreduce": allreduce,
        "fused_adamw": fused.step,
    }
    timer = RankTimer(device, METRICS)
    for i in range(args.warmup + args.steps):
        for metric in METRICS:
            timer.rep(metric, runs[metric], record=i >= args.warmup)
    mine = timer.results_ms()

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"times": mine, "sharded_delta": sharded_delta, "fused_delta": fused_delta})
    result = None
    if rank == 0:
        metrics = {m: summary([g["times"][m] for g in gathered]) for m in METRICS}
        step, base = metrics["sharded_step"]["median"], metrics["allreduce_fused_step"]["median"]
        comm, update = metrics["sharded_comm"]["median"], metrics["sharded_update"]["median"]
        numel = sum(p.numel() for p in params_b)
        result = {
            "op": "dist-adamw",
            "workload": workload.name,
            "numel": numel,
            "world_size": world,
            "backend": backend,
            "hyperparams": HYPERPARAMS,
            "bucket_mb": sharded.bucket_bytes / 2**20,
            "buckets": len(sharded._buckets),
            "gather_group": args.gather_group,
            "comm_mode": sharded.comm,
            "timing": timer.describe(),
            "warmup": args.warmup,
            "metrics_ms": metrics,
            "speedup_vs_allreduce_fused": base / step if step > 0 else None,
            "overlap": {
                "comm_plus_update_ms": comm + update,
                "hidden_ms": comm + update - step,
                "hidden_fraction_of_smaller": (comm + update - step) / min(comm, update)
                if min(comm, update) > 0
                else None,
            },
            "state_bytes_per_rank": {
                "sharded": {
                    "allocated_delta": [g["sharded_delta"] for g in gathered],
                    "tensors": sharded.state_bytes(),
                },
                "allreduce_fused": {
                    "allocated_delta": [g["fused_delta"] for g in gathered],
                    "tensors": tensor_bytes(
                        [t for s in fused.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
                    ),
                },
                "adamw_bytes_per_param": 8,
            },
            "parity": {"after_steps": 1, **parity},
            "environment": environment(device, backend),
            "command": " ".join([Path(sys.executable).name, "-m", WORKER, *sys.argv[1:]]),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
