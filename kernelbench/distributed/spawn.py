"""Run a function on N local ranks of a fresh process group, with a deadline.

    results = run_ranks(my_fn, world_size=2, timeout_s=60)   # my_fn(rank, world_size, *args)

Each rank is a process started with torch.multiprocessing's ``spawn`` method (no fork: CUDA and
Triton do not survive a fork). The process group is initialised with ``timeout=collective_timeout_s``, so a
collective whose peer is gone raises inside the rank; and the parent stops waiting at the
deadline, kills the ranks still running and raises, so a hung rank fails the caller (a CI test)
instead of hanging it.

Without CUDA, ``TRITON_INTERPRET=1`` is put in the environment the ranks inherit: it must be set
before a module defining @triton.jit kernels is imported, and unpickling ``fn`` in the child
imports its module before any code of ours runs there.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.multiprocessing as mp


class RankFailure(RuntimeError):
    """One or more ranks raised, died, or missed the deadline; the message has each rank's story."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, backend: str, collective_timeout_s: float,
               results: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    # NVLink multicast stays off on the GPU machines (NCCL's NVLS, torch's symmetric memory);
    # NCCL reads these when its communicator is created, below.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *, args: tuple[Any, ...] = (),
              timeout_s: float = 60.0, collective_timeout_s: float = 20.0,
              backend: str = "gloo") -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` on every rank; returns the ranks' return values in rank
    order. ``fn`` must be importable (a module-level function) and its results picklable.

    timeout_s: the whole run's deadline, process start-up included; ranks still running then are
        killed. collective_timeout_s: the process group's timeout, after which a collective whose
        peers never come raises inside the rank. Raises RankFailure when a rank raises, exits
        without a result, or misses the deadline."""
    if world_size < 1:
        raise ValueError(f"run_ranks: world_size must be >= 1, got {world_size}")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main, args=(r, world_size, port, backend, collective_timeout_s, results, fn, args), daemon=True
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    outcomes: dict[int, tuple[str, Any]] = {}
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.2)
            outcomes[rank] = (status, value)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                # Drain what the last rank put just before exiting.
                try:
                    while True:
                        rank, status, value = results.get(timeout=0.5)
                        outcomes[rank] = (status, value)
                except queue.Empty:
                    break
    for p in procs:
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    problems = []
    for r, p in enumerate(procs):
        status, value = outcomes.get(r, (None, None))
        if status == "error":
            problems.append(f"rank {r} raised:\n{value}")
        elif status is None and r in hung:
            problems.append(f"rank {r} was still running after {timeout_s:.0f} s and was killed (hung collective?)")
        elif status is None:
            problems.append(f"rank {r} exited with code {p.exitcode} without a result")
    if problems:
        raise RankFailure("\n".join(problems))
    return [outcomes[r][1] for r in range(world_size)]
