"""RMSNorm's Triton kernels. Host code, launch configurations and plans: ``host.py``.

Math, for a row x of length N (statistics in fp32 whatever the input dtype; fp64 for fp64):

    h      = x + residual                        (only with a residual; stored as the new residual)
    rstd   = 1 / sqrt(mean(h^2) + eps)
    x_hat  = h * rstd
    y      = x_hat * w                           (rounded once, to the input dtype)

    g      = dy * w
    dh     = rstd * (g - x_hat * mean(g * x_hat))   (+ d(new residual) when there is a residual)
    dw     = sum over rows of dy * x_hat          (accumulated in fp32)
    dx = dresidual = dh

- ``_rmsnorm_fwd_kernel``: a row block per program; rows in registers (several per program when
  N is small), or one row per program in two passes (sum of squares chunk by chunk, then the
  row read back from L2 and y written).
- ``_rmsnorm_bwd_kernel``: a persistent grid, each program keeping its share of dw in fp32
  registers (rows in registers, next rows loaded while the current ones reduce), or one row per
  step in two passes (dot product, then dx) for rows too wide for registers.
- ``_rmsnorm_bwd_wide_kernel``: one whole row per step in registers, x and dy read once.
- ``_rmsnorm_dw_kernel``: dw by column blocks, for the two-pass backward.
- ``_sum_rows_kernel``: the fp32 dw partials of the programs summed to dw.
"""

from __future__ import annotations

from .._triton_support import tl, triton


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
