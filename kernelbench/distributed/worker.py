"""What a benchmark worker on every rank needs, for any op: the process group, interleaved timers,
statistics over the slowest rank, an element-wise comparison and the environment.

A worker module (started by :func:`kernelbench.distributed.launch.launch`) calls
:func:`init_ranks`, times its metrics with a :class:`RankTimer`, gathers every rank's times and
has rank 0 write :func:`summary` of them. Timing: kernelbench._timer.RepTimer (CUDA events around
each rep, the host clock on the CPU); before each rep the harness's L2 flush and a barrier that
lines the ranks up, both untimed. A rep's time is the slowest rank's (a step is done when every
rank is).
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
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

from .launch import die_with_parent


def init_ranks(timeout_s: float) -> tuple[torch.device, str, int, int]:
    """Joins the process group torchrun set up: (device, backend, rank, world size). One GPU
    and NCCL per rank where GPUs are visible, else the CPU and Gloo."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # Started by torchrun: end with it, even when it is killed without a chance to stop us.
        die_with_parent()
        if os.getppid() == 1:
            raise SystemExit("worker rank: the launcher is gone")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device)
    else:
        device = torch.device("cpu")
        backend = "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return device, backend, dist.get_rank(), dist.get_world_size()


def allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class RankTimer:
    """One RepTimer per metric; before each rep an L2 flush and a barrier, both untimed."""

    def __init__(self, device: torch.device, metrics: Sequence[str]) -> None:
        self.timers = {m: RepTimer(device) for m in metrics}
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

    def describe(self) -> str:
        if self.flush is not None:
            how = f"CUDA events; {self.flush.nbytes >> 20} MB L2 flush and a barrier before each rep (untimed)"
        else:
            how = "host clock; CPU ranks on Gloo, kernels in the Triton interpreter: not a measurement"
        return how + "; metrics interleaved per round; a rep's time is the slowest rank's"


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


def compare(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], atol: float, rtol: float) -> dict[str, Any]:
    """``a`` against ``b`` element by element: max |a - b|, max |a - b| / max(|b|, 1e-3), and how
    many elements lie outside atol + rtol * |b| (the harness's parity rule)."""
    abs_diff = rel_diff = 0.0
    outside = numel = 0
    for x, y in zip(a, b):
        d = (x - y).abs()
        abs_diff = max(abs_diff, float(d.max()))
        rel_diff = max(rel_diff, float((d / y.abs().clamp_min(1e-3)).max()))
        outside += int((~(d <= atol + rtol * y.abs())).sum())
        numel += y.numel()
    return {"max_abs_diff": abs_diff, "max_rel_diff": rel_diff, "rel_floor": 1e-3, "atol": atol, "rtol": rtol,
            "n_outside": outside, "numel": numel}


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
