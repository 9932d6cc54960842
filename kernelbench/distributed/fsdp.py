"""An optimizer under FSDP2 against itself on the unsharded model, on every rank of a process group.

    rows = fsdp_parity_rank(rank, world, FsdpParityRequest(factory, config, steps=10))

Each rank builds the same model twice from one seed: a plain copy (the reference, stepped as on one
GPU) and a copy sharded by ``fully_shard`` (every decoder layer, then the root). Both optimizers see
the same weights and, every step, the same gradients: a seeded full gradient per parameter is set
on the plain copy and its rows on the sharded one (so a difference is the optimizer's, not the
reduce-scatter's rounding). After each step every parameter and every state tensor of the sharded
run is gathered and compared with the plain run's, element for element.

Run it on ranks through ``kernelbench.distributed.spawn.run_ranks`` (tests, CPU, Gloo) or torchrun
(GPUs, NCCL); ``factory(named_parameters)`` builds the optimizer and must be picklable.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

Factory = Callable[[list[tuple[str, torch.nn.Parameter]]], torch.optim.Optimizer]


@dataclass(frozen=True)
class FsdpParityRequest:
    factory: Factory
    config: Any  # kernelbench.models.LlamaConfig
    steps: int = 10
    seed: int = 0
    grad_scale: float = 1e-2
    # Parameters as fp32 (torch's default); "bf16" stores them in bf16 (the optimizers' bf16 path).
    param_dtype: str = "fp32"
    compare_state: bool = True
    mesh_shape: tuple[int, ...] = field(default=())  # () = one dimension over every rank


def device_for(rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_mesh(device: torch.device, world: int, shape: tuple[int, ...] = ()):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, shape or (world,))


def shard_model(model: torch.nn.Module, mesh, reshard_after_forward: bool = True,
                bf16_params: bool = False) -> torch.nn.Module:
    """``fully_shard`` the attention and the MLP of every decoder layer, then the root, whose group
    holds the embedding, the norms and the head (kernelbench's Llama applies a layer's input norm
    before the layer itself, fused with the residual add, so the norms cannot be the layer's).
    ``bf16_params``: FSDP2's MixedPrecisionPolicy as large runs use it (parameters gathered and
    computed in bf16, gradients reduced in fp32, fp32 shards and optimizer state)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if bf16_params:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer.self_attn, **kwargs)
        fully_shard(layer.mlp, **kwargs)
    fully_shard(model, **kwargs)
    if hasattr(model, "loss"):  # Llama.loss calls forward itself: FSDP's hooks must run around it
        register_fsdp_forward_method(model, "loss")
    return model


def build_model(config: Any, seed: int, device: torch.device, param_dtype: str = "fp32") -> torch.nn.Module:
    from kernelbench.models import Llama

    torch.manual_seed(seed)
    with torch.device(device):
        model = Llama(config)
    model.reset_parameters(seed)
    return model.to(torch.bfloat16) if param_dtype == "bf16" else model


def build_pair(config: Any, seed: int, device: torch.device, mesh, param_dtype: str = "fp32"):
    """(plain model, sharded model) with equal weights."""
    plain = build_model(config, seed, device, param_dtype)
    return plain, shard_model(copy.deepcopy(plain), mesh)


def full_grads(named: Iterable[tuple[str, torch.Tensor]], step: int, seed: int, scale: float,
               device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed * 7919 + step + 1)
    return {name: (torch.randn(p.shape, generator=gen) * scale).to(device=device, dtype=p.dtype)
            for name, p in named}


def set_grads(plain: torch.nn.Module, sharded: torch.nn.Module, grads: dict[str, torch.Tensor]) -> None:
    """The full gradient on the plain model, this rank's rows of it on the sharded one."""
    from torch.distributed.tensor import DTensor

    for name, p in plain.named_parameters():
        p.grad = grads[name].clone()
    for name, p in sharded.named_parameters():
        g = grads[name]
        if isinstance(p, DTensor):
            local_shape = p.to_local().shape
            rows = _local_rows(p)
            local = g[rows[0]:rows[0] + rows[1]].clone() if g.dim() else g.clone()
            assert local.shape == local_shape, (name, local.shape, local_shape)
            p.grad = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                        shape=p.shape, stride=p.stride())
        else:
            p.grad = g.clone()


def _local_rows(p) -> tuple[int, int]:
    from torch.distributed.tensor import Shard

    from kernelbench.optim._sharding import chunk_rows

    for d, placement in enumerate(p.placements):
        if isinstance(placement, Shard):
            return chunk_rows(p.shape[0], p.device_mesh.size(d), p.device_mesh.get_local_rank(d))
    return 0, p.shape[0]


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank; fp8 travels as bytes (Gloo has no fp8 type)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    if t.dtype.is_floating_point and t.element_size() == 1:
        local = t.to_local()
        as_bytes = DTensor.from_local(local.view(torch.uint8), t.device_mesh, t.placements, run_check=False,
                                      shape=t.shape, stride=t.stride())
        return as_bytes.full_tensor().view(t.dtype)
    return t.full_tensor()


def difference(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """max |a - e|, ||a - e|| / ||e|| (fp64), whether every bit is equal, NaN pattern mismatches."""
    a = actual.detach().reshape(-1)
    e = expected.detach().reshape(-1)
    if a.numel() != e.numel():
        return {"shape_mismatch": f"{tuple(actual.shape)} vs {tuple(expected.shape)}", "bitwise": False,
                "max_abs": math.inf, "rel_frob": math.inf}
    bitwise = a.dtype == e.dtype and torch.equal(a.contiguous().view(torch.uint8), e.contiguous().view(torch.uint8))
    a64, e64 = a.double(), e.double()
    nan_mismatch = int((a64.isnan() != e64.isnan()).sum())
    diff = (a64 - e64).nan_to_num(0.0)
    norm = float(e64.nan_to_num(0.0).norm())
    return {"bitwise": bool(bitwise), "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
            "rel_frob": float(diff.norm()) / norm if norm > 0 else float(diff.norm()), "nan_mismatch": nan_mismatch}


def compare_runs(step: int, plain: torch.nn.Module, sharded: torch.nn.Module, plain_opt, sharded_opt,
                 compare_state: bool) -> list[dict[str, Any]]:
    """One row per parameter and state tensor; every rank calls the gathers in the same order."""
    rows = []
    plain_params = dict(plain.named_parameters())
    for name, p in sharded.named_parameters():
        ref = plain_params[name]
        rows.append({"step": step, "tensor": name, **difference(_full(p.detach()), ref.detach())})
        if not compare_state:
            continue
        state, ref_state = sharded_opt.state.get(p, {}), plain_opt.state.get(ref, {})
        for key in sorted(set(state) | set(ref_state)):
            value, expected = state.get(key), ref_state.get(key)
            if not isinstance(expected, torch.Tensor) and not isinstance(value, torch.Tensor):
                continue
            if value is None or expected is None:
                rows.append({"step": step, "tensor": f"{name}.{key}", "bitwise": False, "max_abs": math.inf,
                             "rel_frob": math.inf, "missing": "sharded" if value is None else "plain"})
                continue
            rows.append({"step": step, "tensor": f"{name}.{key}",
                         **difference(_full(torch.as_tensor(value)), torch.as_tensor(expected).to(value.device))})
    return rows


def run_pair(rank: int, world: int, request: FsdpParityRequest,
             observe: Callable[[int, torch.nn.Module, torch.nn.Module, Any, Any], None]) -> None:
    """``request.steps`` steps of the sharded and the plain run from the same weights and
    gradients; ``observe(step, plain, sharded, plain_opt, sharded_opt)`` after each (on every rank)."""
    device = device_for(rank)
    mesh = make_mesh(device, world, request.mesh_shape)
    plain, sharded = build_pair(request.config, request.seed, device, mesh, request.param_dtype)
    plain_opt = request.factory(list(plain.named_parameters()))
    sharded_opt = request.factory(list(sharded.named_parameters()))
    for step in range(1, request.steps + 1):
        grads = full_grads(plain.named_parameters(), step, request.seed, request.grad_scale, device)
        set_grads(plain, sharded, grads)
        plain_opt.step()
        sharded_opt.step()
        observe(step, plain, sharded, plain_opt, sharded_opt)
    dist.barrier()


def fsdp_parity_rank(rank: int, world: int, request: FsdpParityRequest) -> list[dict[str, Any]]:
    """Run on every rank of an initialised process group: ``request.steps`` steps of the sharded
    and the plain run; returns the comparison rows of every step (the same on every rank)."""
    rows: list[dict[str, Any]] = []

    def observe(step, plain, sharded, plain_opt, sharded_opt) -> None:
        rows.extend(compare_runs(step, plain, sharded, plain_opt, sharded_opt, request.compare_state))

    run_pair(rank, world, request, observe)
    return rows


def named_tensors(model: torch.nn.Module, optimizer, like: dict[str, torch.Tensor] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Every parameter and state tensor by name (``param`` and ``param.key``), DTensors gathered
    whole (a collective: every rank calls it in the same order). With ``like`` (the plain run's),
    a tensor of another shape but the same size is reshaped to it (Adam-mini's q / k m)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[name] = _full(p.detach())
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                out[f"{name}.{key}"] = _full(value.detach())
    if like is not None:
        for name, t in out.items():
            ref = like.get(name)
            if ref is not None and ref.shape != t.shape and ref.numel() == t.numel():
                out[name] = t.reshape(ref.shape)
    return out


@dataclass(frozen=True)
class CheckpointRequest:
    """Train ``steps_before`` steps sharded over the saving ranks, save with DCP, load into a model
    sharded over another number of ranks (built from another seed, so only the load can make it
    right), train ``steps_after`` more, and compare with the plain model trained all the way."""

    factory: Factory
    config: Any
    path: str
    steps_before: int = 3
    steps_after: int = 3
    seed: int = 0
    grad_scale: float = 1e-2


def _steps(request: CheckpointRequest, steps: range, plain, sharded, plain_opt, sharded_opt, device) -> None:
    for step in steps:
        grads = full_grads(plain.named_parameters(), step, request.seed, request.grad_scale, device)
        set_grads(plain, sharded, grads)
        if plain_opt is not None:
            plain_opt.step()
        if sharded_opt is not None:
            sharded_opt.step()


def checkpoint_save_rank(rank: int, world: int, request: CheckpointRequest) -> None:
    """The saving side: ``steps_before`` steps under fully_shard, then ``dcp.save`` of the model and
    of ``get_optimizer_state_dict``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    device = device_for(rank)
    plain, sharded = build_pair(request.config, request.seed, device, make_mesh(device, world))
    optimizer = request.factory(list(sharded.named_parameters()))
    _steps(request, range(1, request.steps_before + 1), plain, sharded, None, optimizer, device)
    model_state, optim_state = get_state_dict(sharded, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=request.path)
    dist.barrier()


def checkpoint_resume_rank(rank: int, world: int, request: CheckpointRequest) -> list[dict[str, Any]]:
    """The loading side, on any number of ranks: comparison rows after every step after the load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    device = device_for(rank)
    plain = build_model(request.config, request.seed, device)
    sharded = shard_model(build_model(request.config, request.seed + 1, device), make_mesh(device, world))
    optimizer = request.factory(list(sharded.named_parameters()))
    model_state, optim_state = get_state_dict(sharded, optimizer)  # initialises the state to load into
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=request.path)
    set_state_dict(sharded, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    plain_opt = request.factory(list(plain.named_parameters()))
    _steps(request, range(1, request.steps_before + 1), plain, sharded, plain_opt, None, device)
    rows = compare_runs(request.steps_before, plain, sharded, plain_opt, optimizer, compare_state=True)
    for step in range(request.steps_before + 1, request.steps_before + request.steps_after + 1):
        _steps(request, range(step, step + 1), plain, sharded, plain_opt, optimizer, device)
        rows += compare_runs(step, plain, sharded, plain_opt, optimizer, compare_state=True)
    dist.barrier()
    return rows
