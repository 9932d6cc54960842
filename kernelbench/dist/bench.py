"""Benchmark worker: ZeRO-1 ShardedAdamW against all-reduce + torch fused AdamW, on every rank.

Started by torch's launcher, one process per GPU (``kernelbench.dist.launch.launch`` does this):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m kernelbench.dist.bench \\
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

Timing: kernelbench._timer.RepTimer (CUDA events around each rep, the host clock on the CPU); before
each rep the harness's L2 flush and a barrier that lines the ranks up, both untimed. The six
metrics are interleaved round by round so drift hits all of them. A rep's time is the slowest
rank's (a step is done when every rank is); the JSON also has each rank's median. State bytes
per rank: memory allocated after the first step minus before the optimizer was built (CUDA), and
the bytes of its state tensors. Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# NVLink multicast stays off on the GPU machines (NCCL's NVLS and torch's symmetric memory).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

from kernelbench._timer import RepTimer
from kernelbench.harness.timing import L2Flusher
from kernelbench.ops.base import Workload, unknown_name_error
from kernelbench.ops.dist_adamw import OP

METRICS = ("sharded_step", "sharded_comm", "sharded_update", "allreduce_fused_step", "allreduce", "fused_adamw")
HYPERPARAMS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def workloads() -> dict[str, Workload]:
    """The op's workloads (every optimizer workload: the model-sized and the small CPU ones), by name."""
    return dict(OP.workloads)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kernelbench.dist.bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", default="model-370m", help="optimizer workload: " + ", ".join(sorted(workloads()))
    )
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
    if args.workload not in workloads():
        parser.error(str(unknown_name_error("workload", args.workload, workloads())))
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


def allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Timer:
    """One RepTimer per metric; before each rep an L2 flush and a barrier, both untimed."""

    def __init__(self, device: torch.device) -> None:
        self.timers = {m: RepTimer(device) for m in METRICS}
        self.flush = L2Flusher(device) if device.type == "cuda" else None

    def rep(self, metric: str, fn: Callable[[], None], record: bool) -> None:
        if self.flush is not None:
            self.flush()
        dist.barrier()
        if record:
            self.timers[metric](fn)
        else:
            fn()

    def results_ms(self) -> dict[str, list[float]]:
        return {m: timer.times_ms() for m, timer in self.timers.items()}


def summary(per_rank: list[list[float]]) -> dict[str, Any]:
    """Stats over reps of the slowest rank's time, plus each rank's median."""
    slowest = [max(times) for times in zip(*per_rank)]
    q = statistics.quantiles(slowest, n=4, method="inclusive") if len(slowest) > 1 else [slowest[0]] * 3
    median = statistics.median(slowest)
    return {
        "median": median,
        "p25": q[0],
        "p75": q[2],
        "iqr": q[2] - q[0],
        "min": min(slowest),
        "reps": len(slowest),
        "noisy": (q[2] - q[0]) / median > 0.10 if median > 0 else False,
        "per_rank_median": [statistics.median(times) for times in per_rank],
    }


def max_rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """Max |a - b| and max |a - b| / max(|b|, 1e-3) over every element."""
    abs_diff = rel_diff = 0.0
    for x, y in zip(a, b):
        d = (x - y).abs()
        abs_diff = max(abs_diff, float(d.max()))
        rel_diff = max(rel_diff, float((d / y.abs().clamp_min(1e-3)).max()))
    return abs_diff, rel_diff


def environment(device: torch.device, backend: str) -> dict[str, Any]:
    import triton

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "backend": backend,
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "env": {
            k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "TRITON_INTERPRET")
        },
    }
    if device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), timings not meaningful"
    return env


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        from kernelbench.dist.launch import die_with_parent

        # Started by torchrun: end with it, even when it is killed without a chance to stop us.
        die_with_parent()
        if os.getppid() == 1:
            raise SystemExit("dist-adamw rank: the launcher is gone")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s), device_id=device)
    else:
        device = torch.device("cpu")
        backend = "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    workload = workloads()[args.workload]
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
    abs_diff, rel_diff = max_rel_diff([p.detach() for _, p in named_a], [p.detach() for p in params_b])

    runs: dict[str, Callable[[], None]] = {
        "sharded_step": sharded.step,
        "sharded_comm": sharded.communicate_only,
        "sharded_update": sharded.update_only,
        "allreduce_fused_step": allreduce_fused_step,
        "allreduce": allreduce,
        "fused_adamw": fused.step,
    }
    timer = Timer(device)
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
            "timing": (
                f"CUDA events; {timer.flush.nbytes >> 20} MB L2 flush and a barrier before each rep (untimed)"
                if device.type == "cuda"
                else "host clock; CPU ranks on Gloo, kernels in the Triton interpreter: not a measurement"
            )
            + "; metrics interleaved per round; a rep's time is the slowest rank's",
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
            "parity": {"after_steps": 1, "max_abs_diff": abs_diff, "max_rel_diff": rel_diff, "rel_floor": 1e-3},
            "environment": environment(device, backend),
            "command": " ".join([Path(sys.executable).name, "-m", "kernelbench.dist.bench", *sys.argv[1:]]),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
