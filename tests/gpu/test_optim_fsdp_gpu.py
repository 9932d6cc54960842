"""The optimizers under FSDP2 on two GPUs of one host (NCCL), and parameters on a GPU other than
the current one: the step runs on the parameters' GPU, and a group spread over two GPUs is refused."""

from __future__ import annotations

import functools

import pytest
import torch

from kernelbench.distributed.fsdp import FsdpParityRequest, fsdp_parity_rank
from kernelbench.distributed.fsdp_bench import CANDIDATES, PARITY_CONFIG, _bound
from kernelbench.distributed.spawn import run_ranks

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

# Tolerances of the sharded step against the unsharded one, relative Frobenius over every parameter
# and state tensor after 3 steps: TritonAdamW is elementwise (bitwise); Adam-mini and Adafactor sum
# statistics a shard boundary cuts in another order (last bits of fp32); Muon batches other sets of
# matrices through bf16 Newton-Schulz (cuBLAS may pick another algorithm per batch size).
RTOL = {"triton-adamw": 0.0, "adam-mini-fp32": 1e-5, "adam-mini-bf16": 1e-5, "adam-mini-fp8": 1e-5,
        "adafactor-8bit": 1e-2, "adafactor-fp32": 1e-5, "muon": 1e-2}


@two_gpus
@pytest.mark.parametrize("name", sorted(RTOL))
def test_sharded_step_matches_the_single_gpu_step(name):
    request = FsdpParityRequest(_bound(name, PARITY_CONFIG), PARITY_CONFIG, steps=3)
    rows = run_ranks(fsdp_parity_rank, 2, backend="nccl", args=(request,), timeout_s=300)[0]
    worst = max(rows, key=lambda r: r["rel_frob"])
    assert rows and not any(r.get("nan_mismatch") for r in rows)
    if RTOL[name] == 0.0:
        assert all(r["bitwise"] for r in rows), worst
    assert worst["rel_frob"] <= RTOL[name], worst


def _make(name, params):
    return CANDIDATES[name]([(f"layers.{i}.mlp.weight", p) for i, p in enumerate(params)], PARITY_CONFIG)


def _params(device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(512, 512), (1376, 512), (512,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device) * 0.02) for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device)
    return params


@two_gpus
@pytest.mark.parametrize("name", ["triton-adamw", "adam-mini-fp32", "adam-mini-fp8", "adafactor-8bit", "muon"])
def test_parameters_on_another_gpu_step_there(name):
    torch.cuda.set_device(0)
    here, there = _params("cuda:0"), _params("cuda:1")
    for opt in (_make(name, here), _make(name, there)):
        for _ in range(3):
            opt.step()
    torch.cuda.synchronize(1)
    for a, b in zip(here, there):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


@two_gpus
@pytest.mark.parametrize("name", ["triton-adamw", "adam-mini-fp32", "adafactor-8bit"])
def test_a_group_spread_over_two_gpus_is_refused(name):
    params = _params("cuda:0")
    params[1] = torch.nn.Parameter(params[1].detach().to("cuda:1"))
    params[1].grad = torch.randn_like(params[1]) * 1e-2
    before = [p.detach().clone() for p in params]
    with pytest.raises((RuntimeError, ValueError), match="cuda:1"):
        _make(name, params).step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
