"""AdamMini's host side: the launch configuration, launch plans (a table per launch of segments
that share a dtype, a block length and a state dtype), the step-counter table, the launch of the
update kernels, and the plans of blocks whose statistics are reduced across ranks (FSDP2).
Kernels, the fp8 format and the telemetry: ``kernels.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._triton_utils import (
    TABLE_STRIDE,
    TL_DTYPE,
    f64_bits,
    interpreting,
    log_or_neg_inf,
    refuse_rebuild_while_capturing,
    upload_int64,
)
from ..adamw.host import reciprocal_in_fp64
from ..grad_norm import NormSource
from .kernels import (
    _CM_AMAX,
    _CM_SUM,
    _G,
    _PC_AMAX,
    _PC_G,
    _PC_SUM,
    _STEP,
    M_BF16,
    M_FP8,
    M_FP32,
    PIECE_STRIDE,
    _adam_mini_apply_kernel,
    _adam_mini_block_kernel,
    _adam_mini_commit_kernel,
    _adam_mini_partial_kernel,
    _adam_mini_rows_kernel,
)
from .partition import Segment

# State format: elements per fp8 scale block of a block longer than one program's tile (a
# checkpoint's m_scale is laid out by it), so fp8 state needs tile == FP8_SCALE_BLOCK.
FP8_SCALE_BLOCK = 4096


@dataclass(frozen=True)
class LaunchConfig:
    """How the update kernels are launched: tuning only, except that fp8 state needs
    ``tile == FP8_SCALE_BLOCK`` (its scale blocks are tiles).

    tile: elements one program holds in registers: rows of up to tile / 2 elements share a
        program (``_adam_mini_rows_kernel``), longer blocks get one program each and loop over
        tile-element chunks (``_adam_mini_block_kernel``).
    num_warps: warps per program. 4096 / 8 is 16 elements per thread (four 16-byte fp32 vectors
        per stream); these kernels compile to 40-130 registers there (254 for the L = 1 Adam
        blocks), so several programs share an SM, unlike TritonAdamW's one-program-per-SM kernel.
    """

    tile: int = 4096
    num_warps: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.tile, int) or self.tile < 16 or self.tile & (self.tile - 1):
            raise ValueError(f"AdamMini LaunchConfig: tile={self.tile!r}; accepted: a power of two >= 16.")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"AdamMini LaunchConfig: num_warps={self.num_warps!r}; accepted: 1, 2, 4, 8, 16, 32.")


DEFAULT_LAUNCH = LaunchConfig()

# State dtype name -> a kernel's M_KIND, and M_KIND -> the element type of m.
M_KINDS = {"fp32": M_FP32, "bf16": M_BF16, "fp8": M_FP8}
_M_TL_DTYPE = {M_FP32: tl.float32, M_BF16: tl.bfloat16, M_FP8: tl.float8e4nv}


def scale_blocks(seg: Segment, tile: int) -> int:
    """fp8 scale slots of a runs segment: one per block, or one per tile of a longer block."""
    return seg.n_blocks * (triton.cdiv(seg.block_len, tile) if seg.block_len > tile else 1)


class LaunchPlan:
    """Table, telemetry buffer and launch arguments of one launch: segments of one group's
    parameters that share a dtype, a block length and a state dtype."""

    table_stride = TABLE_STRIDE
    step_column = _STEP.value

    def __init__(self, key: tuple, params: list[torch.Tensor], grads: list[torch.Tensor], states: list[dict],
                 segments: list[Segment], scale_offsets: list[int], m_kind: int, config: LaunchConfig) -> None:
        device = params[0].device
        block_len = segments[0].block_len
        self.key = key
        self.block_len = block_len
        self.cols = triton.next_power_of_2(block_len)
        self.rows = max(1, config.tile // self.cols)
        self.per_block = self.rows == 1  # one program per block: _adam_mini_block_kernel
        self.m_kind = m_kind
        self.config = config
        table: list[int] = []
        program_tensor: list[int] = []
        vector_addresses = []
        self.program_ranges = []
        for i, (p, g, s, seg, scale_offset) in enumerate(zip(params, grads, states, segments, scale_offsets)):
            m = s["m_fp8"] if m_kind == M_FP8 else s["m"]
            vmean = s["v"] if "v" in s else s["vmean"]
            if m_kind == M_FP8:
                scale_addr = s["m_scale"].data_ptr() + 4 * scale_offset
            else:
                scale_addr = s["step"].data_ptr()  # any valid address when unused
            programs = seg.n_blocks if self.per_block else triton.cdiv(seg.n_blocks, self.rows)
            p_addr = p.data_ptr() + seg.start * p.element_size()
            g_addr = g.data_ptr() + seg.start * g.element_size()
            m_addr = m.data_ptr() + seg.start * m.element_size()
            vector_addresses += [p_addr, g_addr, m_addr]
            # columns _P, _G, _M, _SCALE, _VMEAN, _STEP, _NBLOCKS, _FIRST
            table += [p_addr, g_addr, m_addr, scale_addr, vmean.data_ptr() + 4 * seg.block_offset,
                      s["step"].data_ptr(), seg.n_blocks, len(program_tensor)]
            self.program_ranges.append((len(program_tensor), len(program_tensor) + programs))
            program_tensor.extend([i] * programs)
        self.params = params
        self.grad_ptrs = tuple(g.data_ptr() for g in grads)
        self._grad_offsets = [seg.start * g.element_size() for g, seg in zip(grads, segments)]
        self.n_tensors = len(params)
        self.n_programs = len(program_tensor)
        self.step_addresses = [s["step"].data_ptr() for s in states]
        self.aligned = all(a % 16 == 0 for a in vector_addresses)
        self.device = device
        self.table = upload_int64(table + program_tensor, device)
        self.telemetry = torch.zeros(2, self.n_programs, dtype=torch.float32, device=device)
        self.grid = (self.n_programs,)
        self.scalars_key: tuple | None = None  # the group's hyperparameters that scalars were made from
        self.scalars: tuple = ()

    def norm_source(self, dtype: torch.dtype) -> NormSource:
        """The sum of squares of this plan's gradient segments, read through its table (a unit is one
        program of the update launch: ``rows`` blocks, or one block)."""
        unit = self.block_len if self.per_block else self.rows * self.block_len
        return NormSource(self.table, self.n_tensors, self.n_programs, dtype, unit, size_mult=self.block_len,
                          aligned=self.aligned)

    def repoint_grads(self, grad_ptrs: tuple, check: Callable[[int], None]) -> bool:
        """Point the table at new gradient tensors (a backward after ``zero_grad(set_to_none=True)``,
        torch's default, allocates them anew): only the gradient column is rewritten, not the
        per-program map, whose size grows with the parameter count. ``check(i)`` validates the
        i-th new gradient. False when the plan must be rebuilt instead (a gradient that breaks
        the alignment the kernels were built for)."""
        if grad_ptrs == self.grad_ptrs:
            return True
        addresses = [ptr + offset for ptr, offset in zip(grad_ptrs, self._grad_offsets)]
        if self.aligned and any(a % 16 for a in addresses):
            return False
        refuse_rebuild_while_capturing("AdamMini")
        for i, (old, new) in enumerate(zip(self.grad_ptrs, grad_ptrs)):
            if old != new:
                check(i)
        column = self.table[_G.value: self.n_tensors * TABLE_STRIDE: TABLE_STRIDE]
        column.copy_(upload_int64(addresses, self.table.device))
        self.grad_ptrs = grad_ptrs
        return True


class StepTable:
    """Every step counter of one step's launches, each once (a parameter of several segments
    sits in several table rows but has one counter): what StepIncrementer takes for one plan."""

    table_stride = 1
    step_column = 0

    def __init__(self, plans: Sequence[LaunchPlan]) -> None:
        addresses = list(dict.fromkeys(a for plan in plans for a in plan.step_addresses))
        self.plans = tuple(plans)
        self.step_addresses = addresses
        self.n_tensors = len(addresses)
        self.table = upload_int64(addresses, plans[0].device)


def launch(plan: LaunchPlan, group: dict, dtype: torch.dtype, clip: torch.Tensor | None = None) -> None:
    """One update launch of ``plan`` with ``group``'s hyperparameters (step counters already
    incremented), the gradients scaled by ``clip`` (0-d fp32) when given. Hyperparameters are read
    every step (LR schedulers), converted only when they change."""
    scalars_key = (group["lr"], group["betas"], group["eps"], group["weight_decay"])
    if plan.scalars_key != scalars_key:
        lr = float(group["lr"])
        beta1, beta2 = group["betas"]
        plan.scalars = (plan.n_tensors, plan.n_programs,
                        lr, 1.0 - lr * group["weight_decay"], 1.0 - beta1, beta2, 1.0 - beta2, group["eps"],
                        f64_bits(log_or_neg_inf(beta1)), f64_bits(log_or_neg_inf(beta2)))
        plan.constexprs = dict(
            DTYPE=TL_DTYPE[dtype], M_DTYPE=_M_TL_DTYPE[plan.m_kind], M_KIND=plan.m_kind,
            BLOCK_LEN=plan.block_len, ALIGNED=plan.aligned, INV_BC2_FP64=reciprocal_in_fp64(plan.table.device),
            EMULATE_E4M3=interpreting(), num_warps=plan.config.num_warps, enable_fp_fusion=False)
        if plan.per_block:
            plan.constexprs["CHUNK"] = plan.config.tile
        else:
            plan.constexprs.update(COLS=plan.cols, ROWS=plan.rows)
        plan.scalars_key = scalars_key
    kernel = _adam_mini_block_kernel if plan.per_block else _adam_mini_rows_kernel
    # Unclipped, the coefficient's slot takes the telemetry buffer: any pointer, never read.
    kernel[plan.grid](plan.table, plan.telemetry, plan.telemetry if clip is None else clip, *plan.scalars,
                      HAS_CLIP=clip is not None, **plan.constexprs)


# Elements of a commit row's blocks (and scales) one iteration of the commit kernel handles.
COMMIT_BLOCK = 1024


def _f32_bits(x: float) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class ShardedEntry:
    """One parameter of a reduced-statistics launch: the local tensors and where they sit."""

    params: torch.Tensor  # local param (rows flat_start / row_numel onwards of the whole)
    grad: torch.Tensor  # local gradient
    m: torch.Tensor  # local m (fp32 / bf16 / fp8), the parameter's layout
    vmean: torch.Tensor  # replicated vmean, the single-GPU layout
    scale: torch.Tensor | None  # replicated fp8 scales, the single-GPU layout
    step: torch.Tensor
    segments: tuple[Segment, ...]
    flat_start: int  # index in the flattened whole parameter of the first local element
    flat_stop: int


class ShardedPlan:
    """Pieces, commit rows, reduction slots and telemetry of the reduced-statistics launches of one
    group's parameters that share a dtype and a state dtype (see the comment above the
    reduced-statistics kernels in ``kernels.py``).

    Every rank enumerates the same blocks and scale blocks in the same order, so slot i means the
    same block everywhere; ``sums`` and ``amax`` are what the caller all-reduces between
    ``partial`` and ``apply``."""

    def __init__(self, key: tuple, entries: list[ShardedEntry], m_kind: int, tile: int) -> None:
        self.key, self.m_kind, self.tile = key, m_kind, tile
        device = entries[0].step.device
        pieces: list[list[int]] = []
        commits: list[list[int]] = []
        n_slots = n_scales = 0
        self.params, self.program_ranges = [], []
        for e in entries:
            scale_offset = 0
            first_piece = len(pieces)
            for seg in e.segments:
                L = seg.block_len
                per_block = triton.cdiv(L, tile) if L > tile else 1
                inv_len = _f32_bits(1.0 / L)
                commits.append([e.vmean.data_ptr() + 4 * seg.block_offset, n_slots, seg.n_blocks, inv_len,
                                (e.scale.data_ptr() + 4 * scale_offset) if e.scale is not None else 0,
                                n_scales, seg.n_blocks * per_block if e.scale is not None else 0])
                lo, hi = max(seg.start, e.flat_start), min(seg.stop, e.flat_stop)
                if lo < hi:
                    for b in range((lo - seg.start) // L, (hi - 1 - seg.start) // L + 1):
                        b0 = seg.start + b * L
                        start, stop = max(b0, lo), min(b0 + L, hi)
                        local = start - e.flat_start
                        pieces.append([
                            e.params.data_ptr() + local * e.params.element_size(),
                            local * e.grad.element_size(),  # rebased on the gradient in bind()
                            e.m.data_ptr() + local * e.m.element_size(),
                            (e.scale.data_ptr() + 4 * (scale_offset + b * per_block)) if e.scale is not None
                            else e.step.data_ptr(),
                            n_scales + b * per_block,  # rebased on the max buffer in bind()
                            e.vmean.data_ptr() + 4 * (seg.block_offset + b),
                            n_slots + b,  # rebased on the sum buffer in bind()
                            e.step.data_ptr(), start - b0, stop - start, inv_len])
                n_slots += seg.n_blocks
                if e.scale is not None:
                    scale_offset += seg.n_blocks * per_block
                    n_scales += seg.n_blocks * per_block
            self.params.append(e.params)
            self.program_ranges.append((first_piece, len(pieces)))
        self._pieces, self._commits = pieces, commits
        self.n_slots, self.n_scales = n_slots, n_scales
        self.n_pieces = len(pieces)
        self.grad_ptrs = tuple(e.grad.data_ptr() for e in entries)
        self._piece_entry = [i for i, (a, b) in enumerate(self.program_ranges) for _ in range(b - a)]
        self.step_addresses = [e.step.data_ptr() for e in entries]
        self.telemetry = torch.zeros(2, max(1, self.n_pieces), dtype=torch.float32, device=device)
        self.device = device
        self.scalars_key: tuple | None = None
        self.sums: torch.Tensor | None = None
        self.amax: torch.Tensor | None = None

    def bind(self, sums: torch.Tensor, amax: torch.Tensor | None) -> None:
        """Point the tables at this plan's slots in the caller's reduction buffers (views)."""
        self.sums, self.amax = sums, amax
        rows = []
        for piece, grad_ptr in zip(self._pieces, (self.grad_ptrs[i] for i in self._piece_entry)):
            row = list(piece)
            row[_PC_G.value] = grad_ptr + piece[_PC_G.value]
            row[_PC_SUM.value] = sums.data_ptr() + 4 * piece[_PC_SUM.value]
            row[_PC_AMAX.value] = (amax.data_ptr() + 4 * piece[_PC_AMAX.value]) if amax is not None \
                else sums.data_ptr()
            rows += row + [0] * (PIECE_STRIDE - len(row))
        self.table = upload_int64(rows, self.device) if rows else None
        commit_rows = []
        for c in self._commits:
            row = list(c)
            row[_CM_SUM.value] = sums.data_ptr() + 4 * c[_CM_SUM.value]
            row[_CM_AMAX.value] = (amax.data_ptr() + 4 * c[_CM_AMAX.value]) if amax is not None else 0
            commit_rows += row + [0] * (PIECE_STRIDE - len(row))
        self.commit_table = upload_int64(commit_rows, self.device)

    def repoint_grads(self, grad_ptrs: tuple) -> None:
        """New gradient tensors (FSDP2 hands out new ones every step): rewrite the gradient column."""
        if grad_ptrs == self.grad_ptrs:
            return
        refuse_rebuild_while_capturing("AdamMini")
        self.grad_ptrs = grad_ptrs
        if self.table is None:
            return
        column = self.table[_PC_G.value: self.n_pieces * PIECE_STRIDE: PIECE_STRIDE]
        column.copy_(upload_int64([grad_ptrs[i] + piece[_PC_G.value]
                                   for piece, i in zip(self._pieces, self._piece_entry)], self.device))

    def _scalars(self, group: dict, dtype: torch.dtype) -> None:
        scalars_key = (group["lr"], group["betas"], group["eps"], group["weight_decay"])
        if self.scalars_key == scalars_key:
            return
        lr = float(group["lr"])
        beta1, beta2 = group["betas"]
        self.lerp_weight, self.beta2, self.sq_weight = 1.0 - beta1, beta2, 1.0 - beta2
        self.apply_args = (self.n_pieces, lr, 1.0 - lr * group["weight_decay"],
                           1.0 - beta1, beta2, 1.0 - beta2, group["eps"],
                           f64_bits(log_or_neg_inf(beta1)), f64_bits(log_or_neg_inf(beta2)))
        self.constexprs = dict(DTYPE=TL_DTYPE[dtype], M_DTYPE=_M_TL_DTYPE[self.m_kind], M_KIND=self.m_kind,
                               TILE=self.tile)
        self.scalars_key = scalars_key

    def partial(self, group: dict, dtype: torch.dtype, clip: torch.Tensor | None = None) -> None:
        self._scalars(group, dtype)
        if self.n_pieces:
            # No contraction, as in apply: m must round the same in both, or the scales would not match.
            _adam_mini_partial_kernel[(self.n_pieces,)](
                self.table, self.telemetry if clip is None else clip, self.lerp_weight, **self.constexprs,
                HAS_CLIP=clip is not None, num_warps=8, enable_fp_fusion=False)

    def apply(self, group: dict, dtype: torch.dtype, clip: torch.Tensor | None = None) -> None:
        self._scalars(group, dtype)
        if self.n_pieces:
            _adam_mini_apply_kernel[(self.n_pieces,)](
                self.table, self.telemetry, self.telemetry if clip is None else clip, *self.apply_args,
                **self.constexprs, INV_BC2_FP64=reciprocal_in_fp64(self.device), EMULATE_E4M3=interpreting(),
                HAS_CLIP=clip is not None, num_warps=8, enable_fp_fusion=False)
        _adam_mini_commit_kernel[(len(self._commits),)](self.commit_table, self.beta2, self.sq_weight,
                                                        M_KIND=self.m_kind, BLOCK=COMMIT_BLOCK, num_warps=4,
                                                        enable_fp_fusion=False)
