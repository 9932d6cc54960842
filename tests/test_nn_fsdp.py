"""kernelbench's layers inside a model sharded by FSDP2 (CPU ranks on Gloo, Triton interpreter): the
loss and every gradient equal the unsharded model's with the same layers, with and without
resharding after forward (the backward then reads parameters FSDP2 gathered again), and the
kernels run (launches counted), not torch's fallback."""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks
from kernelbench.models.llama import LlamaConfig

# Odd sizes: 24 hidden split unevenly over 3 ranks, a vocabulary of 37 rows.
CONFIG = LlamaConfig(vocab_size=37, hidden=24, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=40, max_seq=16)


def layers_under_fsdp(rank: int, world: int, reshard: bool) -> dict:
    """One rank's report: the sharded model's loss and gradients against the unsharded model's (CPU
    ranks count the interpreter's launches; on GPUs impl="triton" raises rather than fall back)."""
    import copy

    from kernelbench.distributed.fsdp import make_mesh, shard_model
    from kernelbench.models import Llama

    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    launches = []
    if device.type == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        run = InterpretedFunction.run
        InterpretedFunction.run = lambda self, *a, **k: launches.append(1) or run(self, *a, **k)
    torch.manual_seed(0)
    with torch.device(device):
        plain = Llama(CONFIG, layers="kernelbench", impl="triton")
    plain.reset_parameters(0)
    sharded = shard_model(copy.deepcopy(plain), make_mesh(device, world), reshard_after_forward=reshard)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own batch, as data parallelism has it
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 12), generator=gen).to(device)
    targets = torch.randint(0, CONFIG.vocab_size, (2, 12), generator=gen).to(device)
    loss = sharded.loss(tokens, targets)
    loss.backward()
    sharded_launches = len(launches)
    # The unsharded model on this rank's batch, its gradients averaged over the ranks as FSDP2's are.
    ref_loss = plain.loss(tokens, targets)
    ref_loss.backward()
    worst, compared = 0.0, 0
    for p, q in zip(sharded.parameters(), plain.parameters(), strict=True):
        ref_grad = q.grad.clone()
        torch.distributed.all_reduce(ref_grad)
        ref_grad /= world
        got = p.grad.full_tensor()
        worst = max(worst, ((got - ref_grad).norm() / ref_grad.norm().clamp_min(1e-30)).item())
        compared += 1
    if device.type == "cpu":
        InterpretedFunction.run = run
    return {"loss": loss.item(), "ref_loss": ref_loss.item(), "worst_grad_rel": worst, "params": compared,
            "sharded_launches": sharded_launches}


@pytest.mark.parametrize("world, reshard", [(2, True), (3, False)])
def test_kernelbench_layers_under_fsdp2_match_the_unsharded_model(world, reshard):
    for report in run_ranks(layers_under_fsdp, world, args=(reshard,), timeout_s=240):
        assert report["sharded_launches"] > 0, report  # the Triton kernels ran inside the sharded model
        assert abs(report["loss"] - report["ref_loss"]) <= 1e-6 * abs(report["ref_loss"]), report
        assert report["worst_grad_rel"] < 1e-5 and report["params"] > 0, report
