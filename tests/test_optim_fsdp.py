"""The optimizers under FSDP2 on CPU ranks (Gloo, Triton interpreter): each against itself on the
unsharded model from the same weights and gradients (kernelbench.distributed.fsdp)."""

from __future__ import annotations

import pytest

from kernelbench.dist.spawn import run_ranks
from kernelbench.distributed.fsdp import FsdpParityRequest, fsdp_parity_rank
from kernelbench.models.llama import LlamaConfig

# Odd sizes: 37 vocabulary rows and 24 hidden split unevenly over 2 and 3 ranks, heads of 6 rows
# that a shard boundary cuts, 4 of 3 ranks holding no row of a 3-row tensor.
CONFIG = LlamaConfig(vocab_size=37, hidden=24, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=40, max_seq=16)


def triton_adamw(named):
    from kernelbench.optim import TritonAdamW

    return TritonAdamW([p for _, p in named], lr=1e-2, weight_decay=0.1)


def _worst(rows):
    return max(rows, key=lambda r: r["rel_frob"])


@pytest.mark.parametrize("world", [2, 3])
def test_triton_adamw_under_fsdp_is_bitwise_the_single_device_step(world):
    rows = run_ranks(fsdp_parity_rank, world, args=(FsdpParityRequest(triton_adamw, CONFIG, steps=3),),
                     timeout_s=240)[0]
    assert rows and all(r["bitwise"] for r in rows), _worst([r for r in rows if not r["bitwise"]])
