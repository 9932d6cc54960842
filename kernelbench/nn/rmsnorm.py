"""RMSNorm over the last dimension, forward and backward in Triton, with an optional fused
residual add.

Math, for a row x of length N (statistics in fp32 whatever the input dtype):

    h      = x + residual                        (only with a residual; stored as the new residual)
    rstd   = 1 / sqrt(mean(h^2) + eps)
    x_hat  = h * rstd
    y      = x_hat * w                           (rounded once, to the input dtype)

    g      = dy * w
    dh     = rstd * (g - x_hat * mean(g * x_hat))   (+ d(new residual) when there is a residual)
    dw     = sum over rows of dy * x_hat          (accumulated in fp32)
    dx = dresidual = dh

Kernels (block sizes per N are in ``_config`` and ``_fwd_config``):
- ``_rmsnorm_fwd_kernel``: rows up to 16384 wide sit in registers (several rows per program when
  N is small, so a program moves at least 4096 elements) up to N = 2048 and at 16384; at the other
  widths (``_FWD_TWO_PASS_CONFIG``) it takes two passes, one row per program: the sum of squares
  chunk by chunk, then the row read back from L2 (x's first read marked evict_last, its second
  evict_first, the weight evict_last) and y written.
- ``_rmsnorm_bwd_kernel``: rows up to 8192 wide: a persistent grid of as many programs per SM as
  can be resident (read from the compiled kernel), loading the next rows while reducing the
  current ones (PREFETCH, on by default); each
  program loops over its rows, writes dx, and keeps its share of dw in fp32 registers, written
  once as a row of an fp32 (programs, N) partial buffer; ``_sum_rows_kernel`` then reduces that
  buffer (a few MB) to dw. The dw reduction thus costs one store per program, not per row.
  Wider rows (above 16384, see below) cannot keep both the row and a dw accumulator of N fp32
  values on chip, so dx takes two passes per row (dot product, then dx, the row coming back
  from L2) and dw comes, by default, from a column-parallel kernel (``_rmsnorm_dw_kernel``) that
  reads x and dy once more: 10 bytes per bf16 element instead of 6, what torch.compile's
  generated backward moves at every N. With ``dw_in_dx`` pass 2 instead adds dy * x_hat to the
  program's own fp32 row of length N in a (programs, N) partial buffer (load, add, store: an L2
  read-modify-write, no atomics), which ``_sum_rows_kernel`` reduces: x and dy are read from
  HBM once; measured slower, so not the default (``_BWD_TWO_PASS_CONFIG``).
- ``_rmsnorm_bwd_wide_kernel`` (the default for 8192 < N <= 16384, ``_BWD_WIDE_MAX_N``; any N
  with ``wide_splits``): each program owns a column block of N / splits columns, keeps x,
  g = dy * w and its dw accumulator for that block in registers while it visits rows p, p + P,
  ..., so x and dy are read from HBM once (6 bytes per bf16 element in all) and dw still costs
  one store per program. With splits > 1 the row's dot product also needs the other blocks:
  each program reads them in chunks as their owners, launched next to it on the same rows, load
  them, so they come from L2 (measured far slower at 32768 and 65536: the blocks spill).
- N > 65536 is refused by the Triton path; ``impl="auto"`` falls back to PyTorch there.

Launches go through ``kernelbench.fast_launch.CachedLauncher``, one per launch plan (the grid and
compile-time arguments of a shape), kept in small dicts, so a repeated shape costs no
configuration work on the host.

``rmsnorm_ref`` is the fp32 reference these kernels are tested against.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: impl="auto" resolves to "torch" (autoselect logs it)
    from ._no_triton import tl, triton

from ..fast_launch import CachedLauncher

MAX_N = 65536
_HAVE_TRITON = getattr(triton, "available", True)
# fp64 is accepted too and computed in fp64 throughout (for gradcheck); the others use fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
IMPLS = ("auto", "triton", "torch")

# Rows up to this width can stay in registers in the forward (16 warps: 32 fp32 values per thread).
_FWD_SINGLE_PASS_MAX_N = 16384
# The forward's two passes (sum of squares, then x read back from L2 and y written), one row per
# program, by padded N: (chunk width, num_warps), 8 bf16 values per thread per chunk. Measured on
# an H200 (bf16, M * N = 2^27, forward, scripts/probe_gaps.py, 2026-11-22; torch.compile in the
# same runs), against the rows kept in registers:
#   N =  4096  (2048, 8)   0.1298 ms (98.0% of copy)  vs 0.1343 for 4 rows x 16 warps (liger 0.1339)
#   N =  8192  (4096, 16)  0.1316                     vs 0.1335 for 1 row x 16 warps (compile 0.1299)
#   N = 32768  (8192, 32)  0.1365-0.1377              vs 0.1438 for 1 row x 32 warps (compile 0.1327-0.1338)
#   N = 65536  (8192, 32)  0.1625-0.1631              vs 0.2052 for a persistent grid of 8 x 16 warps
#                                                        per SM (session 2's default; compile 0.1977)
# Chunks of 16 values per thread, or one chunk per row, were 5-50% slower; at 32768, 16 warps
# (4 rows per SM waiting in L2 for their second pass, ~34 MB) 0.152-0.160, persistent grids
# 0.151-0.224. N <= 2048 and 16384 keep the rows in registers, already within 2% of the best
# anchor there; two passes measured once at 2048 (1024-wide chunks, 4 warps) 0.1305 against
# 0.1348, at 16384 (4096, 16 warps) 0.1334 against 0.1344 and (8192, 32 warps) 0.1398: not
# adopted on one run each.
_FWD_TWO_PASS_CONFIG = {4096: (2048, 8), 8192: (4096, 16), 32768: (8192, 32), 65536: (8192, 32)}
# L2 hints of the two passes: x's first read evict_last (it is read again), the second
# evict_first, the weight (read by every row) evict_last. Without them, N = 32768: 0.1411 ms.
_FWD_TWO_PASS_HINTS = {"x_evict": "evict_last", "x_reread_evict": "evict_first", "w_evict": "evict_last"}
# Single-pass rows wider than this load the weight together with x (EARLY_WEIGHT). Measured on an
# H200 (bf16, M*N = 2^27, scripts/probe_rms_fwd.py, 2026-11-22): 0.1334 vs 0.1356 ms at N = 8192,
# 0.1354 vs 0.1372 at 16384, 0.1447 vs 0.1454 at 32768, outputs bitwise equal. Predicted ~0.13 ms
# at 32768 (the weight's latency after the reduction looked like the gap to torch.compile's
# 0.1325); the 0.5% gain says it was not: the gap is elsewhere. Narrower rows not measured.
_FWD_EARLY_WEIGHT_MIN_N = 4096
# The backward holds x, dy and the dw accumulator per element, three times the forward's
# registers, so it keeps rows in registers only up to half the forward's width.
_BWD_SINGLE_PASS_MAX_N = 8192
# Rows wider than _BWD_SINGLE_PASS_MAX_N and at most this wide take the wide backward kernel
# (x, dy and dw in registers for the whole row, see _rmsnorm_bwd_wide_kernel) by default.
# Measured on an H200 (2026-11-22, triton 3.6.0, bf16, M*N = 2^27, forward+backward, copy
# 4117 GB/s) at N = 16384: wide, 1 split, 32 warps 0.3496 ms (64 registers, 0 spills), 16 warps
# 0.3499, torch.compile 0.5115, the two-pass kernel + dw column kernel 0.5216, liger 0.80.
# Wider rows do not fit: at N = 32768 every wide configuration spilled (2 splits at 32 warps:
# 38 spills, 1.02 ms, against 0.5759 for the two-pass path), at 65536 they took 7+ ms.
_BWD_WIDE_MAX_N = 16384
# The wide backward's default (column splits, num_warps, stages) per padded row width. Register
# budget: the program holds x, g = dy * w and the dw accumulator for the row in fp32, 16 values
# each per thread at 32 warps (1024 threads, at most 64 registers each: one program per SM).
# Neither software pipelining (stages=2) nor prefetching the next row measured faster.
_BWD_WIDE_CONFIG = {16384: (1, 32, 1)}
# The two-pass backward's default keyword arguments of _rmsnorm_bwd per padded row width (N above
# _BWD_WIDE_MAX_N). Measured on an H200 (bf16, M * N = 2^27, default forward + backward,
# scripts/probe_gaps.py, 2026-11-22): L2 hints (pass 1's reads of x and dy evict_last, pass 2's
# evict_first, the weight evict_last) at 32 warps, 2 programs per SM, then the dw column kernel:
# N = 32768 0.5541 ms against 0.5583 without (compile 0.5099 in that run), N = 65536 0.5902
# against 0.6456 (compile 0.6614). dw_in_dx was 5-30% slower at both.
_BWD_TWO_PASS_HINTS = {"x_evict": "evict_last", "x_reread_evict": "evict_first", "w_evict": "evict_last"}
_BWD_TWO_PASS_CONFIG: dict[int, dict] = {
    32768: dict(num_warps=32, **_BWD_TWO_PASS_HINTS),
    65536: dict(num_warps=32, **_BWD_TWO_PASS_HINTS),
}
# Chunk width of the two-pass kernels: 16 fp32 values per thread at 16 warps, no spills.
_CHUNK_N = 8192
# Small N: pack rows so a program moves >= 4096 elements (8 KB of bf16); fewer, fatter programs
# keep enough bytes in flight per SM and amortise the per-program reduction and launch work.
_ELEMENTS_PER_PROGRAM = 4096


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference in fp32 (fp64 inputs stay fp64): the math of the module docstring."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(compute)
    if residual is not None:
        h = (h + residual.to(compute)).to(x.dtype).to(compute)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute)
    y = y.to(x.dtype)
    return y if residual is None else (y, h.to(x.dtype))


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _rmsnorm_fwd_rows(
    row_block,  # which BLOCK_M rows this call normalises
    x_ptr, x_stride, res_ptr, res_stride, w_ptr, y_ptr, y_stride, h_ptr, h_stride, rstd_ptr,
    M, N, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr,
    EARLY_WEIGHT: tl.constexpr, X_EVICT: tl.constexpr, X_REREAD_EVICT: tl.constexpr, W_EVICT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    rows = rows.to(tl.int64)  # offsets of tensors above 2^31 elements
    if SINGLE_PASS:
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=X_EVICT).to(ACC)
        if HAS_WEIGHT and EARLY_WEIGHT:
            # Issued with x's load, kept in its own dtype until used: its latency hides under x's
            # instead of following the reduction (one row per program leaves nothing else to overlap).
            w_early = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy=W_EVICT)
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
                w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy=W_EVICT).to(ACC)
            y = y * w[None, :]
        tl.store(y_ptr + rows[:, None] * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # BLOCK_M == 1: pass 1 sums squares chunk by chunk, pass 2 reads the row back (from
        # L2) and writes y. The residual sum is recomputed in pass 2, bit-identically, rather
        # than read back from h.
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols < N)[None, :]
            offs = start + cols[None, :]
            x = tl.load(x_ptr + rows[:, None] * x_stride + offs, mask=mask, other=0.0,
                        eviction_policy=X_EVICT).to(ACC)
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
                        eviction_policy=X_REREAD_EVICT).to(ACC)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + rows[:, None] * res_stride + offs, mask=mask, other=0.0)
                x = (x + r.to(ACC)).to(h_ptr.dtype.element_ty).to(ACC)
            y = x * rstd[:, None]
            if HAS_WEIGHT:
                w = tl.load(w_ptr + start + cols, mask=start + cols < N, other=0.0,
                            eviction_policy=W_EVICT).to(ACC)
                y = y * w[None, :]
            tl.store(y_ptr + rows[:, None] * y_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


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
    PERSISTENT: tl.constexpr,  # programs loop over row blocks; else one row block per program
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
    EARLY_WEIGHT: tl.constexpr,  # single pass: load the weight together with x
    X_EVICT: tl.constexpr,  # L2 eviction hint of x's (first) read: "", "evict_first", "evict_last"
    X_REREAD_EVICT: tl.constexpr,  # two passes: the hint of pass 2's read of x
    W_EVICT: tl.constexpr,  # ... and of the weight's, read by every row
):
    pid = tl.program_id(0)
    if PERSISTENT:
        for row_block in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
            _rmsnorm_fwd_rows(row_block, x_ptr, x_stride, res_ptr, res_stride, w_ptr, y_ptr, y_stride,
                              h_ptr, h_stride, rstd_ptr, M, N, eps,
                              BLOCK_M, BLOCK_N, SINGLE_PASS, HAS_RESIDUAL, HAS_WEIGHT, ACC, EARLY_WEIGHT,
                              X_EVICT, X_REREAD_EVICT, W_EVICT)
    else:
        # No loop at all (as liger's forward): nothing loop-carried, no trip-count bookkeeping.
        _rmsnorm_fwd_rows(pid, x_ptr, x_stride, res_ptr, res_stride, w_ptr, y_ptr, y_stride,
                          h_ptr, h_stride, rstd_ptr, M, N, eps,
                          BLOCK_M, BLOCK_N, SINGLE_PASS, HAS_RESIDUAL, HAS_WEIGHT, ACC, EARLY_WEIGHT,
                          X_EVICT, X_REREAD_EVICT, W_EVICT)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, x_stride,  # the normalised input rows (h when there was a residual), (M, N)
    w_ptr,  # weight (N,) (HAS_WEIGHT)
    dy_ptr, dy_stride,  # gradient of y
    dres_ptr, dres_stride,  # gradient of the new residual h (HAS_DRES)
    rstd_ptr,  # (M,) fp32 from the forward
    dx_ptr, dx_stride,  # gradient of x (and of the residual)
    dw_partial_ptr,  # (num_programs, N) fp32: each program's share of dw (SINGLE_PASS or DW_IN_DX)
    M, N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # the padded row block (single pass) or the chunk width (two passes)
    SINGLE_PASS: tl.constexpr,  # the row fits in registers: dw is accumulated here too
    PREFETCH: tl.constexpr,  # single pass: load the next row block while reducing this one
    DW_IN_DX: tl.constexpr,  # two passes: accumulate dw here, in the partial buffer (HAS_WEIGHT)
    REVERSE_PASS2: tl.constexpr,  # two passes: pass 2 visits the chunks last to first, so its
    #   first reads are the chunks pass 1 read last (the likeliest still in L2)
    HAS_DRES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
    X_EVICT: tl.constexpr,  # two passes: L2 eviction hint of pass 1's reads of x and dy
    X_REREAD_EVICT: tl.constexpr,  # ... of pass 2's
    W_EVICT: tl.constexpr,  # ... of the weight's
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
        if PREFETCH:
            # Software pipelining by hand: the next row block's x, dy and rstd are loaded (in
            # their storage dtype) before this one's reduction, so a program always has a load
            # in flight instead of stalling on each row's load -> reduce -> store chain.
            next_rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
            next_mask = (next_rows < M)[:, None] & col_mask[None, :]
            next_rows64 = next_rows.to(tl.int64)
            x_next = tl.load(x_ptr + next_rows64[:, None] * x_stride + cols[None, :], mask=next_mask, other=0.0)
            dy_next = tl.load(dy_ptr + next_rows64[:, None] * dy_stride + cols[None, :], mask=next_mask, other=0.0)
            rstd_next = tl.load(rstd_ptr + next_rows, mask=next_rows < M, other=0.0)
        for row_block in range(pid, num_row_blocks, num_programs):
            rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < M
            mask = row_mask[:, None] & col_mask[None, :]
            if PREFETCH:
                x_raw, dy_raw, rstd = x_next, dy_next, rstd_next
                next_rows = rows + num_programs * BLOCK_M
                next_mask = (next_rows < M)[:, None] & col_mask[None, :]
                next_rows64 = next_rows.to(tl.int64)
                x_next = tl.load(x_ptr + next_rows64[:, None] * x_stride + cols[None, :], mask=next_mask, other=0.0)
                dy_next = tl.load(dy_ptr + next_rows64[:, None] * dy_stride + cols[None, :], mask=next_mask, other=0.0)
                rstd_next = tl.load(rstd_ptr + next_rows, mask=next_rows < M, other=0.0)
                rows = rows.to(tl.int64)
            else:
                rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
                rows = rows.to(tl.int64)
                x_raw = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
                dy_raw = tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask, other=0.0)
            x = x_raw.to(ACC)
            dy = dy_raw.to(ACC)
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
        # writes dx = rstd*g - x * rstd^3 * sum/N. dw: with DW_IN_DX pass 2 also adds dy * x_hat
        # to this program's own fp32 row of the partial buffer (load, add, store, mostly in L2;
        # no atomics, the row is private); else _rmsnorm_dw_kernel reads x and dy once more.
        num_chunks = tl.cdiv(N, BLOCK_N)
        for row in range(pid, M, num_programs):
            rstd = tl.load(rstd_ptr + row)
            row64 = tl.cast(row, tl.int64)  # a new name: the loop variable keeps its type
            acc = tl.zeros([BLOCK_N], dtype=ACC)
            for start in range(0, N, BLOCK_N):
                mask = start + cols < N
                x = tl.load(x_ptr + row64 * x_stride + start + cols, mask=mask, other=0.0,
                            eviction_policy=X_EVICT).to(ACC)
                dy = tl.load(dy_ptr + row64 * dy_stride + start + cols, mask=mask, other=0.0,
                             eviction_policy=X_EVICT).to(ACC)
                if HAS_WEIGHT:
                    dy = dy * tl.load(w_ptr + start + cols, mask=mask, other=0.0, eviction_policy=W_EVICT).to(ACC)
                acc += dy * x
            coef = tl.sum(acc, axis=0) * rstd * rstd * rstd / N
            for i in range(num_chunks):
                if REVERSE_PASS2:
                    start = (num_chunks - 1 - i) * BLOCK_N
                else:
                    start = i * BLOCK_N
                mask = start + cols < N
                x = tl.load(x_ptr + row64 * x_stride + start + cols, mask=mask, other=0.0,
                            eviction_policy=X_REREAD_EVICT).to(ACC)
                dy = tl.load(dy_ptr + row64 * dy_stride + start + cols, mask=mask, other=0.0,
                             eviction_policy=X_REREAD_EVICT).to(ACC)
                if DW_IN_DX:
                    partial_ptrs = dw_partial_ptr + pid * N + start + cols
                    # The program's first row (row == pid) writes its partial row instead of
                    # adding to it (the load masked off entirely), so the buffer needs no zero fill.
                    dw = tl.load(partial_ptrs, mask=start + cols < tl.where(row == pid, 0, N), other=0.0)
                    tl.store(partial_ptrs, dw + dy * (x * rstd), mask=mask)
                if HAS_WEIGHT:
                    dy = dy * tl.load(w_ptr + start + cols, mask=mask, other=0.0, eviction_policy=W_EVICT).to(ACC)
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
    dw_partial_ptr,  # (row programs, N) fp32: program (split, p) writes its column block of row p
    M, N,
    BLOCK_N: tl.constexpr,  # the column block a program owns, kept in registers (SPLITS * BLOCK_N >= N)
    SPLITS: tl.constexpr,  # column blocks per row (grid axis 0); 1: whole rows
    STREAM_N: tl.constexpr,  # chunk in which the other blocks are read for the row's dot product
    STAGES: tl.constexpr,  # the compiler's software pipelining of the row loop (1: none)
    PREFETCH: tl.constexpr,  # load the next row's block into registers while reducing this one
    HAS_DRES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ACC: tl.constexpr,  # fp32 statistics; fp64 for fp64 inputs (gradcheck)
):
    # Program (split, p) visits rows p, p + P, ... and keeps x, dy*w and its share of dw for its
    # column block in registers, so x and dy come from HBM once and dw costs one store per
    # program. The row's dot product needs the other blocks too: they are read in chunks while
    # their owners (the programs next to this one in launch order, on the same rows) load them,
    # so those reads mostly hit L2.
    split = tl.program_id(0)
    first_row = tl.program_id(1)
    row_programs = tl.num_programs(1)
    cols = split * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([BLOCK_N], dtype=ACC)
    if PREFETCH:
        first64 = tl.cast(first_row, tl.int64)  # < M: the grid has at most M row programs
        x_next = tl.load(x_ptr + first64 * x_stride + cols, mask=col_mask, other=0.0)
        dy_next = tl.load(dy_ptr + first64 * dy_stride + cols, mask=col_mask, other=0.0)
    for row in tl.range(first_row, M, row_programs, num_stages=STAGES):
        row64 = tl.cast(row, tl.int64)
        if PREFETCH:
            x_raw, dy_raw = x_next, dy_next
            next_row = row + row_programs
            next64 = tl.cast(next_row, tl.int64)
            next_mask = cols < tl.where(next_row < M, N, 0)  # nothing past the last row
            x_next = tl.load(x_ptr + next64 * x_stride + cols, mask=next_mask, other=0.0)
            dy_next = tl.load(dy_ptr + next64 * dy_stride + cols, mask=next_mask, other=0.0)
        else:
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
        if SPLITS > 1:
            chunk = tl.arange(0, STREAM_N)
            acc = tl.zeros([STREAM_N], dtype=ACC)
            # Unrolled (compile-time trip count): the chunks' loads can all be issued at once.
            for i in tl.static_range((SPLITS - 1) * (BLOCK_N // STREAM_N)):
                # Starting after this program's block and wrapping around the padded row.
                c = (split * BLOCK_N + BLOCK_N + i * STREAM_N) % (SPLITS * BLOCK_N) + chunk
                c_mask = c < N
                xs = tl.load(x_ptr + row64 * x_stride + c, mask=c_mask, other=0.0).to(ACC)
                gs = tl.load(dy_ptr + row64 * dy_stride + c, mask=c_mask, other=0.0).to(ACC)
                if HAS_WEIGHT:
                    gs = gs * tl.load(w_ptr + c, mask=c_mask, other=0.0).to(ACC)
                acc += gs * xs
            dot += tl.sum(acc, axis=0)
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
# Launch configuration
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int | None) -> int:
    if device_index is None:  # the interpreter on the CPU: a few programs, so the loops loop
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _device_index(t: torch.Tensor) -> int | None:
    return t.device.index if t.is_cuda else None


def _config(n: int, single_pass_max_n: int, block_m: int | None = None,
            num_warps: int | None = None, chunk_n: int | None = None) -> tuple[int, int, bool, int]:
    """(BLOCK_M, BLOCK_N, SINGLE_PASS, num_warps) for rows of width n; ``block_m`` and
    ``num_warps`` override the defaults (scripts/probe_nn.py sweeps them); ``chunk_n`` forces
    two passes over chunks of that width, whatever n."""
    if chunk_n is not None:
        if chunk_n < 1 or chunk_n & (chunk_n - 1):
            raise ValueError(f"rmsnorm: chunk_n must be a power of two, got {chunk_n}")
        if block_m not in (None, 1):
            raise ValueError(f"rmsnorm: the two-pass kernels (chunk_n={chunk_n}) take one row per block, "
                             f"got block_m={block_m}")
        block_m, block_n, single = 1, chunk_n, False
    elif n <= single_pass_max_n:
        block_n = triton.next_power_of_2(n)
        if block_m is None:
            block_m = max(1, _ELEMENTS_PER_PROGRAM // block_n)
        single = True
    else:
        if block_m not in (None, 1):
            raise ValueError(f"rmsnorm: rows of width {n} take the two-pass kernels, one row per block")
        block_m, block_n, single = 1, _CHUNK_N, False
    if num_warps is None:
        # 16 fp32 values per thread per live tensor: two 16-byte bf16 vectors per load, low spills.
        num_warps = min(16, max(4, block_m * block_n // 512))
    return block_m, block_n, single, num_warps


@functools.lru_cache(maxsize=None)
def _fwd_config(n: int) -> tuple[int, int, bool, int]:
    """The forward's default (BLOCK_M, BLOCK_N, SINGLE_PASS, num_warps) for rows of width n."""
    two_pass = _FWD_TWO_PASS_CONFIG.get(triton.next_power_of_2(n))
    if two_pass is not None:
        chunk_n, num_warps = two_pass
        return _config(n, _FWD_SINGLE_PASS_MAX_N, num_warps=num_warps, chunk_n=chunk_n)
    return _config(n, _FWD_SINGLE_PASS_MAX_N)


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
            compiled = kernel.warmup(*args, grid=(1,), **meta)
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
        except Exception:  # noqa: BLE001  (an API difference must not break the backward)
            _resident_cache[key] = 2
    return _resident_cache[key]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _tl_acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, N) view with unit column stride (copies only when the last dim is strided)."""
    rows = t.reshape(-1, n)
    return rows if rows.stride(-1) == 1 or rows.shape[0] == 0 else rows.contiguous()


# Launch plans (launchers, grids, buffer shapes) by everything that decides them, so a call with
# a shape seen before does no configuration work and launches through CachedLauncher. Bounded:
# shapes that change every step (sequence lengths) drop the oldest plan.
_MAX_PLANS = 256
_fwd_plans: dict[tuple, CachedLauncher] = {}
_bwd_plans: dict[tuple, _BwdPlan] = {}


def _remember(plans: dict, key: tuple, plan):
    if len(plans) >= _MAX_PLANS:
        del plans[next(iter(plans))]
    plans[key] = plan
    return plan


def _rmsnorm_fwd(x2d, weight, residual2d, eps, *, block_m=None, num_warps=None, programs_per_sm=None,
                 early_weight=None, chunk_n=None, x_evict=None, x_reread_evict=None, w_evict=None, rstd=None):
    """y, h (the new residual, or None) and rstd. The keyword arguments override the launch
    configuration (None: the default); ``programs_per_sm`` makes the grid persistent (0: one row
    block per program, the default), ``chunk_n`` forces two passes over chunks of that width,
    ``x_evict`` / ``x_reread_evict`` / ``w_evict`` are the L2 eviction hints of x's reads and
    the weight's ("" none; None the default: _FWD_TWO_PASS_HINTS for two passes, none for one)."""
    m, n = x2d.shape
    # empty_like of rows with unit column stride is row-major (and cheaper on the host than empty).
    y = torch.empty_like(x2d)
    h = torch.empty_like(y) if residual2d is not None else None
    if rstd is None:
        rstd = torch.empty(m, dtype=_acc_dtype(x2d.dtype), device=x2d.device)
    if m == 0:
        return y, h, rstd
    key = (m, n, x2d.dtype, x2d.get_device(), residual2d is not None, weight is not None,
           block_m, num_warps, programs_per_sm, early_weight, chunk_n, x_evict, x_reread_evict, w_evict)
    launch = _fwd_plans.get(key)
    if launch is None:
        launch = _remember(_fwd_plans, key, _fwd_launcher(m, n, x2d, key[4], key[5], block_m, num_warps,
                                                          programs_per_sm, early_weight, chunk_n, x_evict,
                                                          x_reread_evict, w_evict))
    launch(
        x2d, x2d.stride(0),
        residual2d if residual2d is not None else x2d, residual2d.stride(0) if residual2d is not None else 0,
        weight if weight is not None else x2d,
        y, y.stride(0),
        h if h is not None else y, h.stride(0) if h is not None else 0,
        rstd, m, n, eps,
    )
    return y, h, rstd


def _fwd_launcher(m, n, x2d, has_residual, has_weight, block_m, num_warps, programs_per_sm,
                  early_weight, chunk_n, x_evict, x_reread_evict, w_evict) -> CachedLauncher:
    if block_m is None and num_warps is None and chunk_n is None:
        block_m, block_n, single, num_warps = _fwd_config(n)
    else:
        block_m, block_n, single, num_warps = _config(n, _FWD_SINGLE_PASS_MAX_N, block_m, num_warps, chunk_n)
    row_blocks = triton.cdiv(m, block_m)
    # One row block per program unless programs_per_sm asks for a persistent grid.
    persistent = bool(programs_per_sm)
    grid = min(row_blocks, programs_per_sm * _sm_count(_device_index(x2d))) if persistent else row_blocks
    if not single:  # the two-pass L2 hints unless given ("" for none)
        x_evict = _FWD_TWO_PASS_HINTS["x_evict"] if x_evict is None else x_evict
        x_reread_evict = _FWD_TWO_PASS_HINTS["x_reread_evict"] if x_reread_evict is None else x_reread_evict
        w_evict = _FWD_TWO_PASS_HINTS["w_evict"] if w_evict is None else w_evict
    return CachedLauncher(
        _rmsnorm_fwd_kernel, (grid,),
        BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single, PERSISTENT=persistent,
        HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, ACC=_tl_acc(x2d.dtype),
        EARLY_WEIGHT=bool(single and (early_weight if early_weight is not None else n > _FWD_EARLY_WEIGHT_MIN_N)),
        X_EVICT=x_evict or "", X_REREAD_EVICT=x_reread_evict or "", W_EVICT=w_evict or "",  # None: no hint
        num_warps=num_warps,
    )


class _BwdPlan(NamedTuple):
    main: CachedLauncher  # _rmsnorm_bwd_kernel or _rmsnorm_bwd_wide_kernel
    partial_rows: int  # rows of the fp32 dw partial buffer (0: no weight)
    dw_columns: CachedLauncher | None  # _rmsnorm_dw_kernel, which writes the partials (two passes, no dw_in_dx)
    rows_per_split: int  # rows each dw_columns program sums
    sum_rows: CachedLauncher | None  # _sum_rows_kernel: partials -> dw


def _rmsnorm_bwd(x2d, weight, rstd, dy2d, dres2d, *, block_m=None, num_warps=None, programs_per_sm=None,
                 prefetch=None, wide_splits=None, stages=None, chunk_n=None, dw_in_dx=None, reverse_pass2=None,
                 x_evict=None, x_reread_evict=None, w_evict=None):
    """dx and dw (None without a weight). The keyword arguments override the launch
    configuration (None: the default for this N):

    - ``wide_splits``: 0 takes the row kernels (single pass up to ``_BWD_SINGLE_PASS_MAX_N``,
      else two passes); k >= 1 the wide kernel with k column blocks per row
      (``_rmsnorm_bwd_wide_kernel``, any N); None: the wide kernel with ``_BWD_WIDE_CONFIG``
      for N in (``_BWD_SINGLE_PASS_MAX_N``, ``_BWD_WIDE_MAX_N``] unless a two-pass keyword
      below is given, the row kernels otherwise.
    - ``stages``: the wide kernel's software pipelining of its row loop (1: none).
    - ``prefetch``: load the next rows into registers while reducing the current ones; on by
      default in the single-pass row kernel (measured on an H200, bf16, M*N = 2^27, N = 256 to
      8192: 0.338-0.340 ms of forward+backward against 0.370 without), off in the wide one.
    - Two-pass row kernel: ``chunk_n`` (chunk width, a power of two; given, it forces two passes
      at any N), ``dw_in_dx`` (accumulate dw in the dx kernel's pass 2 into one fp32 partial row
      per program instead of running ``_rmsnorm_dw_kernel``: x and dy come from HBM once, not
      twice), ``reverse_pass2`` (pass 2 visits the chunks last to first). None: from
      ``_BWD_TWO_PASS_CONFIG`` for the padded N when ``dw_in_dx`` is None, else off / ``_CHUNK_N``.
      ``x_evict`` / ``x_reread_evict`` / ``w_evict``: L2 eviction hints of pass 1's reads of x and
      dy, of pass 2's, and of the weight's (None or "": no hint).
    - ``block_m`` (row kernels), ``num_warps``, ``programs_per_sm`` (persistent grid size)."""
    m, n = x2d.shape
    dx = torch.empty_like(x2d)  # row-major: rows with unit column stride (cheaper than empty)
    has_weight = weight is not None
    if m == 0:
        return dx, (torch.zeros_like(weight) if has_weight else None)
    key = (m, n, x2d.dtype, x2d.get_device(), has_weight, dres2d is not None, block_m, num_warps,
           programs_per_sm, prefetch, wide_splits, stages, chunk_n, dw_in_dx, reverse_pass2,
           x_evict, x_reread_evict, w_evict)
    plan = _bwd_plans.get(key)
    args = [
        x2d, x2d.stride(0),
        weight if has_weight else x2d,
        dy2d, dy2d.stride(0),
        dres2d if dres2d is not None else dy2d, dres2d.stride(0) if dres2d is not None else 0,
        rstd,
        dx, dx.stride(0),
        rstd,  # the dw partials where the main kernel writes them, set below
        m, n,
    ]
    if plan is None:
        plan = _remember(_bwd_plans, key, _bwd_plan(args, *key[4:]))
    if not has_weight:
        plan.main(*args)
        return dx, None
    partial = torch.empty((plan.partial_rows, n), dtype=rstd.dtype, device=x2d.device)
    if plan.dw_columns is None:
        args[10] = partial
    plan.main(*args)
    if plan.dw_columns is not None:
        plan.dw_columns(x2d, x2d.stride(0), dy2d, dy2d.stride(0), rstd, partial, m, n, plan.rows_per_split)
    dw = torch.empty_like(weight)
    plan.sum_rows(partial, dw, plan.partial_rows, n)
    return dx, dw


def _bwd_plan(args, has_weight, has_dres, block_m, num_warps, programs_per_sm, prefetch, wide_splits,
              stages, chunk_n, dw_in_dx, reverse_pass2, x_evict, x_reread_evict, w_evict) -> _BwdPlan:
    x2d = args[0]
    m, n = x2d.shape
    sms = _sm_count(_device_index(x2d))
    acc = _tl_acc(x2d.dtype)
    two_pass_keywords = (chunk_n, dw_in_dx, reverse_pass2) != (None, None, None)
    if (wide_splits is None and block_m is None and not two_pass_keywords
            and _BWD_SINGLE_PASS_MAX_N < n <= _BWD_WIDE_MAX_N):
        wide_splits, default_warps, default_stages = _BWD_WIDE_CONFIG[triton.next_power_of_2(n)]
        num_warps = num_warps or default_warps
        stages = stages or default_stages
    if wide_splits:
        if block_m not in (None, 1):
            raise ValueError(f"rmsnorm: the wide backward takes one row per program, got block_m={block_m}")
        if two_pass_keywords:
            raise ValueError("rmsnorm: chunk_n, dw_in_dx and reverse_pass2 apply to the two-pass row kernel, "
                             f"not the wide backward (wide_splits={wide_splits})")
        kernel, splits, single = _rmsnorm_bwd_wide_kernel, wide_splits, True
        block_n = triton.next_power_of_2(triton.cdiv(n, splits))
        num_warps = num_warps or min(16, max(4, block_n // 512))
        meta = dict(
            # 8 values per thread per chunk: one 16-byte load of bf16 per tensor.
            BLOCK_N=block_n, SPLITS=splits, STREAM_N=min(block_n, 8 * 32 * num_warps), STAGES=stages or 1,
            PREFETCH=bool(prefetch), HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc, num_warps=num_warps,
        )
    else:
        kernel, splits = _rmsnorm_bwd_kernel, 1
        if dw_in_dx is None and n > _BWD_WIDE_MAX_N:
            defaults = _BWD_TWO_PASS_CONFIG.get(triton.next_power_of_2(n), {})
            dw_in_dx = defaults.get("dw_in_dx")
            chunk_n = chunk_n if chunk_n is not None else defaults.get("chunk_n")
            reverse_pass2 = reverse_pass2 if reverse_pass2 is not None else defaults.get("reverse_pass2")
            num_warps = num_warps or defaults.get("num_warps")
            programs_per_sm = programs_per_sm or defaults.get("programs_per_sm")
            x_evict = defaults.get("x_evict") if x_evict is None else x_evict
            x_reread_evict = defaults.get("x_reread_evict") if x_reread_evict is None else x_reread_evict
            w_evict = defaults.get("w_evict") if w_evict is None else w_evict
        block_m, block_n, single, num_warps = _config(n, _BWD_SINGLE_PASS_MAX_N, block_m, num_warps, chunk_n)
        if single and (dw_in_dx or reverse_pass2):
            raise ValueError(f"rmsnorm: dw_in_dx and reverse_pass2 apply to the two-pass kernel (N > "
                             f"{_BWD_SINGLE_PASS_MAX_N} or chunk_n given), not to rows of width {n}")
        meta = dict(
            BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single, PREFETCH=single and (prefetch is None or bool(prefetch)),
            DW_IN_DX=bool(dw_in_dx) and has_weight, REVERSE_PASS2=bool(reverse_pass2),
            HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc, num_warps=num_warps,
            X_EVICT=x_evict or "", X_REREAD_EVICT=x_reread_evict or "", W_EVICT=w_evict or "",
        )
    # Persistent, each program looping over rows. Single pass (and wide): as many programs per SM
    # as can be resident at once (from the compiled kernel's registers and shared memory); more
    # would run as a second, partial wave, a tail of one program per SM. Two passes: 2 per SM, so
    # the rows re-read in pass 2 stay in L2. Capped at the row blocks so every program writes a
    # dw partial (with dw_in_dx: every program has a first row, which initialises its partial).
    if programs_per_sm is None:
        programs_per_sm = _resident_per_sm(kernel, args, meta, x2d) if single else 2
    row_programs = min(triton.cdiv(m, block_m if not wide_splits else 1), max(1, programs_per_sm * sms // splits))
    grid = (splits, row_programs) if wide_splits else (row_programs,)
    main = CachedLauncher(kernel, grid, **meta)
    if not has_weight:
        return _BwdPlan(main, 0, None, 0, None)
    dw_columns, rows_per_split, partial_rows = None, 0, row_programs
    if not single and not dw_in_dx:
        dw_block_n = 256
        col_blocks = triton.cdiv(n, dw_block_n)
        dw_splits = max(1, min(triton.cdiv(m, 32), 4 * sms // col_blocks))
        rows_per_split = triton.cdiv(m, dw_splits)
        partial_rows = triton.cdiv(m, rows_per_split)
        dw_columns = CachedLauncher(_rmsnorm_dw_kernel, (col_blocks, partial_rows),
                                    BLOCK_R=32, BLOCK_N=dw_block_n, ACC=acc, num_warps=16)
    sum_rows = CachedLauncher(_sum_rows_kernel, (triton.cdiv(n, 64),),
                              BLOCK_P=64, BLOCK_N=64, ACC=acc, num_warps=8)
    return _BwdPlan(main, partial_rows, dw_columns, rows_per_split, sum_rows)


# rstd written by forwards nobody differentiates: one buffer per (rows, dtype, device), never read.
_MAX_SCRATCH = 16
_rstd_scratch: dict[tuple, torch.Tensor] = {}


def _scratch_rstd(m: int, x2d: torch.Tensor) -> torch.Tensor:
    key = (m, x2d.dtype, x2d.device)
    buf = _rstd_scratch.get(key)
    if buf is None:
        buf = _remember(_rstd_scratch, key, torch.empty(m, dtype=_acc_dtype(x2d.dtype), device=x2d.device))
        while len(_rstd_scratch) > _MAX_SCRATCH:
            del _rstd_scratch[next(iter(_rstd_scratch))]
    return buf


def _forward(x, weight, residual, eps, keep_rstd=True):
    """y and h (None without a residual) shaped like x, and what the backward needs: the
    normalised rows, the weight as read, rstd (a shared scratch buffer unless ``keep_rstd``)."""
    n = x.shape[-1]
    x2d = _as_rows(x, n)
    res2d = _as_rows(residual, n) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    y, h, rstd = _rmsnorm_fwd(x2d, w, res2d, eps, rstd=None if keep_rstd else _scratch_rstd(x2d.shape[0], x2d))
    saved = (h if h is not None else x2d, w, rstd)
    if x.dim() == 2:  # a view costs host time; launch-bound calls notice
        return y, h, saved
    return y.view(x.shape), (h.view(x.shape) if h is not None else None), saved


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        y, h, saved = _forward(x, weight, residual, eps)
        ctx.save_for_backward(*saved)
        ctx.shape, ctx.has_residual = x.shape, residual is not None
        ctx.set_materialize_grads(False)
        return y if h is None else (y, h)

    @staticmethod
    def backward(ctx, dy, dh=None):
        normed, weight, rstd = ctx.saved_tensors
        n = normed.shape[-1]
        dy2d = _as_rows(dy, n) if dy is not None else torch.zeros_like(normed)
        dres2d = _as_rows(dh, n) if dh is not None else None
        dx, dw = _rmsnorm_bwd(normed, weight, rstd, dy2d, dres2d)
        if len(ctx.shape) != 2:
            dx = dx.view(ctx.shape)
        dres = dx if ctx.has_residual else None  # autograd clones where one tensor feeds two leaves
        return dx, dw, dres, None


# ------------------------------------------------------------------------------------------------
# torch.library custom ops: what torch.compile sees (an opaque op with a fake and an autograd
# formula, so a model compiles with fullgraph=True; the op body runs the same launches as eager)
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("kernelbench::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd_op(
    x: torch.Tensor, weight: Optional[torch.Tensor], residual: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, rstd): h = x + residual (an empty tensor without a residual), rstd of shape (M,)."""
    y, h, saved = _forward(x, weight, residual, eps)
    return y, (h if h is not None else x.new_empty(0)), saved[2]


@_rms_norm_fwd_op.register_fake
def _(x, weight, residual, eps):
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    _check_inputs(x, weight, residual)
    if x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm(impl='triton'): last dimension {x.shape[-1]} > {MAX_N}, the widest row the "
                         "Triton kernels take; use impl='torch' or impl='auto'")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    h = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    return x.new_empty(x.shape), h, x.new_empty((rows,), dtype=_acc_dtype(x.dtype))


@torch.library.custom_op("kernelbench::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(
    dy: torch.Tensor, dh: Optional[torch.Tensor], normed: torch.Tensor, weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) from the normalised input h (or x); dw is an empty tensor without a weight."""
    n = normed.shape[-1]
    dx, dw = _rmsnorm_bwd(_as_rows(normed, n), weight.contiguous() if weight is not None else None, rstd,
                          _as_rows(dy, n),
                          _as_rows(dh, n) if dh is not None else None)
    return dx.view(normed.shape), (dw if dw is not None else normed.new_empty(0))


@_rms_norm_bwd_op.register_fake
def _(dy, dh, normed, weight, rstd):
    return normed.new_empty(normed.shape), (weight.new_empty(weight.shape) if weight is not None else normed.new_empty(0))


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


@torch.compiler.assume_constant_result
def _triton_blocker_const(is_cuda: bool) -> bool:
    """For a traced call, at trace time: raise when the Triton kernels cannot run here."""
    why_not = None
    if not getattr(triton, "available", True):
        why_not = "triton not installed"
    elif not is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        why_not = "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    if why_not:
        raise ValueError(f"rms_norm(impl='triton'): {why_not}; use impl='torch' or impl='auto'")
    return True


# ------------------------------------------------------------------------------------------------
# Public API
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
    if not getattr(triton, "available", True):
        return "triton not installed"
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    if x.shape[-1] > MAX_N:
        return f"last dimension {x.shape[-1]} > {MAX_N}, the widest row the Triton kernels take"
    return None


def _torch_rms_norm(x, weight, eps, residual):
    if residual is None:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), weight, eps), h


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    residual: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension of ``x`` (fp32 / bf16 / fp16), statistics in fp32.

    ``residual``: add it to ``x`` first and return ``(y, x + residual)`` (the new residual
    stream). ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in ``torch.nn.RMSNorm``.
    ``impl``: "triton", "torch" (``torch.nn.functional.rms_norm``) or "auto" (the faster of the
    two for this shape and dtype, measured once and cached on disk; see kernelbench.nn.autoselect).
    """
    if impl not in IMPLS:
        raise ValueError(f"rms_norm: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    compiling = torch.compiler.is_compiling()
    # Traced calls are checked by the op's fake implementation (a raise here would be a graph break).
    if not compiling:
        _check_inputs(x, weight, residual)
    if eps is None:
        eps = torch.finfo(x.dtype).eps if x.dtype.is_floating_point else 0.0
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad)
        or (residual is not None and residual.requires_grad))
    if impl == "auto":
        from .autoselect import choose_impl

        impl = "torch" if x.shape[-1] > MAX_N else choose_impl(
            "rmsnorm", tuple(x.shape), x.dtype, x.device, requires_grad=needs_grad)
    if impl == "torch":
        return _torch_rms_norm(x, weight, eps, residual)
    if compiling:
        _triton_blocker_const(x.is_cuda)
        return _rms_norm_compiled(x, weight, residual, float(eps))
    if not ((x.is_cuda and _HAVE_TRITON) or _interpreter()) or x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm(impl='triton'): {triton_usable(x)}; use impl='torch' or impl='auto'")
    if needs_grad:
        return _RMSNormFunction.apply(x, weight, residual, float(eps))
    # No gradient to record: skip autograd.Function's bookkeeping and rstd's allocation (host
    # time in launch-bound calls).
    y, h, _ = _forward(x, weight, residual, float(eps), keep_rstd=False)
    return y if h is None else (y, h)


@functools.lru_cache(maxsize=1)
def _interpreter() -> bool:
    """TRITON_INTERPRET as the kernels were defined (read once: environ lookups cost host time)."""
    return getattr(triton, "available", True) and os.environ.get("TRITON_INTERPRET") == "1"


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class RMSNorm(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm`` on kernelbench's Triton kernels.

    Same constructor (``normalized_shape``, ``eps``, ``elementwise_affine``, ``device``,
    ``dtype``) plus ``impl`` ("auto", "triton", "torch"). ``forward(x, residual=None)``: with a
    residual, returns ``(y, x + residual)``.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.impl = impl
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        k = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - k:]) != self.normalized_shape:
            raise ValueError(
                f"RMSNorm: input of shape {tuple(x.shape)} does not end in normalized_shape "
                f"{self.normalized_shape}"
            )
        if k == 1:
            return rms_norm(x, self.weight, self.eps, residual=residual, impl=self.impl)
        # Several normalised dims: flatten them into one row (a view for contiguous inputs).
        flat = x.reshape(*x.shape[: x.dim() - k], -1)
        flat_res = residual.reshape(flat.shape) if residual is not None else None
        weight = self.weight.reshape(-1) if self.weight is not None else None
        out = rms_norm(flat, weight, self.eps, residual=flat_res, impl=self.impl)
        if residual is None:
            return out.reshape(x.shape)
        return out[0].reshape(x.shape), out[1].reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"impl={self.impl!r}"
        )
