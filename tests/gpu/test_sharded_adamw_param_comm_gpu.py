"""ShardedAdamW's bf16 parameter all-gathers (``param_comm_dtype``) on 2 GPUs (NCCL): an embedding
group gathered in fp32 and a group of linears, read under CUDA autocast, gathered in bf16 train bit
for bit like fp32 gathers (losses and every rank's own shards), with and without the overlapped,
ZeRO-2 and prefetching paths; the rest of each replica is the owners' values rounded to bf16.

    pytest tests/gpu/test_sharded_adamw_param_comm_gpu.py -q        # on a machine with 2 GPUs
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

STEPS = 5
BUCKET_BYTES = 256 * 2**10  # several buckets per group, each padded to two shards
VARIANTS = {
    "after-backward": {},
    "overlap+free-grads+clip": {"overlap_grad_reduce": True, "free_grads": True, "max_grad_norm": 0.1},
    "overlap+prefetch": {"overlap_grad_reduce": True, "prefetch_params": True},
}


class _Model(torch.nn.Module):
    def __init__(self, device) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(1000, 257)
        self.up = torch.nn.Linear(257, 1023)
        self.down = torch.nn.Linear(1023, 129, bias=False)
        self.to(device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.down(torch.nn.functional.gelu(self.up(self.embed(tokens))))


def _train(rank: int, device, param_comm_dtype, options: dict):
    from kernelbench.optim import ShardedAdamW

    model = _Model(device)
    extra = {"module": model} if options.get("prefetch_params") else {}
    groups = [{"params": [model.embed.weight]},
              {"params": [model.up.weight, model.up.bias, model.down.weight], "param_comm_dtype": param_comm_dtype}]
    opt = ShardedAdamW(groups, lr=1e-3, weight_decay=0.01, bucket_bytes=BUCKET_BYTES, **options, **extra)
    losses = []
    for step in range(STEPS):
        gen = torch.Generator(device=device).manual_seed(100 * step + rank)
        tokens = torch.randint(0, 1000, (8, 64), generator=gen, device=device)
        loss = model(tokens).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    opt.wait_params()
    torch.cuda.synchronize()
    return model, opt, torch.stack(losses).cpu()


def _run(rank: int, world: int) -> list[str]:
    device = torch.device("cuda", torch.cuda.current_device())
    problems = []
    for name, options in VARIANTS.items():
        exact, exact_opt, exact_losses = _train(rank, device, None, dict(options))
        half, half_opt, half_losses = _train(rank, device, torch.bfloat16, dict(options))
        if not torch.equal(half_losses, exact_losses):
            problems.append(f"rank {rank} {name}: losses {half_losses.tolist()} vs {exact_losses.tolist()}")
        rounded_somewhere = False
        for b, e in zip(half_opt._buckets, exact_opt._buckets):
            lo, hi = rank * b.shard_numel, (rank + 1) * b.shard_numel
            rounded = e.param_flat.to(torch.bfloat16).float() if b.gather_dtype is not None else e.param_flat
            expected = torch.cat([rounded[:lo], e.param_flat[lo:hi], rounded[hi:]])
            rounded_somewhere |= not torch.equal(rounded, e.param_flat)
            if not torch.equal(b.param_flat, expected):
                problems.append(f"rank {rank} {name}: bucket {b.index} is not its own fp32 shard beside the "
                                "others' values rounded to bf16")
        if not rounded_somewhere:
            problems.append(f"rank {rank} {name}: no bf16 bucket held a value bf16 cannot represent")
        half_opt.gather_params_fp32()
        for (n, p), (_, q) in zip(half.named_parameters(), exact.named_parameters()):
            if not torch.equal(p, q):
                problems.append(f"rank {rank} {name}: {n} differs after gather_params_fp32()")
    return problems


def test_bf16_parameter_gathers_train_bit_for_bit_like_fp32_ones_on_two_gpus():
    reports = run_ranks(_run, 2, backend="nccl", timeout_s=300, collective_timeout_s=60)
    problems = [p for r in reports for p in r]
    assert not problems, "\n".join(problems)
