"""What the Triton optimizers hand their kernels: plain local tensors, checked, and where a
sharded parameter's local rows sit in the whole.

Memory safety. A kernel reads raw addresses from a launch table, so every tensor whose address goes
into one passes ``check_kernel_tensor`` first: a plain ``torch.Tensor`` / ``nn.Parameter`` (a
tensor subclass such as DTensor or a fake tensor reports an address that is not its data), not a
meta tensor (no storage at all), on the device the launch runs on, and with storage large enough for
every element its sizes and strides reach.

Sharded parameters. ``fully_shard`` (FSDP2) hands an optimizer DTensor parameters sharded on dim 0:
on the mesh dimension that shards, coordinate r of W holds rows [r * c, min((r + 1) * c, R)) of the
R rows, c = ceil(R / W) (torch.chunk's split; trailing coordinates may hold none), and the
gradient is a DTensor of the same layout. Other mesh dimensions may replicate (HSDP). The
optimizers step ``to_local()`` of each parameter, gradient and state tensor; whatever needs more
than the local rows goes through the process group of the sharding mesh dimension, and only it.
Any other layout (tensor parallelism's Shard(1), Partial, a strided shard) is a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


DTENSOR = _dtensor_type()


def is_dtensor(t: Any) -> bool:
    return DTENSOR is not None and isinstance(t, DTENSOR)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (``to_local()``), or ``t`` itself."""
    return t.to_local() if is_dtensor(t) else t


@dataclass(frozen=True)
class RowShard:
    """This rank's rows of a parameter sharded on dim 0, and the group that holds the others."""

    global_shape: tuple[int, ...]
    row_start: int
    rows: int
    group: Any  # torch.distributed.ProcessGroup of the sharding mesh dimension
    world: int
    index: int  # this rank's coordinate on that mesh dimension
    spec: Any  # (mesh, placements) as the DTensor carries them, to build state of the same layout

    @property
    def row_numel(self) -> int:
        return math.prod(self.global_shape[1:])

    @property
    def flat_start(self) -> int:
        """Index in the flattened whole parameter of this rank's first element."""
        return self.row_start * self.row_numel

    @property
    def flat_stop(self) -> int:
        return (self.row_start + self.rows) * self.row_numel


def chunk_rows(total: int, world: int, index: int) -> tuple[int, int]:
    """(first row, rows) of coordinate ``index`` when ``total`` rows are split as torch.chunk does."""
    per = -(-total // world) if total else 0
    start = min(index * per, total)
    return start, max(0, min(start + per, total) - start)


def row_shard(p: torch.Tensor, label: str, who: str) -> RowShard | None:
    """None for a plain tensor; for a DTensor sharded on dim 0 (FSDP2, HSDP), its layout; any other
    DTensor layout or tensor subclass is an error naming ``label``."""
    if type(p) in _PLAIN_TYPES:
        return None
    if not is_dtensor(p):
        raise TypeError(f"{who}: {label} is a {type(p).__module__}.{type(p).__qualname__}, a tensor subclass the "
                        "Triton kernels cannot read; accepted: plain tensors (nn.Parameter) and the DTensor "
                        "parameters of torch.distributed.fsdp.fully_shard (sharded on dim 0).")
    from torch.distributed.tensor import Replicate, Shard

    mesh, placements = p.device_mesh, tuple(p.placements)
    sharding = [d for d, pl in enumerate(placements) if not isinstance(pl, Replicate)]
    bad = [pl for pl in placements if not (isinstance(pl, Replicate) or type(pl) is Shard and pl.dim == 0)]
    if bad or len(sharding) > 1 or p.dim() == 0:
        raise ValueError(f"{who}: {label} is a DTensor with placements {placements}; accepted: Shard(0) on one mesh "
                         "dimension (fully_shard), Replicate on the others. Tensor parallelism (Shard(1), Partial, "
                         "strided shards) is not supported.")
    if not sharding:  # replicated everywhere: every rank holds the whole tensor
        return RowShard(tuple(p.shape), 0, p.shape[0], None, 1, 0, (mesh, placements))
    dim = sharding[0]
    world, index = mesh.size(dim), mesh.get_local_rank(dim)
    start, rows = chunk_rows(p.shape[0], world, index)
    local = p.to_local()
    if tuple(local.shape) != (rows, *p.shape[1:]):
        raise ValueError(f"{who}: {label} holds local rows of shape {tuple(local.shape)} on mesh coordinate {index} "
                         f"of {world}, but an even dim-0 split (torch.chunk) gives {(rows, *p.shape[1:])}; custom "
                         "shard placements are not supported.")
    return RowShard(tuple(p.shape), start, rows, mesh.get_group(dim), world, index, (mesh, placements))


def check_like_param(label: str, p: torch.Tensor, t: torch.Tensor, who: str, what: str = "gradient") -> None:
    """A DTensor parameter's gradient (or state, ``what``) must be a DTensor of the same mesh and
    placements, and a plain parameter's a plain tensor."""
    if is_dtensor(p) != is_dtensor(t):
        raise TypeError(f"{who}: {label} is a {type(p).__name__} but its {what} is a {type(t).__name__}; "
                        "both must be DTensors of one layout (fully_shard) or both plain tensors.")
    if is_dtensor(p) and (t.device_mesh != p.device_mesh or tuple(t.placements) != tuple(p.placements)):
        raise ValueError(f"{who}: {label} has placements {tuple(p.placements)} but its {what} "
                         f"{tuple(t.placements)} (or another mesh); they must match.")


def check_kernel_tensor(t: torch.Tensor, what: str, device: torch.device, who: str) -> None:
    """Raise unless ``t``'s address may go to a kernel running on ``device`` (module docstring)."""
    if type(t) not in _PLAIN_TYPES:
        raise TypeError(f"{who}: {what} is a {type(t).__module__}.{type(t).__qualname__}; the kernels take plain "
                        "tensors only (DTensor parameters of fully_shard are stepped through their local shards).")
    if t.device.type == "meta":
        raise ValueError(f"{who}: {what} is a meta tensor (no storage); materialise the model first "
                         "(module.to_empty(device=...) and initialise it) before step().")
    if t.device != device:
        raise ValueError(f"{who}: {what} is on {t.device} but this launch runs on {device}; every tensor of a "
                         "parameter group must be on one device.")
    if t.numel() == 0:
        return
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    needed = (last + 1) * t.element_size()
    have = t.untyped_storage().nbytes()
    if have < needed or any(s < 0 for s in t.stride()):
        raise ValueError(f"{who}: {what} is a view reaching byte {needed} of a storage of {have} bytes (offset "
                         f"{t.storage_offset()}, strides {t.stride()}); pass a tensor whose storage holds it.")


def like_param(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """State of a parameter's layout: ``local`` as a DTensor of ``p``'s mesh and placements when ``p``
    is one (its global shape then is ``p``'s with dim 0 as sharded), else ``local``."""
    if not is_dtensor(p):
        return local
    return DTENSOR.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=torch.Size((p.shape[0], *local.shape[1:])),
                              stride=_contiguous_strides((p.shape[0], *local.shape[1:])))


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for n in reversed(shape):
        strides.append(running)
        running *= max(n, 1)
    return tuple(reversed(strides))
