"""ShardedAdamW's overlapped gradient reduction on 2 GPUs (NCCL): the reduce-scatters launched from
the backward's hooks give the same params, bit for bit, as those launched by step(), in fp32 and
in bf16 traffic.

    pytest tests/gpu/test_sharded_adamw_overlap_gpu.py -q        # on a machine with 2 GPUs
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

# Odd widths; with 256 KiB buckets every weight (all larger) and every bias gets a bucket of its own.
WIDTHS = [257, 1023, 511, 129]
BUCKET_BYTES = 256 * 2**10
STEPS = 5
HP = {"lr": 1e-3, "weight_decay": 0.01}


def _model(device) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for fan_in, fan_out in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1]).to(device)


def _train(rank: int, device, overlap: bool, comm_dtype) -> tuple[list[torch.Tensor], int, list[int]]:
    from kernelbench.optim import ShardedAdamW

    model = _model(device)
    opt = ShardedAdamW(model.parameters(), **HP, bucket_bytes=BUCKET_BYTES, overlap_grad_reduce=overlap,
                       grad_comm_dtype=comm_dtype)
    launched_in_backward = []  # buckets whose reduce-scatter was launched before step(), per step
    for step in range(STEPS):
        gen = torch.Generator(device=device).manual_seed(100 * step + rank)
        x = torch.randn(64, WIDTHS[0], generator=gen, device=device)
        model(x).square().mean().backward()
        launched_in_backward.append(len(opt._reductions))
        opt.step()
        opt.zero_grad()
    if overlap:
        opt.remove_hooks()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in model.parameters()], len(opt._buckets), launched_in_backward


def _run(rank: int, world: int) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    report = {}
    for comm_dtype in (None, torch.bfloat16):
        plain, buckets, _ = _train(rank, device, overlap=False, comm_dtype=comm_dtype)
        overlapped, _, launched = _train(rank, device, overlap=True, comm_dtype=comm_dtype)
        report[str(comm_dtype)] = {
            "buckets": buckets,
            "launched_in_backward": launched,
            "differ": [i for i, (p, q) in enumerate(zip(plain, overlapped)) if not torch.equal(p, q)],
        }
    return report


def test_overlapped_equals_non_overlapped_bitwise_on_two_gpus():
    results = run_ranks(_run, 2, backend="nccl", timeout_s=300, collective_timeout_s=60)
    for r in results:
        for comm_dtype, outcome in r.items():
            assert outcome["buckets"] > 1, (comm_dtype, outcome)
            assert outcome["launched_in_backward"] == [outcome["buckets"]] * STEPS, (comm_dtype, outcome)
            assert not outcome["differ"], f"{comm_dtype}: params {outcome['differ']} differ"
