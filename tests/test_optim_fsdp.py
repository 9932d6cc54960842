"""The optimizers under FSDP2 on CPU ranks (Gloo, Triton interpreter): each against itself on the
unsharded model from the same weights and gradients (kernelbench.distributed.fsdp)."""

from __future__ import annotations

import functools

import pytest
import torch

from kernelbench.distributed.fsdp import FsdpParityRequest, fsdp_parity_rank
from kernelbench.distributed.spawn import run_ranks
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


def adam_mini(named, state_dtype="fp32", config=CONFIG, tile=4096):
    from kernelbench.optim import AdamMini
    from kernelbench.optim.adam_mini import LaunchConfig

    return AdamMini(named, lr=1e-2, weight_decay=0.1, dim=config.hidden, n_heads=config.n_heads,
                    n_kv_heads=config.n_kv_heads, verbose=False, state_dtype=state_dtype, min_8bit_size=0,
                    launch_config=LaunchConfig(tile=tile))


# hidden 96 with 2 heads: a head is 48 rows of 96 (4608 elements), two fp8 scale blocks, and 3 ranks
# cut heads mid-block.
CONFIG_FP8 = LlamaConfig(vocab_size=37, hidden=96, n_layers=1, n_heads=2, n_kv_heads=1, intermediate=64, max_seq=16)
# Per-element state that depends on the gradients only: equal bit for bit however the blocks are cut.
_EXACT_STATE = (".m", ".m_fp8", ".m_scale", ".v", ".step")
# The blocks' sums of g^2 are summed in another order when a shard boundary cuts them (partial sums,
# then an all-reduce): vmean and the parameters stepped with it may differ in the last bits.
ADAM_MINI_RTOL = 1e-6


@pytest.mark.parametrize("state_dtype, world, config, tile", [
    ("fp32", 2, CONFIG, 64),  # tile 64: heads of 144 elements span three windows
    ("bf16", 3, CONFIG, 4096),
    ("fp8", 3, CONFIG_FP8, 4096),
])
def test_adam_mini_under_fsdp_matches_the_single_device_step(state_dtype, world, config, tile):
    factory = functools.partial(adam_mini, state_dtype=state_dtype, config=config, tile=tile)
    rows = run_ranks(fsdp_parity_rank, world, args=(FsdpParityRequest(factory, config, steps=3),), timeout_s=400)[0]
    assert rows
    exact = [r for r in rows if r["tensor"].endswith(_EXACT_STATE)]
    assert exact and all(r["bitwise"] for r in exact), _worst([r for r in exact if not r["bitwise"]])
    assert all(r["rel_frob"] <= ADAM_MINI_RTOL and not r.get("nan_mismatch") for r in rows), _worst(rows)
    # Row blocks never cross a shard boundary: their parameters step exactly as on one GPU.
    row_params = [r for r in rows if r["tensor"].endswith(("embed_tokens.weight", "lm_head.weight", "v_proj.weight",
                                                           "o_proj.weight", "mlp.down_proj.weight"))]
    assert row_params and all(r["bitwise"] for r in row_params), _worst([r for r in row_params if not r["bitwise"]])


def muon(named):
    from kernelbench.optim import Muon
    from kernelbench.optim.muon import muon_param_groups

    return Muon(muon_param_groups(named), lr=0.02, weight_decay=0.01, adamw_lr=1e-2)


@pytest.mark.parametrize("world", [2, 3])
def test_muon_under_fsdp_matches_the_single_device_step(world):
    # Each matrix is orthogonalised whole on its owner rank; on the CPU the batching does not change
    # the bits, so the sharded run equals the single-device one exactly (GPU batching may not).
    rows = run_ranks(fsdp_parity_rank, world, args=(FsdpParityRequest(muon, CONFIG, steps=3),), timeout_s=400)[0]
    assert rows and all(r["bitwise"] for r in rows), _worst([r for r in rows if not r["bitwise"]])


def test_muon_owners_spread_the_work():
    from kernelbench.optim.muon import owners

    shapes = [(64, 64)] * 4 + [(256, 64), (8, 8)]
    owner = owners(shapes, 2)
    assert owner[4] == 0  # the largest goes first, to rank 0
    # Newton-Schulz of a 256 x 64 costs four 64 x 64's: rank 1 takes all four to catch up.
    assert owner[:4] == [1, 1, 1, 1]
    assert owners(shapes, 2) == owner  # deterministic: every rank computes the same


def _save_then_resume(factory, config, tmp_path, save_world=2, load_worlds=(3, 1)):
    from kernelbench.distributed.fsdp import CheckpointRequest, checkpoint_resume_rank, checkpoint_save_rank

    request = CheckpointRequest(factory, config, str(tmp_path / "ckpt"), steps_before=2, steps_after=2)
    run_ranks(checkpoint_save_rank, save_world, args=(request,), timeout_s=300)
    return {world: run_ranks(checkpoint_resume_rank, world, args=(request,), timeout_s=300)[0]
            for world in load_worlds}


def test_triton_adamw_checkpoint_reshards_bitwise(tmp_path):
    for world, rows in _save_then_resume(triton_adamw, CONFIG, tmp_path, load_worlds=(4, 1)).items():
        assert rows and all(r["bitwise"] for r in rows), (world, _worst([r for r in rows if not r["bitwise"]]))


@pytest.mark.parametrize("state_dtype, config", [("fp32", CONFIG), ("fp8", CONFIG_FP8)])
def test_adam_mini_checkpoint_reshards_with_its_scales(state_dtype, config, tmp_path):
    factory = functools.partial(adam_mini, state_dtype=state_dtype, config=config)
    for world, rows in _save_then_resume(factory, config, tmp_path).items():
        exact = [r for r in rows if r["tensor"].endswith(_EXACT_STATE)]
        assert exact and all(r["bitwise"] for r in exact), (world, _worst([r for r in exact if not r["bitwise"]]))
        assert all(r["rel_frob"] <= ADAM_MINI_RTOL for r in rows), (world, _worst(rows))


def test_muon_checkpoint_reshards(tmp_path):
    for world, rows in _save_then_resume(muon, CONFIG, tmp_path).items():
        assert rows and all(r["bitwise"] for r in rows), (world, _worst([r for r in rows if not r["bitwise"]]))


def _sharded_adamw_interop(rank: int, world: int, path: str) -> dict[str, list[dict]]:
    """ShardedAdamW's consolidated_state_dict() and a DCP checkpoint of TritonAdamW under FSDP2 load
    into each other through torch.optim.AdamW's format; training then continues as if unbroken."""
    import copy

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from kernelbench.distributed.fsdp import (
        build_model,
        compare_runs,
        device_for,
        full_grads,
        make_mesh,
        set_grads,
        shard_model,
    )
    from kernelbench.optim import ShardedAdamW, TritonAdamW

    device = device_for(rank)
    mesh = make_mesh(device, world)
    hyper = dict(lr=1e-2, weight_decay=0.1)
    results = {}

    def train(plain, plain_opt, sharded, sharded_opt, steps):
        rows = []
        for step in steps:
            grads = full_grads(plain.named_parameters(), step, 0, 1e-2, device)
            set_grads(plain, sharded, grads)
            plain_opt.step()
            sharded_opt.step()
            rows += compare_runs(step, plain, sharded, plain_opt, sharded_opt, compare_state=False)
        return rows

    # ShardedAdamW -> torch.optim.AdamW's format -> DCP -> TritonAdamW under FSDP2
    plain = build_model(CONFIG, 0, device)
    zero = ShardedAdamW(plain.parameters(), **hyper)
    for step in (1, 2):
        for name, p in plain.named_parameters():
            p.grad = full_grads(plain.named_parameters(), step, 0, 1e-2, device)[name]
        zero.step()
    consolidated = [zero.consolidated_state_dict(to_rank=0)]
    dist.broadcast_object_list(consolidated, src=0)
    holder = copy.deepcopy(plain)
    as_torch = torch.optim.AdamW(holder.parameters(), **hyper)
    as_torch.load_state_dict(consolidated[0])
    model_sd, optim_sd = get_state_dict(holder, as_torch)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{path}/from-zero")
    sharded = shard_model(build_model(CONFIG, 1, device), mesh)
    fsdp_opt = TritonAdamW(sharded.parameters(), **hyper)
    model_sd, optim_sd = get_state_dict(sharded, fsdp_opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=f"{path}/from-zero")
    set_state_dict(sharded, fsdp_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    results["zero-to-fsdp"] = train(plain, zero, sharded, fsdp_opt, (3, 4))

    # TritonAdamW under FSDP2 -> DCP -> torch.optim.AdamW's format -> ShardedAdamW
    sharded = shard_model(build_model(CONFIG, 0, device), mesh)
    fsdp_opt = TritonAdamW(sharded.parameters(), **hyper)
    reference = build_model(CONFIG, 0, device)
    for step in (1, 2):
        set_grads(reference, sharded, full_grads(reference.named_parameters(), step, 0, 1e-2, device))
        fsdp_opt.step()
    model_sd, optim_sd = get_state_dict(sharded, fsdp_opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{path}/from-fsdp")
    holder = build_model(CONFIG, 1, device)
    as_torch = torch.optim.AdamW(holder.parameters(), **hyper)
    model_sd, optim_sd = get_state_dict(holder, as_torch)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=f"{path}/from-fsdp")
    set_state_dict(holder, as_torch, model_state_dict=state["model"], optim_state_dict=state["optim"])
    zero = ShardedAdamW(holder.parameters(), **hyper)
    zero.load_state_dict(as_torch.state_dict())
    results["fsdp-to-zero"] = train(holder, zero, sharded, fsdp_opt, (3, 4))
    return results


def test_sharded_adamw_and_fsdp_checkpoints_load_into_each_other(tmp_path):
    results = run_ranks(_sharded_adamw_interop, 2, args=(str(tmp_path),), timeout_s=300)[0]
    for direction, rows in results.items():
        # ShardedAdamW averages the ranks' (equal) gradients: (g + g) / 2 is g exactly.
        assert rows and all(r["rel_frob"] <= 1e-6 for r in rows), (direction, _worst(rows))
