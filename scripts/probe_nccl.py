"""Why ShardedAdamW's reduce-scatter + all-gather took longer than one all-reduce of the same
bytes (5.45 ms vs 4.48 ms for model-370m's 1.48 GB of fp32 gradients on 2 H200s), and what
helps. One JSON line per measurement from rank 0 (median of REPS, slowest rank, CUDA events,
barrier before each rep).

On the default process group:
  all-reduce AVG of the whole buffer; reduce-scatter AVG in place / out of place / SUM in place,
  and all-gather in place, of the whole buffer and of 1 GiB and 256 MiB buckets.
Then: the reduce-scatter of one half and the all-gather of the other issued on two different
communicators at once (do they share the links better than one after the other?), and the
reduce-scatter while the Triton AdamW kernel updates a shard on the compute stream (does the
update slow the collective?).

    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/probe_nccl.py
"""

from __future__ import annotations

import json
import os
import statistics
from datetime import timedelta

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

NUMEL = 368_640_000  # about model-370m's parameter count, divisible by 2 * 64
REPS, WARMUP = 12, 3


def main() -> None:
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=device)
    world = dist.get_world_size()

    def emit(**row) -> None:
        if rank == 0:
            print(json.dumps(row), flush=True)

    def timed(name: str, fn, **extra) -> None:
        times = []
        for i in range(WARMUP + REPS):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            works = fn()
            for work in works if isinstance(works, (list, tuple)) else [works]:
                if work is not None and hasattr(work, "wait"):
                    work.wait()  # the current stream waits for the collective (async_op=True)
            end.record()
            torch.cuda.synchronize()
            if i >= WARMUP:
                times.append(start.elapsed_time(end))
        gathered = [None] * world
        dist.all_gather_object(gathered, times)
        slowest = [max(ts) for ts in zip(*gathered)]
        med = statistics.median(slowest)
        emit(name=name, ms=round(med, 4), min_ms=round(min(slowest), 4),
             busbw_gbps=round(extra.pop("bytes", 0) / med / 1e6, 1) if "bytes" in extra else None, **extra)

    buf = torch.randn(NUMEL, device=device)
    out = torch.empty(NUMEL // world, device=device)
    nbytes = NUMEL * 4
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__, nccl=".".join(map(str, torch.cuda.nccl.version())),
         gbytes=nbytes / 1e9, world=world)

    groups = {"default": dist.group.WORLD}

    def shard(t: torch.Tensor) -> torch.Tensor:
        n = t.numel() // world
        return t[rank * n:(rank + 1) * n]

    def buckets(elements: int) -> list[torch.Tensor]:
        return list(buf.split(elements))

    for gname, g in groups.items():
        # Bus bytes per rank: (W-1)/W of the buffer each way for RS and AG, twice that for AR.
        timed(f"{gname}/all-reduce-avg", lambda: dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=g),
              bytes=2 * nbytes * (world - 1) / world)
        timed(f"{gname}/rs-avg-inplace", lambda: dist.reduce_scatter_tensor(shard(buf), buf, op=dist.ReduceOp.AVG, group=g),
              bytes=nbytes * (world - 1) / world)
        timed(f"{gname}/rs-avg-outofplace", lambda: dist.reduce_scatter_tensor(out, buf, op=dist.ReduceOp.AVG, group=g),
              bytes=nbytes * (world - 1) / world)
        timed(f"{gname}/rs-sum-inplace", lambda: dist.reduce_scatter_tensor(shard(buf), buf, op=dist.ReduceOp.SUM, group=g),
              bytes=nbytes * (world - 1) / world)
        timed(f"{gname}/ag-inplace", lambda: dist.all_gather_into_tensor(buf, shard(buf), group=g),
              bytes=nbytes * (world - 1) / world)
        for mib in (1024, 256):
            parts = buckets(mib * 2**20 // 4)

            def rs_ag(parts=parts):
                works = [dist.reduce_scatter_tensor(shard(b), b, op=dist.ReduceOp.AVG, group=g, async_op=True)
                         for b in parts]
                return works + [dist.all_gather_into_tensor(b, shard(b), group=g, async_op=True) for b in parts]

            timed(f"{gname}/rs+ag-{mib}mib-buckets", rs_ag, bytes=2 * nbytes * (world - 1) / world, buckets=len(parts))

    # Two communicators at once: RS of the first half on one, AG of the second half on another.
    second = dist.new_group(backend="nccl")
    half = NUMEL // 2
    a, b = buf[:half], buf[half:]
    timed("serial/rs-half-then-ag-half",
          lambda: (dist.reduce_scatter_tensor(shard(a), a, op=dist.ReduceOp.AVG, async_op=True),
                   dist.all_gather_into_tensor(b, shard(b), async_op=True)), bytes=nbytes * (world - 1) / world)
    timed("concurrent/rs-half-and-ag-half-two-comms",
          lambda: (dist.reduce_scatter_tensor(shard(a), a, op=dist.ReduceOp.AVG, async_op=True),
                   dist.all_gather_into_tensor(b, shard(b), group=second, async_op=True)), bytes=nbytes * (world - 1) / world)

    # The update kernel beside a collective: does it slow the reduce-scatter down?
    from kernelbench.optim.adamw import adamw_step_flat

    n_shard = NUMEL // world // 2
    p, g_, m, v = (torch.randn(n_shard, device=device) for _ in range(4))
    v.abs_()
    step = torch.zeros((), device=device)
    hp = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    timed("update-alone (a quarter of the buffer's shard pair)", lambda: adamw_step_flat(p, g_, m, v, step, **hp))
    timed("rs-half-alone", lambda: dist.reduce_scatter_tensor(shard(a), a, op=dist.ReduceOp.AVG))
    timed("rs-half-with-update", lambda: (dist.reduce_scatter_tensor(shard(a), a, op=dist.ReduceOp.AVG, async_op=True),
                                          adamw_step_flat(p, g_, m, v, step, **hp)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
