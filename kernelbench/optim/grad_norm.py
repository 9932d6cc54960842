"""Gradient clipping fused into an optimizer step (``max_grad_norm=`` of TritonAdamW, AdamMini and
ShardedAdamW).

Math, as ``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` with
``error_if_nonfinite=False``:

    total_norm = sqrt(sum over every gradient element of g^2)          (fp32 accumulation)
    clip_coef  = (1 / (total_norm + 1e-6)) * max_norm                  (torch's float / tensor)
    coef       = min(clip_coef, 1)                                     (NaN stays NaN)

and the update kernels read ``g * coef`` (in fp32) where they load g, instead of torch's second
pass that scales every gradient in place before the optimizer reads it a third time. A NaN or Inf
gradient gives a NaN or Inf norm, hence a NaN or 0 coefficient, and NaN parameters, as torch's
clip-then-step does. bf16 gradients: g * coef stays fp32 here, where torch rounds it back into the
bf16 ``p.grad`` (and rounds its per-tensor norms to bf16), so bf16 runs agree to bf16 tolerance.

The sum of squares is one launch per optimizer launch plan, reading the plan's own table (one
64-byte row per tensor with the gradient's address in column 1, its size in column 6 and its first
program in column 7, then each program's tensor: the layout TritonAdamW's and AdamMini's plans
share); each program writes one partial sum. One tiny launch then sums the partials and writes the
norm and the coefficient, on the device: no host synchronisation. Sharded parameters (FSDP2,
ShardedAdamW): the local sum of squares is all-reduced (SUM) over the process group between the
two, one scalar collective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from ._triton_utils import TABLE_STRIDE_C, _aligned, upload_int64

# Columns of a launch-table row the sum of squares reads (shared by TritonAdamW's and AdamMini's plans).
_G, _SIZE, _FIRST = tl.constexpr(1), tl.constexpr(6), tl.constexpr(7)
# Gradient elements one program of the sum of squares reads at least: a plan's programs cover 1024
# (TritonAdamW) to a few thousand elements, and a partial per 1024 would be a visible extra write.
ELEMS_PER_PROGRAM = 8192
# Widest vector of one loop iteration.
MAX_CHUNK = 4096
# Partials one iteration of the finishing kernel sums.
FINISH_BLOCK = 1024


def check_max_grad_norm(max_grad_norm: Any, who: str) -> float | None:
    """None (no clipping) or a finite float > 0; anything else is one clear error."""
    if max_grad_norm is None:
        return None
    if isinstance(max_grad_norm, torch.Tensor) or isinstance(max_grad_norm, bool):
        raise ValueError(f"{who}: max_grad_norm must be a Python float > 0 or None, got {max_grad_norm!r}.")
    try:
        value = float(max_grad_norm)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: max_grad_norm must be a Python float > 0 or None, got {max_grad_norm!r}.") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{who}: max_grad_norm must be finite and > 0 (or None: no clipping), got {value!r}.")
    return value


@triton.jit
def _sum_squares_kernel(
    table_ptr,  # int64 [TABLE_STRIDE per tensor | n_units tensor ids]: a plan's launch table
    n_tensors, n_units,
    partials_ptr,  # fp32 [programs]: this launch's slice of the partial sums
    DTYPE: tl.constexpr,  # the gradients' element type
    UNIT: tl.constexpr,  # elements per unit (one program of the plan's own update launch)
    SIZE_MULT: tl.constexpr,  # elements per count in the size column (AdamMini counts blocks)
    CHUNK: tl.constexpr,  # elements per loop iteration, a power of two
    UNITS_PER_PROGRAM: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for j in range(UNITS_PER_PROGRAM):
        unit = pid * UNITS_PER_PROGRAM + j
        valid = unit < n_units
        tensor = tl.load(table_ptr + TABLE_STRIDE_C * n_tensors + unit, mask=valid, other=0)
        row = table_ptr + tensor * TABLE_STRIDE_C
        g_ptr = _aligned(tl.load(row + _G), tl.pointer_type(DTYPE), ALIGNED)
        numel = tl.where(valid, tl.load(row + _SIZE) * SIZE_MULT, 0)
        start = (unit - tl.load(row + _FIRST)) * UNIT
        for c in range(0, UNIT, CHUNK):
            offs = start + c + lanes
            mask = offs < numel
            if UNIT % CHUNK != 0:
                mask = mask & (c + lanes < UNIT)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            acc += g * g
    tl.store(partials_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _finish_kernel(
    partials_ptr, n_partials,  # fp32 partial sums of squares
    sq_ptr,  # fp32 0-d: the sum of squares (written with SUM, read otherwise)
    norm_ptr, coef_ptr,  # fp32 0-d outputs (with COEF)
    max_norm,  # fp32
    SUM: tl.constexpr, COEF: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program. SUM: sum the partials into sq. COEF: the norm and the clip coefficient from sq,
    with torch's roundings (reciprocal, then times max_norm; a NaN coefficient is kept)."""
    if SUM:
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_partials, BLOCK):
            acc += tl.load(partials_ptr + start + lanes, mask=start + lanes < n_partials, other=0.0)
        sq = tl.sum(acc, axis=0)
        if not COEF:
            tl.store(sq_ptr, sq)
    else:
        sq = tl.load(sq_ptr)
    if COEF:
        norm = tl.sqrt_rn(sq)
        coef = tl.div_rn(1.0, norm + 1e-6) * max_norm
        coef = tl.where(coef > 1.0, 1.0, coef)
        tl.store(norm_ptr, norm)
        tl.store(coef_ptr, coef)


@dataclass(frozen=True)
class NormSource:
    """One launch of the sum of squares: a plan's table and how to read it."""

    table: torch.Tensor
    n_tensors: int
    n_units: int  # entries of the table's program map
    dtype: torch.dtype
    unit: int  # elements per entry of the program map
    size_mult: int = 1
    aligned: bool = False

    @property
    def programs(self) -> int:
        return triton.cdiv(self.n_units, self.units_per_program)

    @property
    def units_per_program(self) -> int:
        return max(1, ELEMS_PER_PROGRAM // self.unit)


_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}


class FlatTable:
    """A launch table over flat 1-D tensors (ShardedAdamW's gradient shards), in the plans' layout,
    with one program-map entry per ``unit`` elements."""

    def __init__(self, tensors: Sequence[torch.Tensor], unit: int) -> None:
        rows: list[int] = []
        program_tensor: list[int] = []
        for i, t in enumerate(tensors):
            rows += [0, t.data_ptr(), 0, 0, 0, 0, t.numel(), len(program_tensor)]
            program_tensor.extend([i] * triton.cdiv(t.numel(), unit))
        self.source = NormSource(upload_int64(rows + program_tensor, tensors[0].device), len(tensors),
                                 len(program_tensor), tensors[0].dtype, unit,
                                 aligned=all(t.data_ptr() % 16 == 0 for t in tensors))


class FusedClip:
    """The norm and the clip coefficient of one optimizer: its buffers, and the launches that
    fill them. ``coefficient(sources)`` returns the 0-d fp32 coefficient on the device; ``norm``
    then holds the pre-clip total norm (0-d fp32)."""

    def __init__(self, max_norm: float, device: torch.device) -> None:
        self.max_norm = max_norm
        self.sq = torch.zeros((), dtype=torch.float32, device=device)
        self.norm = torch.zeros((), dtype=torch.float32, device=device)
        self.coef = torch.ones((), dtype=torch.float32, device=device)
        self._partials = torch.zeros(1, dtype=torch.float32, device=device)

    def coefficient(self, sources: Sequence[NormSource], *, local_sq: Sequence[torch.Tensor] = (),
                    process_group: Any = None) -> torch.Tensor:
        """``sources``: the launches over this rank's gradients; ``local_sq``: further 0-d fp32 sums
        of squares computed elsewhere; ``process_group``: all-reduce the sum over it (None: local)."""
        total = sum(s.programs for s in sources)
        if self._partials.numel() < total:
            self._partials = torch.zeros(total, dtype=torch.float32, device=self.sq.device)
        offset = 0
        for s in sources:
            if s.n_units == 0:
                continue
            chunk = min(triton.next_power_of_2(s.unit), MAX_CHUNK)
            _sum_squares_kernel[(s.programs,)](
                s.table, s.n_tensors, s.n_units, self._partials[offset:],
                DTYPE=_TL[s.dtype], UNIT=s.unit, SIZE_MULT=s.size_mult, CHUNK=chunk,
                UNITS_PER_PROGRAM=s.units_per_program, ALIGNED=s.aligned, num_warps=4)
            offset += s.programs
        one_launch = not local_sq and process_group is None
        _finish_kernel[(1,)](self._partials, offset, self.sq, self.norm, self.coef, self.max_norm,
                             SUM=True, COEF=one_launch, BLOCK=FINISH_BLOCK, num_warps=4)
        if one_launch:
            return self.coef
        for extra in local_sq:
            self.sq.add_(extra)
        if process_group is not None:
            import torch.distributed as dist

            dist.all_reduce(self.sq, op=dist.ReduceOp.SUM, group=process_group)
        _finish_kernel[(1,)](self._partials, 0, self.sq, self.norm, self.coef, self.max_norm,
                             SUM=False, COEF=True, BLOCK=FINISH_BLOCK, num_warps=4)
        return self.coef


def one_process_group(groups: Sequence[Any], who: str) -> Any:
    """The one process group the parameters' sums of squares are reduced over (None: none); a mix
    of sharded and unsharded parameters, or of several groups, would count some elements several
    times, so it is an error."""
    found = list(dict.fromkeys(groups))
    if len(found) > 1:
        raise ValueError(f"{who}: max_grad_norm needs every parameter sharded over one process group (or none); "
                         f"these parameters span {len(found)} (plain and sharded, or several meshes). Clip with "
                         "torch.nn.utils.clip_grad_norm_ instead.")
    return found[0] if found else None


def clip_grad_norm_ref(grads: Sequence[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-PyTorch reference: (total norm, clamped coefficient) as clip_grad_norm_ computes them."""
    norms = torch._foreach_norm(list(grads), 2.0)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)
    return total, torch.clamp(max_norm / (total + 1e-6), max=1.0)


__all__ = ["FlatTable", "FusedClip", "NormSource", "check_max_grad_norm", "clip_grad_norm_ref",
           "one_process_group"]
