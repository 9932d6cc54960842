"""RMSNorm kernels, their launch configurations, the autograd Function and the custom ops.

Math, for a row x of length N (statistics in fp32 whatever the input dtype):

    h      = x + residual                        (only with a residual; stored as the new residual)
    rstd   = 1 / sqrt(mean(h^2) + eps)
    x_hat  = h * rstd
    y      = x_hat * w                           (rounded once, to the input dtype)

    g      = dy * w
    dh     = rstd * (g - x_hat * mean(g * x_hat))   (+ d(new residual) when there is a residual)
    dw     = sum over rows of dy * x_hat          (accumulated in fp32)
    dx = dresidual = dh

Kernels, each launched with a frozen config (``FwdConfig``, ``BwdConfig``; defaults per N from
``fwd_config`` / ``bwd_config``):
- ``_rmsnorm_fwd_kernel``: a row block per program. Rows kept in registers (several rows per
  program when N is small, so a program moves at least 4096 elements) up to N = 2048 and at
  16384; at the other widths two passes, one row per program: the sum of squares chunk by chunk,
  then the row read back from L2 and y written.
- ``_rmsnorm_bwd_kernel``, rows up to 8192 wide: a persistent grid of as many programs per SM as
  can be resident (read from the compiled kernel), loading the next rows while reducing the
  current ones; each program keeps its share of dw in fp32 registers, written once as a row of an
  fp32 (programs, N) partial buffer that ``_sum_rows_kernel`` reduces to dw. Backwards of at most
  32768 elements run as one program that writes dw itself (launch-bound: one launch fewer); on
  the eager path that program recomputes rstd from the saved rows, so the forward keeps none.
- ``_rmsnorm_bwd_wide_kernel``, 8192 < N <= 16384: one row per step, x, g = dy * w and the dw
  accumulator of the whole row in registers, so x and dy are read from HBM once.
- Wider rows: ``_rmsnorm_bwd_kernel`` in two passes per row (dot product, then dx, the row coming
  back from L2) and dw from a column-parallel kernel (``_rmsnorm_dw_kernel``) that reads x and dy
  once more.
- N > 65536 is refused by the Triton path; ``impl="auto"`` falls back to PyTorch there.

Eager launches go through ``kernelbench.fast_launch.CachedLauncher``, one per launch plan keyed by
(shape, strides, dtypes, device, config), so a repeated shape costs no configuration work on the
host; after a plan's first aligned call its ``DirectLaunch`` takes the pointers as ints. The ops
torch.compile traces launch the same kernels and configs through ``wrap_triton``.
The measurements behind the defaults: results/2026-11-22-h200-norm/README.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: impl="auto" resolves to "torch" (autoselect logs it)
    from ._no_triton import tl, triton

from .._device import sm_count
from ..fast_launch import CachedLauncher, DirectLaunch, PlanCache
from . import _inductor_fallbacks
from ._triton_support import (
    acc_dtype,
    compiled_op,
    is_power_of_two,
    real_stand_ins,
    static_int,
    tl_acc,
    why_not_here,
    wrap_triton,
)

MAX_N = 65536
# fp64 is accepted too and computed in fp64 throughout (for gradcheck); the others use fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

# Rows up to this width can stay in registers in the forward (16 warps: 32 fp32 values per thread).
_FWD_SINGLE_PASS_MAX_N = 16384
# Padded widths whose forward takes two passes instead, as (chunk width, num_warps): faster than
# the rows in registers there on an H200 (results/2026-11-22-h200-norm/README.md).
_FWD_TWO_PASS = {4096: (2048, 8), 8192: (4096, 16), 32768: (8192, 32), 65536: (8192, 32)}
# Single-pass rows wider than this load the weight together with x: its latency then hides under
# x's instead of following the reduction (one row per program leaves nothing else to overlap).
_FWD_EARLY_WEIGHT_MIN_N = 4096
# The backward holds x, dy and the dw accumulator per element, three times the forward's
# registers, so it keeps rows in registers only up to half the forward's width.
_BWD_SINGLE_PASS_MAX_N = 8192
# Up to this width the wide backward keeps a whole row in registers at 32 warps (64 registers a
# thread, no spills); wider rows spill there, and take the two-pass kernel.
_BWD_WIDE_MAX_N = 16384
_BWD_WIDE_WARPS = 32
# Two-pass backward: 32 warps, 2 programs per SM, so the rows re-read in pass 2 stay in L2.
_BWD_TWO_PASS_WARPS = 32
_BWD_TWO_PASS_PROGRAMS_PER_SM = 2
# Chunk width of the two-pass kernels: 16 fp32 values per thread at 16 warps, no spills.
_CHUNK_N = 8192
# Backwards this small are launch-bound (the device finishes before the host issues the next
# launch): one program does every row and writes dw itself, saving the dw-reduction launch.
_ONE_PROGRAM_BWD_MAX_ELEMENTS = 32768
# Small N: pack rows so a program moves >= 4096 elements (8 KB of bf16); fewer, fatter programs
# keep enough bytes in flight per SM and amortise the per-program reduction and launch work.
_ELEMENTS_PER_PROGRAM = 4096


@dataclass(frozen=True)
class FwdConfig:
    """Launch of ``_rmsnorm_fwd_kernel``: ``block_m`` rows of the padded width ``block_n`` per
    program (``single_pass``), or one row per program in chunks of ``block_n`` (two passes)."""

    block_m: int
    block_n: int
    single_pass: bool
    num_warps: int
    early_weight: bool = False  # single pass: load the weight together with x

    def __post_init__(self) -> None:
        if not is_power_of_two(self.block_n):
            raise ValueError(f"rmsnorm FwdConfig: block_n must be a power of two, got {self.block_n}")
        if not self.single_pass and self.block_m != 1:
            raise ValueError(
                f"rmsnorm FwdConfig: the two-pass kernel takes one row per block, got block_m={self.block_m}")


BWD_KERNELS = ("rows", "wide", "two-pass")


@dataclass(frozen=True)
class BwdConfig:
    """Launch of the backward: ``kernel`` "rows" (``block_m`` rows of the padded width
    ``block_n`` in registers), "wide" (one whole row of ``block_n`` in registers per step) or
    "two-pass" (one row in chunks of ``block_n``). ``programs_per_sm``: the persistent grid's
    programs per SM, 0 for as many as can be resident."""

    kernel: str
    block_m: int
    block_n: int
    num_warps: int
    programs_per_sm: int = 0

    def __post_init__(self) -> None:
        if self.kernel not in BWD_KERNELS:
            raise ValueError(f"rmsnorm BwdConfig: kernel must be one of {', '.join(BWD_KERNELS)}, got {self.kernel!r}")
        if not is_power_of_two(self.block_n):
            raise ValueError(f"rmsnorm BwdConfig: block_n must be a power of two, got {self.block_n}")
        if self.kernel != "rows" and self.block_m != 1:
            raise ValueError(f"rmsnorm BwdConfig: the {self.kernel} kernel takes one row per block, "
                             f"got block_m={self.block_m}")


def _rows_in_registers(n: int) -> tuple[int, int, int]:
    """(block_m, block_n, num_warps) of a kernel keeping rows of width n in registers."""
    block_n = triton.next_power_of_2(n)
    block_m = max(1, _ELEMENTS_PER_PROGRAM // block_n)
    # 16 fp32 values per thread per live tensor: two 16-byte bf16 vectors per load, low spills.
    return block_m, block_n, min(16, max(4, block_m * block_n // 512))


@functools.cache
def fwd_config(n: int) -> FwdConfig:
    """The forward's default launch for rows of width n."""
    two_pass = _FWD_TWO_PASS.get(triton.next_power_of_2(n))
    if two_pass is not None:
        return FwdConfig(1, two_pass[0], False, two_pass[1])
    if n <= _FWD_SINGLE_PASS_MAX_N:
        block_m, block_n, num_warps = _rows_in_registers(n)
        return FwdConfig(block_m, block_n, True, num_warps, early_weight=n > _FWD_EARLY_WEIGHT_MIN_N)
    return FwdConfig(1, _CHUNK_N, False, 16)


@functools.cache
def bwd_config(n: int) -> BwdConfig:
    """The backward's default launch for rows of width n."""
    if n <= _BWD_SINGLE_PASS_MAX_N:
        return BwdConfig("rows", *_rows_in_registers(n))
    if n <= _BWD_WIDE_MAX_N:
        return BwdConfig("wide", 1, triton.next_power_of_2(n), _BWD_WIDE_WARPS)
    return BwdConfig("two-pass", 1, _CHUNK_N, _BWD_TWO_PASS_WARPS, _BWD_TWO_PASS_PROGRAMS_PER_SM)


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr, x_stride,  # input rows (M, N), unit column stride
    res_ptr, res_stride,  # residual added before the norm (HAS_RESIDUAL)
    w_ptr,  # weight (N,) (HAS_WEIGHT)
    y_ptr, y_stride,  # normalised output (M, N)
    h_ptr, h_stride,  # x + residual in the input dtype: the new residual (HAS_RESIDUAL)
    rstd_ptr,  # (M,) fp32: 1/rms per row, saved for the backward
    M, N, eps,
    BLOCK_M: tl.constexpr,  # rows per block (1 unless N is small)
    BLOCK_N: tl.constexpr,  # the padded row (single pass) or the chunk width (two passes)
    SINGLE_PASS: tl.constexpr,  # the whole row fits in one block
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
    EARLY_WEIGHT: tl.constexpr,  # single pass: load the weight together with x
):
    # One row block per program and no loop (as liger's forward): nothing loop-carried.
    eps = tl.cast(eps, ACC)  # a traced launch (Inductor) passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    rows = rows.to(tl.int64)  # offsets of tensors above 2^31 elements
    if SINGLE_PASS:
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(ACC)
        if HAS_WEIGHT and EARLY_WEIGHT:
            # Issued with x's load, kept in its own dtype until used: its latency hides under x's.
            w_early = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
            h = (x + r.to(ACC)).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + rows[:, None] * h_stride + cols[None, :], h, mask=mask)
            x = h.to(ACC)  # normalise what is stored, so the backward sees the same h
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
        y = x * rstd[:, None]
        if HAS_WEIGHT:
            if EARLY_WEIGHT:
                w = w_early.to(ACC)
            else:
                w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(ACC)
            y = y * w[None, :]
        tl.store(y_ptr + rows[:, None] * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # BLOCK_M == 1: pass 1 sums squares chunk by chunk, pass 2 reads the row back (from L2)
        # and writes y. The residual sum is recomputed in pass 2, bit-identically, rather than
        # read back from h. L2 hints: x is read again (evict_last), then not (evict_first); the
        # weight is read by every row (evict_last).
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols < N)[None, :]
            offs = start + cols[None, :]
            x = tl.load(x_ptr + rows[:, None] * x_stride + offs, mask=mask, other=0.0,
                        eviction_policy="evict_last").to(ACC)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + rows[:, None] * res_stride + offs, mask=mask, other=0.0)
                h = (x + r.to(ACC)).to(h_ptr.dtype.element_ty)
                tl.store(h_ptr + rows[:, None] * h_stride + offs, h, mask=mask)
                x = h.to(ACC)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols < N)[None, :]
            offs = start + cols[None, :]
            x = tl.load(x_ptr + rows[:, None] * x_stride + offs, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(ACC)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + rows[:, None] * res_stride + offs, mask=mask, other=0.0)
                x = (x + r.to(ACC)).to(h_ptr.dtype.element_ty).to(ACC)
            y = x * rstd[:, None]
            if HAS_WEIGHT:
                w = tl.load(w_ptr + start + cols, mask=start + cols < N, other=0.0,
                            eviction_policy="evict_last").to(ACC)
                y = y * w[None, :]
            tl.store(y_ptr + rows[:, None] * y_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, x_stride,  # the normalised input rows (h when there was a residual), (M, N)
    w_ptr,  # weight (N,) (HAS_WEIGHT)
    dy_ptr, dy_stride,  # gradient of y
    dres_ptr, dres_stride,  # gradient of the new residual h (HAS_DRES)
    rstd_ptr,  # (M,) fp32 from the forward (unless RECOMPUTE_RSTD)
    dx_ptr, dx_stride,  # gradient of x (and of the residual)
    dw_partial_ptr,  # (num_programs, N) fp32: each program's share of dw (SINGLE_PASS); dw for one program
    M, N,
    eps,  # read only with RECOMPUTE_RSTD
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # the padded row block (single pass) or the chunk width (two passes)
    SINGLE_PASS: tl.constexpr,  # the row fits in registers: dw is accumulated here too
    HAS_DRES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
    RECOMPUTE_RSTD: tl.constexpr,  # single pass: rstd from the row in registers, as the forward did
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_row_blocks = tl.cdiv(M, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        col_mask = cols < N
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
        # Software pipelining by hand: the next row block's x, dy and rstd are loaded (in their
        # storage dtype) before this one's reduction, so a program always has a load in flight.
        next_rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        next_mask = (next_rows < M)[:, None] & col_mask[None, :]
        next_rows64 = next_rows.to(tl.int64)
        x_next = tl.load(x_ptr + next_rows64[:, None] * x_stride + cols[None, :], mask=next_mask, other=0.0)
        dy_next = tl.load(dy_ptr + next_rows64[:, None] * dy_stride + cols[None, :], mask=next_mask, other=0.0)
        if not RECOMPUTE_RSTD:
            rstd_next = tl.load(rstd_ptr + next_rows, mask=next_rows < M, other=0.0)
        for row_block in range(pid, num_row_blocks, num_programs):
            rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < M
            mask = row_mask[:, None] & col_mask[None, :]
            x_raw, dy_raw = x_next, dy_next
            if not RECOMPUTE_RSTD:
                rstd = rstd_next
            next_rows = rows + num_programs * BLOCK_M
            next_mask = (next_rows < M)[:, None] & col_mask[None, :]
            next_rows64 = next_rows.to(tl.int64)
            x_next = tl.load(x_ptr + next_rows64[:, None] * x_stride + cols[None, :], mask=next_mask, other=0.0)
            dy_next = tl.load(dy_ptr + next_rows64[:, None] * dy_stride + cols[None, :], mask=next_mask, other=0.0)
            if not RECOMPUTE_RSTD:
                rstd_next = tl.load(rstd_ptr + next_rows, mask=next_rows < M, other=0.0)
            rows = rows.to(tl.int64)
            x = x_raw.to(ACC)
            dy = dy_raw.to(ACC)
            if RECOMPUTE_RSTD:
                rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            x_hat = x * rstd[:, None]
            g = dy * w[None, :] if HAS_WEIGHT else dy
            mean_gx = tl.sum(g * x_hat, axis=1) / N
            dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
            if HAS_DRES:
                dres = tl.load(dres_ptr + rows[:, None] * dres_stride + cols[None, :], mask=mask, other=0.0)
                dx += dres.to(ACC)
            tl.store(dx_ptr + rows[:, None] * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                dw_acc += dy * x_hat
        if HAS_WEIGHT:
            tl.store(dw_partial_ptr + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    else:
        # BLOCK_M == 1. Pass 1: sum(g * x) over the row; pass 2 reads the row back (from L2) and
        # writes dx = rstd*g - x * rstd^3 * sum/N (dw comes from _rmsnorm_dw_kernel). L2 hints:
        # x and dy are read again (evict_last), then not (evict_first); the weight by every row.
        num_chunks = tl.cdiv(N, BLOCK_N)
        for row in range(pid, M, num_programs):
            rstd = tl.load(rstd_ptr + row)
            row64 = tl.cast(row, tl.int64)  # a new name: the loop variable keeps its type
            acc = tl.zeros([BLOCK_N], dtype=ACC)
            for start in range(0, N, BLOCK_N):
                mask = start + cols < N
                x = tl.load(x_ptr + row64 * x_stride + start + cols, mask=mask, other=0.0,
                            eviction_policy="evict_last").to(ACC)
                dy = tl.load(dy_ptr + row64 * dy_stride + start + cols, mask=mask, other=0.0,
                             eviction_policy="evict_last").to(ACC)
                if HAS_WEIGHT:
                    dy = dy * tl.load(w_ptr + start + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(ACC)
                acc += dy * x
            coef = tl.sum(acc, axis=0) * rstd * rstd * rstd / N
            for i in range(num_chunks):
                start = i * BLOCK_N
                mask = start + cols < N
                x = tl.load(x_ptr + row64 * x_stride + start + cols, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(ACC)
                dy = tl.load(dy_ptr + row64 * dy_stride + start + cols, mask=mask, other=0.0,
                             eviction_policy="evict_first").to(ACC)
                if HAS_WEIGHT:
                    dy = dy * tl.load(w_ptr + start + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(ACC)
                dx = rstd * dy - x * coef
                if HAS_DRES:
                    dres = tl.load(dres_ptr + row64 * dres_stride + start + cols, mask=mask, other=0.0)
                    dx += dres.to(ACC)
                tl.store(dx_ptr + row64 * dx_stride + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_wide_kernel(
    x_ptr, x_stride,  # the normalised input rows (h when there was a residual), (M, N)
    w_ptr,  # weight (N,) (HAS_WEIGHT)
    dy_ptr, dy_stride,  # gradient of y
    dres_ptr, dres_stride,  # gradient of the new residual h (HAS_DRES)
    rstd_ptr,  # (M,) fp32 from the forward
    dx_ptr, dx_stride,  # gradient of x (and of the residual)
    dw_partial_ptr,  # (programs, N) fp32: program p writes its share of dw as row p
    M, N,
    BLOCK_N: tl.constexpr,  # the padded row, kept in registers
    HAS_DRES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
):
    # Program p visits rows p, p + P, ... and keeps x, dy * w and its share of dw in registers,
    # so x and dy come from HBM once and dw costs one store per program.
    first_row = tl.program_id(0)
    row_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([BLOCK_N], dtype=ACC)
    # No software pipelining of the row loop: it measured no faster and costs registers.
    for row in tl.range(first_row, M, row_programs, num_stages=1):
        row64 = tl.cast(row, tl.int64)
        x_raw = tl.load(x_ptr + row64 * x_stride + cols, mask=col_mask, other=0.0)
        dy_raw = tl.load(dy_ptr + row64 * dy_stride + cols, mask=col_mask, other=0.0)
        rstd = tl.load(rstd_ptr + row)
        x = x_raw.to(ACC)
        dy = dy_raw.to(ACC)
        if HAS_WEIGHT:
            # dw first: then dy is dead before the reduction, and only x, g and dw_acc stay live.
            dw_acc += dy * (x * rstd)
            g = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC)
        else:
            g = dy
        dot = tl.sum(g * x, axis=0)
        # dx = rstd * (g - x_hat * mean(g * x_hat)) = rstd * g - x * rstd^3 * sum(g * x) / N
        coef = dot * rstd * rstd * rstd / N
        dx = g * rstd - x * coef
        if HAS_DRES:
            dx += tl.load(dres_ptr + row64 * dres_stride + cols, mask=col_mask, other=0.0).to(ACC)
        tl.store(dx_ptr + row64 * dx_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + first_row * N + cols, dw_acc, mask=col_mask)


@triton.jit
def _rmsnorm_dw_kernel(
    x_ptr, x_stride,  # normalised input rows (M, N)
    dy_ptr, dy_stride,  # gradient of y
    rstd_ptr,  # (M,) fp32
    dw_partial_ptr,  # (num_splits, N) fp32: program (column block, split) writes its sum
    M, N, rows_per_split,
    BLOCK_R: tl.constexpr,  # rows per tile: 32 rows x 256 columns, 16 fp32 values per thread
    BLOCK_N: tl.constexpr,  # columns per program: 512-byte bf16 segments per row, coalesced
    ACC: tl.constexpr,
):
    col_block = tl.program_id(0)
    split = tl.program_id(1)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=ACC)
    row_start = split * rows_per_split
    row_end = tl.minimum(row_start + rows_per_split, M)
    for first in range(row_start, row_end, BLOCK_R):
        rows = first + tl.arange(0, BLOCK_R)
        row_mask = rows < row_end
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        rows = rows.to(tl.int64)
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask, other=0.0).to(ACC)
        acc += dy * x * rstd[:, None]
    tl.store(dw_partial_ptr + split * N + cols, tl.sum(acc, axis=0), mask=col_mask)


@triton.jit
def _sum_rows_kernel(
    partial_ptr,  # (P, N) fp32
    out_ptr,  # (N,) in the weight's dtype
    P, N,
    BLOCK_P: tl.constexpr,  # rows summed per step: 64 x 64 tile, 16 values per thread
    BLOCK_N: tl.constexpr,
    ACC: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=ACC)
    for first in range(0, P, BLOCK_P):
        rows = first + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_mask)


# ------------------------------------------------------------------------------------------------
# Launch plans
# ------------------------------------------------------------------------------------------------
def _as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, N) view with unit column stride (copies only when the last dim is strided)."""
    if t.dim() == 2 and t.stride(1) == 1:  # already rows: no view (host time in launch-bound calls)
        return t
    rows = t.reshape(-1, n)
    return rows if rows.stride(-1) == 1 or rows.shape[0] == 0 else rows.contiguous()


# Launch plans (launchers, grids, buffer shapes) by (shape, strides, dtypes, device, config): a
# call with a shape seen before does no configuration work. config None stands for the default
# (no lookup per call).
_fwd_plans: PlanCache = PlanCache()
_bwd_plans: PlanCache = PlanCache()


class _Launch:
    """A plan's launcher and, after its first call with every pointer 16-byte aligned, the
    ``DirectLaunch`` of that specialization (False where there is none). The plan key fixes every
    dtype and int the kernel specializes on, so aligned calls of one plan all specialize alike:
    they pass pointers as ints and skip the per-argument keying (host time of small calls)."""

    __slots__ = ("cached", "direct")

    def __init__(self, cached: CachedLauncher) -> None:
        self.cached = cached
        self.direct = None

    def first_or_fallback(self, aligned: bool, args) -> None:
        """Launch ``args`` (tensors) through the CachedLauncher; the first aligned call also
        binds the DirectLaunch."""
        if aligned and self.direct is None:
            self.direct = self.cached.direct(*args) or False
        else:
            self.cached(*args)


def _fwd_key(*fields) -> tuple:
    """A forward plan's key: (m, n, dtype, device, x / y row strides, has residual, residual row
    stride, weight dtype, config)."""
    return fields


def _rmsnorm_fwd(x2d, weight, residual2d, eps, *, config: FwdConfig | None = None, rstd=None):
    """y, h (the new residual, or None) and rstd; ``config`` None: ``fwd_config(N)``."""
    m, n = x2d.shape
    # empty_like of rows with unit column stride is row-major (and cheaper on the host than empty).
    y = torch.empty_like(x2d)
    h = torch.empty_like(y) if residual2d is not None else None
    if rstd is None:
        rstd = torch.empty(m, dtype=acc_dtype(x2d.dtype), device=x2d.device)
    if m == 0:
        return y, h, rstd
    # Triton launches on the current device: the plan (and its direct launch's stream) follows it.
    device = torch.cuda.current_device() if x2d.is_cuda else -1
    x_stride, y_stride = x2d.stride(0), y.stride(0)
    res_stride = residual2d.stride(0) if residual2d is not None else 0
    key = _fwd_key(m, n, x2d.dtype, device, x_stride, y_stride, residual2d is not None, res_stride,
                   weight.dtype if weight is not None else None, config)
    plan = _fwd_plans.get(key)
    if plan is None:
        grid, meta = _fwd_spec(m, n, x2d.dtype, residual2d is not None, weight is not None, config or fwd_config(n))
        plan = _fwd_plans.remember(key, _Launch(CachedLauncher(_rmsnorm_fwd_kernel, grid, **meta)))
    xp, yp, sp = x2d.data_ptr(), y.data_ptr(), rstd.data_ptr()
    wp = weight.data_ptr() if weight is not None else xp
    rp = residual2d.data_ptr() if residual2d is not None else xp
    hp = h.data_ptr() if h is not None else yp
    aligned = not (xp | yp | sp | wp | rp | hp) & 15
    direct = plan.direct
    if aligned and direct and direct(device, xp, x_stride, rp, res_stride, wp, yp, y_stride, hp,
                                     h.stride(0) if h is not None else 0, sp, m, n, eps):
        return y, h, rstd
    plan.first_or_fallback(aligned, _fwd_args(x2d, residual2d, weight, y, h, rstd, eps))
    return y, h, rstd


def _fwd_args(x2d, res2d, weight, y, h, rstd, eps) -> tuple:
    """The forward kernel's runtime arguments; placeholders (never read) for absent tensors."""
    m, n = x2d.shape
    return (
        x2d, x2d.stride(0),
        res2d if res2d is not None else x2d, res2d.stride(0) if res2d is not None else 0,
        weight if weight is not None else x2d,
        y, y.stride(0),
        h if h is not None else y, h.stride(0) if h is not None else 0,
        rstd, m, n, eps,
    )


def _fwd_spec(m, n, dtype, has_residual, has_weight, config: FwdConfig) -> tuple[tuple, dict]:
    """(grid, compile-time arguments) of the forward kernel's launch."""
    if config.single_pass and config.block_n < n:
        raise ValueError(f"rmsnorm FwdConfig: a single pass needs block_n >= N, got {config.block_n} < {n}")
    return (triton.cdiv(m, config.block_m),), dict(
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, SINGLE_PASS=config.single_pass,
        HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, ACC=tl_acc(dtype),
        EARLY_WEIGHT=config.single_pass and config.early_weight, num_warps=config.num_warps,
    )


class _BwdSpec(NamedTuple):
    """The backward's launches for one (shape, dtypes, config): what the eager plan caches as
    launchers and what the traced op launches through ``wrap_triton``."""

    kernel: str  # the main kernel, BwdConfig.kernel: "wide" is _rmsnorm_bwd_wide_kernel, else _rmsnorm_bwd_kernel
    grid: tuple  # the main kernel's: (row programs,)
    meta: dict  # the main kernel's compile-time arguments
    partial_rows: int  # rows of the fp32 dw partial buffer (0: none, no weight or one program)
    dw_columns: tuple | None  # (grid, meta) of _rmsnorm_dw_kernel, which writes the partials (two passes)
    rows_per_split: int  # rows each _rmsnorm_dw_kernel program sums
    sum_rows: tuple | None  # (grid, meta) of _sum_rows_kernel: partials -> dw (None: no partials)

    @property
    def takes_eps(self) -> bool:  # the main kernel's arguments end in eps
        return self.kernel != "wide"


class _BwdPlan(NamedTuple):
    spec: _BwdSpec
    main: _Launch
    dw_columns: CachedLauncher | None
    sum_rows: CachedLauncher | None


def recomputes_rstd(m: int, n: int) -> bool:
    """Whether the default backward of (m, n) rows recomputes rstd (one program, rows in
    registers): then the eager forward keeps no rstd buffer. For launch-bound calls, where one
    tensor fewer made and freed across the autograd engine's threads is host time
    (results/2026-11-24-h100-direct-launch/README.md)."""
    return n <= _BWD_SINGLE_PASS_MAX_N and m * n <= _ONE_PROGRAM_BWD_MAX_ELEMENTS


def _bwd_key(*fields) -> tuple:
    """A backward plan's key: (m, n, dtype, device, weight dtype, dy dtype, dres dtype, x / dy /
    dres / dx row strides, recompute, config)."""
    return fields


def _rmsnorm_bwd(x2d, weight, rstd, dy2d, dres2d, *, config: BwdConfig | None = None, eps: float = 0.0):
    """dx and dw (None without a weight); ``config`` None: ``bwd_config(N)``. ``rstd`` None:
    recomputed from the rows with ``eps`` (the "rows" kernel only)."""
    m, n = x2d.shape
    dx = torch.empty_like(x2d)  # row-major: rows with unit column stride (cheaper than empty)
    has_weight = weight is not None
    if m == 0:
        return dx, (torch.zeros_like(weight) if has_weight else None)
    device = torch.cuda.current_device() if x2d.is_cuda else -1  # as in _rmsnorm_fwd
    x_stride, dy_stride, dx_stride = x2d.stride(0), dy2d.stride(0), dx.stride(0)
    dres_stride = dres2d.stride(0) if dres2d is not None else 0
    recompute = rstd is None
    key = _bwd_key(m, n, x2d.dtype, device, weight.dtype if has_weight else None, dy2d.dtype,
                   dres2d.dtype if dres2d is not None else None, x_stride, dy_stride, dres_stride, dx_stride,
                   recompute, config)
    plan = _bwd_plans.get(key)
    if recompute:
        rstd = x2d  # a placeholder pointer: the kernel reads no rstd
    if plan is None:
        plan = _bwd_plans.remember(key, _bwd_plan(_bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, rstd), has_weight,
                                                  dres2d is not None, config or bwd_config(n), recompute))
    if has_weight and plan.sum_rows is None:  # one program: it writes dw (in the weight's dtype) itself
        dw = out = torch.empty_like(weight)
    elif has_weight:
        dw, out = None, torch.empty((plan.spec.partial_rows, n), dtype=acc_dtype(x2d.dtype), device=x2d.device)
    else:
        dw = out = None
    main_out = out if plan.dw_columns is None and out is not None else rstd
    xp, dyp, sp, dxp = x2d.data_ptr(), dy2d.data_ptr(), rstd.data_ptr(), dx.data_ptr()
    wp = weight.data_ptr() if has_weight else xp
    dresp = dres2d.data_ptr() if dres2d is not None else dyp
    outp = main_out.data_ptr()
    aligned = not (xp | dyp | sp | dxp | wp | dresp | outp) & 15
    direct = plan.main.direct
    tail = (m, n, eps) if plan.spec.takes_eps else (m, n)
    if not (aligned and direct and direct(device, xp, x_stride, wp, dyp, dy_stride, dresp, dres_stride, sp,
                                          dxp, dx_stride, outp, *tail)):
        args = _bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, main_out)  # built only off the direct path
        plan.main.first_or_fallback(aligned, [*args, eps] if plan.spec.takes_eps else args)
    if plan.sum_rows is None:
        return dx, dw
    partial = out
    if plan.dw_columns is not None:
        plan.dw_columns(x2d, x_stride, dy2d, dy_stride, rstd, partial, m, n, plan.spec.rows_per_split)
    dw = torch.empty_like(weight)
    plan.sum_rows(partial, dw, plan.spec.partial_rows, n)
    return dx, dw


def _bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, main_out) -> list:
    """The main backward kernel's runtime arguments but eps; placeholders (never read) for absent
    tensors. ``main_out``: dw, its fp32 partials, or a placeholder where the kernel writes none."""
    m, n = x2d.shape
    return [
        x2d, x2d.stride(0),
        weight if weight is not None else x2d,
        dy2d, dy2d.stride(0),
        dres2d if dres2d is not None else dy2d, dres2d.stride(0) if dres2d is not None else 0,
        rstd,
        dx, dx.stride(0),
        main_out,
        m, n,
    ]


def _bwd_plan(args, has_weight, has_dres, config: BwdConfig, recompute: bool = False) -> _BwdPlan:
    spec = _bwd_spec(args, has_weight, has_dres, config, recompute)
    main = _rmsnorm_bwd_wide_kernel if spec.kernel == "wide" else _rmsnorm_bwd_kernel
    return _BwdPlan(
        spec, _Launch(CachedLauncher(main, spec.grid, **spec.meta)),
        CachedLauncher(_rmsnorm_dw_kernel, spec.dw_columns[0], **spec.dw_columns[1]) if spec.dw_columns else None,
        CachedLauncher(_sum_rows_kernel, spec.sum_rows[0], **spec.sum_rows[1]) if spec.sum_rows else None,
    )


def _bwd_spec(args, has_weight, has_dres, config: BwdConfig, recompute: bool = False) -> _BwdSpec:
    """``args``: the main kernel's runtime arguments without eps (traced ones too: the occupancy
    query compiles the kernel for stand-ins of their dtypes)."""
    x2d = args[0]
    m, n = x2d.shape
    sms = sm_count(x2d.device)
    acc = tl_acc(x2d.dtype)
    if config.kernel != "two-pass" and config.block_n < n:
        raise ValueError(
            f"rmsnorm BwdConfig: the {config.kernel} kernel needs block_n >= N, got {config.block_n} < {n}")
    if recompute and config.kernel != "rows":
        raise ValueError(f"rmsnorm backward: only the rows kernel recomputes rstd, not {config.kernel!r}")
    if config.kernel == "wide":
        kernel = _rmsnorm_bwd_wide_kernel
        meta = dict(BLOCK_N=config.block_n, HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc,
                    num_warps=config.num_warps)
    else:
        kernel = _rmsnorm_bwd_kernel
        meta = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, SINGLE_PASS=config.kernel == "rows",
                    HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc, RECOMPUTE_RSTD=recompute,
                    num_warps=config.num_warps)
        args = [*args, 0.0]  # eps, for the occupancy query's compile
    # Persistent, each program looping over rows. By default as many programs per SM as can be
    # resident at once (from the compiled kernel's registers and shared memory): more would run
    # as a second, partial wave. Capped at the row blocks so every program writes a dw partial.
    programs_per_sm = config.programs_per_sm or _resident_per_sm(kernel, args, meta, x2d)
    row_programs = min(triton.cdiv(m, config.block_m), max(1, programs_per_sm * sms))
    if config.kernel == "rows" and not config.programs_per_sm and m * n <= _ONE_PROGRAM_BWD_MAX_ELEMENTS:
        row_programs = 1
    spec = _BwdSpec(config.kernel, (row_programs,), meta, 0, None, 0, None)
    if not has_weight or (config.kernel == "rows" and row_programs == 1):
        return spec  # no dw, or the one program's share is dw: written directly
    dw_columns, rows_per_split, partial_rows = None, 0, row_programs
    if config.kernel == "two-pass":
        dw_block_n = 256
        col_blocks = triton.cdiv(n, dw_block_n)
        dw_splits = max(1, min(triton.cdiv(m, 32), 4 * sms // col_blocks))
        rows_per_split = triton.cdiv(m, dw_splits)
        partial_rows = triton.cdiv(m, rows_per_split)
        dw_columns = ((col_blocks, partial_rows), dict(BLOCK_R=32, BLOCK_N=dw_block_n, ACC=acc, num_warps=16))
    sum_rows = ((triton.cdiv(n, 64),), dict(BLOCK_P=64, BLOCK_N=64, ACC=acc, num_warps=8))
    return spec._replace(partial_rows=partial_rows, dw_columns=dw_columns, rows_per_split=rows_per_split,
                         sum_rows=sum_rows)


_resident_cache: dict = {}


def _resident_per_sm(kernel, args: list, meta: dict, like: torch.Tensor) -> int:
    """Programs of ``kernel`` that fit on one SM at once (registers, shared memory, threads),
    read from the compiled kernel; 2 where that cannot be read (the interpreter, another
    Triton's API), which always fits at <= 16 warps."""
    if not like.is_cuda:
        return 2
    # A tuple of the values themselves: this runs on every backward, so no string building.
    key = (kernel.fn.__name__, like.device.index, like.dtype, *meta.values())
    if key not in _resident_cache:
        warps = meta["num_warps"]
        try:
            compiled = kernel.warmup(*real_stand_ins(args), grid=(1,), **meta)
            compiled._init_handles()
            props = torch.cuda.get_device_properties(like.device)
            regs = getattr(props, "regs_per_multiprocessor", 65536)
            smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
            # Registers are allocated per warp in units of 256 (8 per thread).
            regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256
            fits = min(regs // (regs_per_warp * warps), 64 // warps)
            if compiled.metadata.shared:
                fits = min(fits, smem // compiled.metadata.shared)
            _resident_cache[key] = max(1, fits)
        except Exception:  # an API difference must not break the backward
            _resident_cache[key] = 2
    return _resident_cache[key]



# rstd written by forwards nobody differentiates: one buffer per (rows, dtype, device), never read.
_rstd_scratch: PlanCache = PlanCache(limit=16)


def _scratch_rstd(m: int, x2d: torch.Tensor) -> torch.Tensor:
    key = (m, x2d.dtype, x2d.device)
    buf = _rstd_scratch.get(key)
    if buf is None:
        buf = _rstd_scratch.remember(key, torch.empty(m, dtype=acc_dtype(x2d.dtype), device=x2d.device))
    return buf


def _forward(x, weight, residual, eps, rstd="keep"):
    """y and h (None without a residual) shaped like x, and what the backward needs: the
    normalised rows, the weight as read, rstd. ``rstd``: "keep" (a buffer of its own), "scratch"
    (nobody differentiates: a shared buffer, returned all the same) or "eager-backward" (kept
    unless ``recomputes_rstd``: then None, the backward recomputing it)."""
    n = x.shape[-1]
    x2d = _as_rows(x, n)
    res2d = _as_rows(residual, n) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    recompute = rstd == "eager-backward" and recomputes_rstd(x2d.shape[0], n)
    scratch = rstd == "scratch" or recompute
    y, h, rstd = _rmsnorm_fwd(x2d, w, res2d, eps, rstd=_scratch_rstd(x2d.shape[0], x2d) if scratch else None)
    saved = (h if h is not None else x2d, w, None if recompute else rstd)
    if x.dim() == 2:  # a view costs host time; launch-bound calls notice
        return y, h, saved
    return y.view(x.shape), (h.view(x.shape) if h is not None else None), saved


# ------------------------------------------------------------------------------------------------
# Launch-bound eager calls: what every call of one input signature shares, found once
# ------------------------------------------------------------------------------------------------
class _SmallCall:
    """The eager forward and backward of one launch-bound input signature: contiguous rows whose
    backward is one program recomputing rstd (``recomputes_rstd``). The launches' fixed
    arguments are found once, so a call does only its allocations, its pointers and one direct
    launch per direction: where the host decides the speed, Python is most of a call
    (results/2026-11-24-h100-host-threads/README.md).

    Either direction returns None where its launch cannot be direct (a pointer off a 16-byte
    boundary, a profiler's launch hooks, a gradient laid out otherwise, the backward's plan not
    yet bound by a first backward); the caller then takes the general path."""

    __slots__ = ("fwd", "bwd", "bwd_key", "device", "m", "n", "res_stride", "rstd", "rstd_ptr")

    def __init__(self, fwd: DirectLaunch, bwd_key: tuple, device: int, m: int, n: int, has_residual: bool,
                 rstd: torch.Tensor) -> None:
        self.fwd, self.bwd, self.bwd_key = fwd, None, bwd_key
        self.device, self.m, self.n = device, m, n
        self.res_stride = n if has_residual else 0
        self.rstd, self.rstd_ptr = rstd, rstd.data_ptr()  # scratch: written, never read

    def forward(self, x, weight, residual, eps):
        """(y, h or None), or None."""
        n = self.n
        y = torch.empty_like(x)
        xp, yp = x.data_ptr(), y.data_ptr()
        wp = weight.data_ptr() if weight is not None else xp
        if residual is None:
            h, rp, hp = None, xp, yp
        else:
            h = torch.empty_like(x)
            rp, hp = residual.data_ptr(), h.data_ptr()
        if (xp | wp | rp) & 15 or not self.fwd(self.device, xp, n, rp, self.res_stride, wp, yp, n, hp,
                                                self.res_stride, self.rstd_ptr, self.m, n, eps):
            return None
        return y, h

    def backward(self, normed, weight, dy, dh, eps):
        """(dx, dw or None), or None."""
        bwd = self.bwd
        if bwd is None:
            plan = _bwd_plans.get(self.bwd_key)
            if plan is None or not plan.main.direct:
                return None
            bwd = self.bwd = plan.main.direct
        # Saved-tensor hooks (offloading, checkpointing) may hand back other tensors than were saved.
        if (dh is None) != (self.res_stride == 0) or dy.dtype != normed.dtype or not (
                dy.is_contiguous() and normed.is_contiguous() and (weight is None or weight.is_contiguous())
                and (dh is None or dh.is_contiguous())):
            return None
        n = self.n
        dx = torch.empty_like(normed)
        xp, dyp, dxp = normed.data_ptr(), dy.data_ptr(), dx.data_ptr()
        dresp = dh.data_ptr() if dh is not None else dyp
        if weight is None:
            dw, wp, dwp = None, xp, xp
        else:
            dw = torch.empty_like(weight)
            wp, dwp = weight.data_ptr(), dw.data_ptr()
        if (xp | wp | dyp | dresp) & 15:
            return None
        # The rstd argument is a placeholder: the one program recomputes rstd from the rows.
        if not bwd(self.device, xp, n, wp, dyp, n, dresp, self.res_stride, xp, dxp, n, dwp, self.m, n, eps):
            return None
        return dx, dw


# By (shape, dtype, weight dtype, residual is None, device): a bound _SmallCall, or False where the
# signature never takes one (too large, no direct launch here).
_small_calls: PlanCache = PlanCache()
# The current CUDA device's index, without torch.cuda.current_device's Python (CUDA builds only;
# called only once a CUDA tensor's _SmallCall was bound).
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _small_call(x, weight, residual):
    """The _SmallCall this call can take, or None."""
    small = _small_calls.get((x.shape, x.dtype, weight.dtype if weight is not None else None, residual is None,
                              x.get_device()))
    if (small and x.is_contiguous() and (weight is None or weight.is_contiguous())
            and (residual is None or residual.is_contiguous()) and _current_device() == small.device):
        return small
    return None


def _direct_launch_device(x) -> int | None:
    """The device a direct launch for ``x`` runs on: x's, where it is the current CUDA device (the
    one Triton compiled the plans' launches for); None where there is none."""
    if not x.is_cuda:
        return None
    device = x.get_device()
    return device if device == _current_device() else None


def _bind_small_call(x, weight, residual) -> None:
    """After a general call: remember whether this signature takes a _SmallCall, and bind it once
    the forward plan's direct launch is (its first aligned call binds it)."""
    key = (x.shape, x.dtype, weight.dtype if weight is not None else None, residual is None, x.get_device())
    if key in _small_calls:
        return
    device = _direct_launch_device(x)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if device is None or m == 0 or not recomputes_rstd(m, n):
        _small_calls.remember(key, False)
        return
    if not (x.is_contiguous() and (weight is None or weight.is_contiguous())
            and (residual is None or residual.is_contiguous())):
        return  # decided by a contiguous call
    has_residual = residual is not None
    plan = _fwd_plans.get(_fwd_key(m, n, x.dtype, device, n, n, has_residual, n if has_residual else 0,
                                   weight.dtype if weight is not None else None, None))
    if plan is None or plan.direct is None:
        return  # not bound yet: no aligned call so far
    if not plan.direct:
        _small_calls.remember(key, False)
        return
    bwd_key = _bwd_key(m, n, x.dtype, device, weight.dtype if weight is not None else None, x.dtype,
                       x.dtype if has_residual else None, n, n, n if has_residual else 0, n, True, None)
    _small_calls.remember(key, _SmallCall(plan.direct, bwd_key, device, m, n, has_residual, _scratch_rstd(m, x)))


def _forward_no_grad(x, weight, residual, eps):
    """y and h (None without a residual) of a call nobody differentiates."""
    small = _small_call(x, weight, residual)
    out = small.forward(x, weight, residual, eps) if small is not None else None
    if out is None:
        y, h, _ = _forward(x, weight, residual, eps, rstd="scratch")
        _bind_small_call(x, weight, residual)
        return y, h
    return out


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        small = _small_call(x, weight, residual)
        out = small.forward(x, weight, residual, eps) if small is not None else None
        if out is not None:
            y, h = out
            ctx.save_for_backward(h if h is not None else x, weight, None)
        else:
            small = None
            y, h, saved = _forward(x, weight, residual, eps, rstd="eager-backward")
            ctx.save_for_backward(*saved)
            _bind_small_call(x, weight, residual)
        ctx.small, ctx.shape, ctx.has_residual, ctx.eps = small, x.shape, residual is not None, eps
        ctx.set_materialize_grads(False)
        return y if h is None else (y, h)

    @staticmethod
    def backward(ctx, dy, dh=None):
        normed, weight, rstd = ctx.saved_tensors
        small = ctx.small
        grads = small.backward(normed, weight, dy, dh, ctx.eps) if small is not None and dy is not None else None
        if grads is not None:
            dx, dw = grads
            return dx, dw, (dx if ctx.has_residual else None), None
        # Rows again: the small call saves x as given, and saved-tensor hooks may hand back any layout.
        n = normed.shape[-1]
        normed = _as_rows(normed, n)
        weight = weight.contiguous() if weight is not None else None
        dy2d = _as_rows(dy, n) if dy is not None else torch.zeros_like(normed)
        dres2d = _as_rows(dh, n) if dh is not None else None
        dx, dw = _rmsnorm_bwd(normed, weight, rstd, dy2d, dres2d, eps=ctx.eps)
        if len(ctx.shape) != 2:
            dx = dx.view(ctx.shape)
        dres = dx if ctx.has_residual else None  # autograd clones where one tensor feeds two leaves
        return dx, dw, dres, None


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees (``compiled_op``: triton_ops, so Inductor launches the kernels from
# its generated code), with fakes and an autograd formula so a model compiles with
# fullgraph=True. Their bodies are traceable: plain allocations and ``wrap_triton`` launches of
# the eager path's kernels and configs, so compiled results equal eager ones bit for bit.
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd_op(
    x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, rstd): h = x + residual (an empty tensor without a residual), rstd of shape (M,)."""
    n = x.shape[-1]
    x2d = _as_rows(x, n)
    res2d = _as_rows(residual, n) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    m = x2d.shape[0]
    y = torch.empty_like(x2d)
    h = torch.empty_like(x2d) if res2d is not None else x.new_empty(0)
    rstd = x.new_empty((m,), dtype=acc_dtype(x.dtype))
    if m:
        # The hidden size decides the launch: specialized under dynamic shapes.
        grid, meta = _fwd_spec(m, n, x.dtype, res2d is not None, w is not None, fwd_config(static_int(n)))
        wrap_triton(_rmsnorm_fwd_kernel)[grid](*_fwd_args(x2d, res2d, w, y, h if res2d is not None else None,
                                                          rstd, eps), **meta)
    return y.view(x.shape), (h.view(x.shape) if res2d is not None else h), rstd


@_rms_norm_fwd_op.register_fake
def _(x, weight, residual, eps):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    _check_inputs(x, weight, residual)
    if x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm(impl='triton'): last dimension {x.shape[-1]} > {MAX_N}, the widest row the "
                         "Triton kernels take; use impl='torch' or impl='auto'")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    h = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    return x.new_empty(x.shape), h, x.new_empty((rows,), dtype=acc_dtype(x.dtype))


@compiled_op("kernelbench::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(
    dy: torch.Tensor, dh: torch.Tensor | None, normed: torch.Tensor, weight: torch.Tensor | None,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) from the normalised input h (or x); dw is an empty tensor without a weight."""
    n = normed.shape[-1]
    x2d, dy2d = _as_rows(normed, n), _as_rows(dy, n)
    dres2d = _as_rows(dh, n) if dh is not None else None
    w = weight.contiguous() if weight is not None else None
    m = x2d.shape[0]
    dx = torch.empty_like(x2d)
    if not m:
        return dx.view(normed.shape), (torch.zeros_like(weight) if w is not None else normed.new_empty(0))
    spec = _bwd_spec(_bwd_args(x2d, w, dy2d, dres2d, rstd, dx, rstd), w is not None, dres2d is not None,
                     bwd_config(static_int(n)))  # the hidden size decides: specialized under dynamic shapes
    if w is None:
        dw = out = normed.new_empty(0)
    elif spec.sum_rows is None:  # one program writes dw itself
        dw = out = torch.empty_like(w)
    else:
        dw, out = torch.empty_like(w), x2d.new_empty((spec.partial_rows, n), dtype=acc_dtype(x2d.dtype))
    args = _bwd_args(x2d, w, dy2d, dres2d, rstd, dx, out if spec.dw_columns is None and w is not None else rstd)
    if spec.kernel == "wide":
        wrap_triton(_rmsnorm_bwd_wide_kernel)[spec.grid](*args, **spec.meta)
    else:
        wrap_triton(_rmsnorm_bwd_kernel)[spec.grid](*args, 0.0, **spec.meta)
    if spec.dw_columns is not None:
        wrap_triton(_rmsnorm_dw_kernel)[spec.dw_columns[0]](
            x2d, x2d.stride(0), dy2d, dy2d.stride(0), rstd, out, m, n, spec.rows_per_split, **spec.dw_columns[1])
    if spec.sum_rows is not None:
        wrap_triton(_sum_rows_kernel)[spec.sum_rows[0]](out, dw, spec.partial_rows, n, **spec.sum_rows[1])
    return dx.view(normed.shape), dw


@_rms_norm_bwd_op.register_fake
def _(dy, dh, normed, weight, rstd):
    dw = weight.new_empty(weight.shape) if weight is not None else normed.new_empty(0)
    return normed.new_empty(normed.shape), dw


def _op_setup_context(ctx, inputs, output):
    x, weight, residual, _ = inputs
    _, h, rstd = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if residual is not None else x, weight, rstd)


def _op_backward(ctx, dy, dh, _drstd):
    normed, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(normed)
    dx, dw = torch.ops.kernelbench.rms_norm_bwd(dy, dh if ctx.has_residual else None, normed, weight, rstd)
    return dx, (dw if weight is not None else None), (dx if ctx.has_residual else None), None


_rms_norm_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def _rms_norm_compiled(x, weight, residual, eps):
    """The path taken under torch.compile: one custom op, whose output h is dropped without a residual."""
    y, h, _ = torch.ops.kernelbench.rms_norm_fwd(x, weight, residual, eps)
    return y if residual is None else (y, h)


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def _check_inputs(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rms_norm: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"rms_norm: unsupported dtype {x.dtype}; accepted: float32, bfloat16, float16, float64")
    if x.dim() == 0:
        raise ValueError("rms_norm: x must have at least one dimension (the one normalised)")
    n = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (n,):
        raise ValueError(
            f"rms_norm: weight has shape {tuple(weight.shape)}, expected ({n},) to match the last "
            f"dimension of x {tuple(x.shape)}"
        )
    if weight is not None and weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"rms_norm: unsupported weight dtype {weight.dtype}; accepted: float32, bfloat16, float16, float64"
        )
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rms_norm: residual has shape {tuple(residual.shape)}, expected x's {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"rms_norm: residual dtype {residual.dtype} differs from x's {x.dtype}")
    if weight is not None and weight.device != x.device:
        raise ValueError(f"rms_norm: weight is on {weight.device}, x on {x.device}")


def triton_usable(x: torch.Tensor) -> str | None:
    """Why the Triton path cannot take ``x`` here, or None when it can."""
    why = why_not_here(x)
    if why is None and x.shape[-1] > MAX_N:
        why = f"last dimension {x.shape[-1]} > {MAX_N}, the widest row the Triton kernels take"
    return why


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.rms_norm_fwd.default,
    torch.ops.kernelbench.rms_norm_bwd.default,
)
