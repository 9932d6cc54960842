"""ShardedAdamW's overlapped gradient reduction, free_grads and prefetch_params on 2 GPUs (NCCL): the
reduce-scatters launched from the backward's hooks, the released gradient buckets and the all-gathers
waited in the next forward give the same params, bit for bit, as the default step, in fp32 and in
bf16 traffic; after step() free_grads holds none of the gradient bytes the default path keeps.

    pytest tests/gpu/test_sharded_adamw_overlap_gpu.py -q        # on a machine with 2 GPUs
"""

from __future__ import annotations

import gc

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


def _train(rank: int, device, comm_dtype, **options) -> dict:
    from kernelbench.optim import ShardedAdamW

    gc.collect()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated(device)
    model = _model(device)
    if options.get("prefetch_params"):
        options["module"] = model
    opt = ShardedAdamW(model.parameters(), **HP, bucket_bytes=BUCKET_BYTES, grad_comm_dtype=comm_dtype, **options)
    launched_in_backward = []  # buckets whose reduce-scatter was launched before step(), per step
    for step in range(STEPS):
        gen = torch.Generator(device=device).manual_seed(100 * step + rank)
        x = torch.randn(64, WIDTHS[0], generator=gen, device=device)
        model(x).square().mean().backward()
        launched_in_backward.append(len(opt._reductions))
        opt.step()
        torch.cuda.synchronize()
        held_after_step = torch.cuda.memory_allocated(device) - baseline
        opt.zero_grad()
    opt.wait_params()
    if options.get("overlap_grad_reduce"):
        opt.remove_hooks()
    torch.cuda.synchronize()
    return {
        "params": [p.detach().cpu() for p in model.parameters()],
        "buckets": len(opt._buckets),
        "launched_in_backward": launched_in_backward,
        "held_after_step": held_after_step,
        "grad_bytes": sum(b.param_flat.numel() * 4 for b in opt._buckets),
    }


def _run(rank: int, world: int) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    report = {}
    variants = {
        "overlap": {"overlap_grad_reduce": True},
        "free_grads": {"overlap_grad_reduce": True, "free_grads": True},
        "prefetch": {"prefetch_params": True},
        "free_grads + prefetch": {"overlap_grad_reduce": True, "free_grads": True, "prefetch_params": True},
    }
    for comm_dtype in (None, torch.bfloat16):
        plain = _train(rank, device, comm_dtype)
        outcomes = {name: _train(rank, device, comm_dtype, **options) for name, options in variants.items()}
        report[str(comm_dtype)] = {
            "buckets": plain["buckets"],
            "world": world,
            "grad_bytes": plain["grad_bytes"],
            "launched_in_backward": outcomes["overlap"]["launched_in_backward"],
            "differ": {name: [i for i, (p, q) in enumerate(zip(plain["params"], o["params"])) if not torch.equal(p, q)]
                       for name, o in outcomes.items()},
            "freed_by_free_grads": outcomes["overlap"]["held_after_step"] - outcomes["free_grads"]["held_after_step"],
        }
    return report


def test_overlap_free_grads_and_prefetch_equal_the_default_bitwise_on_two_gpus():
    results = run_ranks(_run, 2, backend="nccl", timeout_s=300, collective_timeout_s=60)
    for r in results:
        for comm_dtype, outcome in r.items():
            assert outcome["buckets"] > 1, (comm_dtype, outcome)
            assert outcome["launched_in_backward"] == [outcome["buckets"]] * STEPS, (comm_dtype, outcome)
            for name, differ in outcome["differ"].items():
                assert not differ, f"{comm_dtype}, {name}: params {differ} differ from the default step"
            # after step() free_grads holds no gradient: neither the fp32 buckets (shards included)
            # nor the bf16 wire copy
            grad_bytes = outcome["grad_bytes"]
            expected = grad_bytes + (grad_bytes // 2 if comm_dtype == "torch.bfloat16" else 0)
            assert abs(outcome["freed_by_free_grads"] - expected) <= 0.05 * expected, (comm_dtype, outcome, expected)
