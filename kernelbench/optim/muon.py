"""Muon: momentum, then Newton-Schulz orthogonalisation of the update, for 2-D weights; AdamW
for everything else.

Per 2-D parameter W (rows x cols) with gradient g, in this order:

    buf    = lerp(buf, g, 1 - momentum)                    (an EMA of the gradients)
    u      = lerp(g, buf, momentum) if nesterov else buf
    O      = newton_schulz(u, ns_steps)                    (bf16 iteration, kernelbench.newton_schulz)
    W      = W * (1 - lr * weight_decay)                   (decoupled weight decay)
    W      = W - lr * sqrt(max(1, rows / cols)) * O

Parameters that are not 2-D, and those in a group with ``use_muon=False`` (embeddings and the
output head, by convention), take an AdamW step with the group's ``adamw_*`` hyperparameters,
through kernelbench's TritonAdamW (one launch per group) where it can run, else torch's AdamW.

Batching: 2-D parameters of one group with the same shape are orthogonalised together, as one
(batch, rows, cols) Newton-Schulz call: 17 kernel launches per shape instead of per tensor. Their
momentum buffers are slices of one (batch, rows, cols) tensor (``state[p]["momentum_buffer"]``
is a view into it), so the stacked momentum needs no copy; the gradients are stacked once.
No host synchronisation in ``step()`` (the finiteness check of newton_schulz is off here).

FSDP2. DTensor parameters of ``fully_shard`` (sharded on dim 0) keep their momentum as a DTensor of
the same layout and update it on the local rows. Newton-Schulz needs the whole matrix: the ranks
share out the matrices (largest first, each to the rank with the least work so far), one
all-to-all brings every matrix's rows to its owner, each rank orthogonalises the matrices it owns
(same shapes batched), and a second all-to-all returns each rank its rows of every result: the
work of N ranks on N matrices at once, not every rank on every matrix. Communication goes through
the process group of the sharding mesh dimension only.

``MuonReference`` is the same algorithm in plain PyTorch, one parameter at a time, with the
iteration in torch bf16 matmuls and torch.optim.AdamW(foreach=False): the parity reference.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from kernelbench.newton_schulz import graph_static_bytes, newton_schulz, newton_schulz_ref

from ._sharding import check_like_param, is_dtensor, local_tensor, row_shard

_MUON_DEFAULTS = dict(
    lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0, ns_steps=5, ns_path="auto", ns_graph=False,
    use_muon=True,
    adamw_lr=3e-4, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, adamw_weight_decay=0.0,
)


def muon_param_groups(named_params: Iterable[tuple[str, torch.Tensor]],
                      adamw_names: Sequence[str] = ("embed", "head")) -> list[dict[str, Any]]:
    """Two groups: the 2-D parameters for Muon, and for AdamW those whose name contains one of
    ``adamw_names`` (embeddings, the output head) plus every parameter that is not 2-D."""
    muon, adamw = [], []
    for name, p in named_params:
        to_adamw = p.dim() != 2 or any(fragment in name for fragment in adamw_names)
        (adamw if to_adamw else muon).append(p)
    groups = [{"params": muon, "use_muon": True}]
    if adamw:
        groups.append({"params": adamw, "use_muon": False})
    return groups


def _graph_choice(group: dict) -> bool | None:
    """newton_schulz's ``graph``: never (the default), or the route's choice with ns_graph=True."""
    return None if group["ns_graph"] else False


def update_scale(shape: torch.Size) -> float:
    """sqrt(max(1, rows / cols)): tall matrices get a larger step (their O has smaller entries)."""
    return math.sqrt(max(1.0, shape[0] / shape[1]))


class _MuonBase(torch.optim.Optimizer, abc.ABC):
    """Hyperparameters, validation and the AdamW side shared by Muon and MuonReference."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        defaults = {**_MUON_DEFAULTS, **kwargs}
        unknown = set(kwargs) - set(_MUON_DEFAULTS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown hyperparameters {sorted(unknown)}; "
                            f"known: {sorted(_MUON_DEFAULTS)}")
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._check_group(group)
        self._adamw: torch.optim.Optimizer | None = None
        self._adamw_groups: list[int] = []  # index in param_groups of each AdamW inner group

    def _check_group(self, group: dict) -> None:
        for key in ("lr", "adamw_lr", "weight_decay", "adamw_weight_decay", "adamw_eps"):
            if not isinstance(group[key], (int, float)) or group[key] < 0:
                raise ValueError(f"{type(self).__name__}: {key} must be a number >= 0; got {group[key]!r}")
        if not 0.0 <= group["momentum"] < 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be in [0, 1); got {group['momentum']!r}")
        if not isinstance(group["ns_steps"], int) or group["ns_steps"] < 1:
            raise ValueError(f"{type(self).__name__}: ns_steps must be an int >= 1; got {group['ns_steps']!r}")
        if not isinstance(group["ns_graph"], bool):
            raise ValueError(f"{type(self).__name__}: ns_graph must be True or False; got {group['ns_graph']!r}")

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_adamw"):
            self._check_group(self.param_groups[-1])
            self._adamw = None  # rebuilt with the new group at the next step

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # groups saved before a hyperparameter existed take its default
            for key, value in _MUON_DEFAULTS.items():
                group.setdefault(key, value)
        # torch keeps a loaded 'step' tensor as given (shared with the source's state); AdamW
        # increments it in place, so each optimizer gets its own copy.
        for state in self.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()
        self._adamw = None

    @staticmethod
    def uses_muon(group: dict, p: torch.Tensor) -> bool:
        return bool(group["use_muon"]) and p.dim() == 2

    @abc.abstractmethod
    def _make_adamw(self, groups: list[dict]) -> torch.optim.Optimizer:
        """The AdamW that steps the params Muon does not (TritonAdamW, or torch's in the reference)."""

    def _adamw_step(self) -> None:
        if self._adamw is None:
            inner_groups, self._adamw_groups = [], []
            for index, group in enumerate(self.param_groups):
                params = [p for p in group["params"] if not self.uses_muon(group, p)]
                if params:
                    inner_groups.append({"params": params})
                    self._adamw_groups.append(index)
            if not inner_groups:
                return
            self._adamw = self._make_adamw(inner_groups)
            self._adamw.state = self.state  # one state dict: state_dict() and checkpoints see it all
        for inner, index in zip(self._adamw.param_groups, self._adamw_groups):
            group = self.param_groups[index]
            inner.update(lr=float(group["adamw_lr"]), betas=tuple(group["adamw_betas"]),
                         eps=group["adamw_eps"], weight_decay=group["adamw_weight_decay"])
        self._adamw.step()


def _triton_adamw_usable(params: list[torch.Tensor]) -> bool:
    import os

    try:
        from kernelbench.optim.adamw import TritonAdamW  # noqa: F401
    except ImportError:
        return False
    on_cuda = all(p.device.type == "cuda" for p in params)
    return on_cuda or os.environ.get("TRITON_INTERPRET") == "1"


class Muon(_MuonBase):
    """Muon with kernelbench's Newton-Schulz kernels (see the module docstring).

    Groups take ``lr``, ``momentum``, ``nesterov``, ``weight_decay``, ``ns_steps``, ``ns_path``
    (``"auto"``, ``"classic"``, ``"hopper"``, ``"torch"``), ``ns_graph``, ``use_muon`` and, for the
    AdamW side, ``adamw_lr``, ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay``.

    ``ns_graph=True`` replays a CUDA graph of each Newton-Schulz call where the route picks one
    (small matrices, where the call's 17 launches cost more than its GEMMs): a faster step, but
    each graph keeps its fp32 input and output allocated between steps, 8 bytes per Muon
    parameter beside the 4 of its momentum (``workspace_bytes()``). The default, False, keeps
    nothing beyond the momentum: the state of the plain PyTorch algorithm.
    ``muon_param_groups(model.named_parameters())`` makes the usual split.
    ``adamw_backend`` names the AdamW used ("TritonAdamW" or "torch.optim.AdamW").
    """

    adamw_backend: str | None = None

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._stacks: dict[tuple[int, ...], torch.Tensor] = {}
        self._ns_calls: set[tuple] = set()  # (shape, dtype, device) of each batched Newton-Schulz call

    def workspace_bytes(self) -> int:
        """Bytes held between steps beyond ``state``: the static input, output and norm of the
        CUDA graphs that replay this optimizer's Newton-Schulz calls (none off CUDA, none unless
        ``ns_graph=True``). The graphs' bf16 work matrices live in a pool shared by every shape,
        freed between replays."""
        return sum(graph_static_bytes(*call) for call in self._ns_calls)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._stacks.clear()  # loaded buffers are separate tensors: restacked at the next step

    def _make_adamw(self, groups: list[dict]) -> torch.optim.Optimizer:
        params = [p for g in groups for p in g["params"]]
        if _triton_adamw_usable(params):
            from kernelbench.optim.adamw import TritonAdamW

            self.adamw_backend = "TritonAdamW"
            return TritonAdamW(groups)
        self.adamw_backend = "torch.optim.AdamW"
        fused = all(p.device.type == "cuda" for p in params)
        return torch.optim.AdamW(groups, fused=fused or None, foreach=False if not fused else None)

    def _momentum_stack(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The (batch, rows, cols) momentum of ``params``, whose slices are their state buffers."""
        key = tuple(id(p) for p in params)
        stack = self._stacks.get(key)
        buffers = [self.state[p].get("momentum_buffer") for p in params]
        if stack is not None and all(b is not None and b.data_ptr() == stack[i].data_ptr()
                                     for i, b in enumerate(buffers)):
            return stack
        stack = torch.stack([torch.zeros_like(p) if b is None else b for p, b in zip(params, buffers)])
        for i, p in enumerate(params):
            self.state[p]["momentum_buffer"] = stack[i]
        self._stacks[key] = stack
        return stack

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buckets: dict[tuple, list[torch.Tensor]] = {}
            sharded: list[torch.Tensor] = []
            for p in group["params"]:
                if p.grad is not None and self.uses_muon(group, p):
                    if p.grad.is_sparse:
                        raise RuntimeError("Muon does not support sparse gradients")
                    if is_dtensor(p):
                        sharded.append(p)
                        continue
                    buckets.setdefault((p.shape, p.dtype, p.device), []).append(p)
            if sharded:
                self._sharded_step(group, sharded)
            lr, momentum = group["lr"], group["momentum"]
            for (shape, _, _), params in buckets.items():
                buf = self._momentum_stack(params)
                grad = torch.stack([p.grad for p in params])
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp_(buf, momentum) if group["nesterov"] else buf
                ortho = newton_schulz(update, group["ns_steps"], path=group["ns_path"], check_finite=False,
                                      graph=_graph_choice(group))
                if group["ns_graph"]:
                    self._ns_calls.add((tuple(update.shape), update.dtype, update.device))
                if group["weight_decay"]:
                    torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
                torch._foreach_add_(params, list(ortho.unbind(0)), alpha=-lr * update_scale(shape))
        self._adamw_step()
        return loss


    def _sharded_step(self, group: dict, params: list[torch.Tensor]) -> None:
        """The step of DTensor parameters (module docstring): momentum on the local rows, each
        matrix orthogonalised whole by one rank, the update applied to the local rows."""
        shards = []
        for p in params:
            label = f"parameter {tuple(p.shape)}"
            shard = row_shard(p, label, "Muon")
            check_like_param(label, p, p.grad, "Muon")
            shards.append(shard)
        groups = {id(s.group) for s in shards}
        if len(groups) > 1:
            raise ValueError("Muon: the DTensor parameters of one param group are sharded over different process "
                             "groups; shard them over one mesh.")
        lr, momentum = group["lr"], group["momentum"]
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            check_like_param(f"parameter {tuple(p.shape)}", p, state["momentum_buffer"], "Muon", "momentum")
            bufs.append(local_tensor(state["momentum_buffer"]))
        grads = [local_tensor(p.grad) for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        ortho = orthogonalize_sharded(updates, shards, group["ns_steps"], group["ns_path"],
                                      graph=_graph_choice(group))
        local_params = [local_tensor(p) for p in params]
        if group["weight_decay"]:
            torch._foreach_mul_(local_params, 1 - lr * group["weight_decay"])
        for p, lp, o in zip(params, local_params, ortho):
            if lp.numel():
                lp.add_(o, alpha=-lr * update_scale(p.shape))


def owners(shapes: list[tuple[int, int]], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: largest first (Newton-Schulz costs about
    rows * cols * min(rows, cols)), each to the rank with the least work so far; the same on
    every rank, since it depends on the global shapes only."""
    load = [0] * world
    owner = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: -(shapes[i][0] * shapes[i][1] * min(shapes[i])))
    for i in order:
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += shapes[i][0] * shapes[i][1] * min(shapes[i])
    return owner


def orthogonalize_sharded(updates: list[torch.Tensor], shards: list, steps: int, path: str,
                          graph: bool | None = False) -> list[torch.Tensor]:
    """Newton-Schulz of whole matrices whose rows are spread over a process group; returns each
    rank's rows of every result. ``updates[i]`` are this rank's rows of matrix i, ``shards[i]``
    its RowShard. Two all-to-alls; each rank orthogonalises the matrices ``owners`` gives it."""
    import torch.distributed as dist

    group, world, rank = shards[0].group, shards[0].world, shards[0].index
    if group is None or world == 1:  # every rank holds whole matrices
        return _orthogonalize_batched(updates, steps, path, graph)
    shapes = [tuple(s.global_shape) for s in shards]
    owner = owners(shapes, world)
    per = [-(-rows // world) * cols for rows, cols in shapes]  # elements of one padded row chunk
    dtype = torch.float32 if any(u.dtype == torch.float32 for u in updates) else updates[0].dtype
    device = updates[0].device
    # Rank r sends to rank d its padded rows of every matrix d owns, in matrix order.
    send_sizes = [sum(per[i] for i in range(len(shapes)) if owner[i] == d) for d in range(world)]
    mine = [i for i in range(len(shapes)) if owner[i] == rank]
    recv_sizes = [sum(per[i] for i in mine)] * world
    send = torch.zeros(sum(send_sizes), dtype=dtype, device=device)
    offset = 0
    for d in range(world):
        for i in (j for j in range(len(shapes)) if owner[j] == d):
            rows = updates[i].reshape(-1)
            send[offset:offset + rows.numel()].copy_(rows)
            offset += per[i]
    recv = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
    # Matrix i of mine: rank s's chunk sits at s * recv_sizes[0] + (offset of i among mine).
    chunks = recv.view(world, -1)
    whole, at = [], 0
    for i in mine:
        rows, cols = shapes[i]
        whole.append(chunks[:, at:at + per[i]].reshape(-1, cols)[:rows])
        at += per[i]
    results = _orthogonalize_batched(whole, steps, path, graph)
    # Back: rank d gets its padded chunk of every matrix this rank owns, then sends its own.
    back = torch.zeros(world, recv_sizes[0], dtype=dtype, device=device)
    at = 0
    for i, o in zip(mine, results):
        rows, cols = shapes[i]
        padded = torch.zeros(per[i] * world // cols, cols, dtype=dtype, device=device)
        padded[:rows].copy_(o)
        back[:, at:at + per[i]].copy_(padded.view(world, -1))
        at += per[i]
    returned = torch.empty(sum(send_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(returned, back.view(-1), send_sizes, recv_sizes, group=group)
    out, offset = [None] * len(shapes), 0
    for d in range(world):
        for i in (j for j in range(len(shapes)) if owner[j] == d):
            n = updates[i].numel()
            out[i] = returned[offset:offset + n].view(updates[i].shape).to(updates[i].dtype)
            offset += per[i]
    return out


def _orthogonalize_batched(matrices: list[torch.Tensor], steps: int, path: str,
                           graph: bool | None = False) -> list[torch.Tensor]:
    """Newton-Schulz of each matrix, those of one shape and dtype in one batched call."""
    results: list[torch.Tensor | None] = [None] * len(matrices)
    by_shape: dict[tuple, list[int]] = {}
    for i, m in enumerate(matrices):
        by_shape.setdefault((tuple(m.shape), m.dtype), []).append(i)
    for indices in by_shape.values():
        stacked = torch.stack([matrices[i] for i in indices])
        ortho = newton_schulz(stacked, steps, path=path, check_finite=False, graph=graph)
        for i, o in zip(indices, ortho.unbind(0)):
            results[i] = o
    return results


class MuonReference(_MuonBase):
    """The same algorithm in plain PyTorch, one parameter at a time (the parity reference)."""

    adamw_backend = "torch.optim.AdamW"

    def _make_adamw(self, groups: list[dict]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(groups, foreach=False)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None or not self.uses_muon(group, p):
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                ortho = newton_schulz_ref(update.to(torch.bfloat16), group["ns_steps"]).to(p.dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(ortho, alpha=-lr * update_scale(p.shape))
        self._adamw_step()
        return loss
