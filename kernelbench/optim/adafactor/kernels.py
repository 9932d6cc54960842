"""Adafactor8bit's Triton kernels. Launch configurations, plans and launches: ``host.py``.

The math is ``AdafactorRef``'s (``reference.py``, the fp32 reference next to this file):
relative step rho = min(lr, 1/sqrt(t)), parameter scale alpha = rho * max(eps2, RMS(p)),
beta2_t = 1 - t^decay_rate (or a fixed beta2), second moment from G = g^2 + eps1, factored over
the last two dims for params with >= 2 dims (rows r, columns c, u = g * rsqrt(r / mean(r) * c)),
full otherwise (u = g * rsqrt(v)), clipping u /= max(1, RMS(u) / clip_threshold), optional first
moment m <- beta1 m + (1 - beta1) u, decoupled weight decay p <- p (1 - rho wd) - alpha u.

State (per parameter; fp32 when the group has ``quantize=False`` or numel < ``min_8bit_size``):

    step                   fp32 scalar on the parameter's device (read and written by the kernels)
    row_q, col_q           uint8 log2 codes of r and c; row_range / col_range: fp32 (lo, hi) per
                           block of ROW_BLOCK rows / COL_BLOCK columns           (fp32: row, col)
    v_q                    uint8 log2 codes of v; v_range: fp32 (lo, hi) per FLAT_BLOCK elements
                                                                                 (fp32: v)
    m_q, m_scale           uint8 sign + 7-bit magnitude, sqrt-companded, absmax per COL_BLOCK
                           columns of a row (factored) or per FLAT_BLOCK elements  (fp32: m)

Second-moment codes (r, c, v are positive): a block stores lo and hi of log2(x) (lo raised to
hi - LOG2_SPAN so that one eps1-sized element cannot stretch the block) and each element
q = floor(255 (log2 x - lo) / (hi - lo) + U), U uniform in [0, 1) (stochastic rounding, seeded by
(parameter, step, element), so runs and resumed runs are bitwise reproducible); decoding gives
x' = 2^(lo + q (hi - lo) / 255). The error is relative, whatever the magnitude: |log2 x' - log2 x|
< (hi - lo) / 255, i.e. x'/x within 2^(+-(hi-lo)/255): at most +-11.5% at the span cap (40 octaves),
+-2.8% for a block spanning 10 octaves; rsqrt(x), which the update uses, errs by half of that.
Stochastic rounding keeps the EMA unbiased (in log2) where rounding to nearest would freeze an
EMA whose per-step change is below half a code (beta2_t near 1). Values below 2^lo decode as 2^lo.
First moment: q = floor(127 sqrt(|m| / absmax) + U) with the sign in bit 7; m' = (q/127)^2 absmax;
the resolution is absmax * 2q/127^2 near q, finer for small |m| than a linear code.

Kernels, per param group and per bucket of same-kind tensors (factored / full x 8-bit / fp32),
one launch each, over every tensor of the bucket (addresses and sizes come from an int64 table
built when the set of tensors changes; work items are (tensor, block of rows) or (tensor, chunk)):

    factored  K1 stats     read g (and p):   row sums of G -> r (EMA, requantised here, since a
                                             program owns whole rows), column partial sums per row
                                             block, partial sums of p^2 and of r
              K2 columns   read the column partials -> c (EMA, requantised), mean(r) per matrix
              K3 rms       read g:           partial sums of u^2
    full      N1 rms       read g, v (, p):  v' (not stored), partial sums of u^2 and p^2
    all       K4 finish    per tensor: RMS(p), RMS(u) -> alpha, 1/clip, decay; step += 1
    factored  K5 apply     read g, p (, m):  write p (, m)
    full      N3 apply     read g, v, p (, m): recompute v' (same arithmetic as N1), write v, p (, m)

Traffic per parameter: factored 24 bytes (g three times, p twice, p written; the row / column
statistics are O(rows + cols)), full 8-bit 23 bytes, plus 2 for an 8-bit first moment. The reads
of g are inherent to the algorithm without a grid-wide barrier: the column statistics need every
row, RMS(u) needs the new statistics, and the update needs RMS(u). RMS(p) rides on the first pass.
No step reads anything back to the host: the step counter, the reductions and the scalars derived
from them live on the device; partial sums are reduced in a fixed order (no atomics), so results
are deterministic. Parameters and gradients: fp32, contiguous.

Sharded tensors (each rank holds rows [row0, row0 + rows) of every matrix, or elements of a 1-dim
tensor; ``host.ShardInfo``): the same kernels over the local rows, with the global sums exchanged in
between (``host._launch_sharded_step``; each exchange is one all-reduce of one workspace slice per
process group, no host synchronisation):

    factored  K1 (SHARDED)  row statistic from the local rows; its codes wait (K5), since the
                            range of a row block that ranks share needs all of its rows
              K2 phase 1    local column sums, sum of r, log2 min / max of r per row block
      A: SUM  column sums, sum of r
              K2 phase 2    c (EMA, requantised as on one device), mean(r) = sum / global rows; K3
    full      N1 (SHARDED)  items over the whole tensor's blocks, so one program per rank owns each
                            block: partials of u^2, p^2, log2 min / max of v' per block
    all       K4 phase 1    sums of p^2, u^2 per tensor
      B: SUM  those sums; MAX  the -lo / hi slots of shared code blocks
              K4 phase 2    scalars from global sums and numel; row ranges written (8-bit)
    factored  K5 (SHARDED)  also encodes r with the shared ranges
    full      N3 (SHARDED)  encodes v with the shared ranges; an 8-bit m goes to the workspace
      C: MAX  absmax per block of full tensors' 8-bit m, then N4 encodes it

Stochastic rounding is seeded by global indices, and min / max are exact, so wherever the sharded
statistics equal the single-device ones the codes do too. r and v come from each row's own
elements, added over the same column tiles as on one device; the column statistic and the
per-tensor sums agree up to the order of their additions.
"""


from __future__ import annotations

import triton
import triton.language as tl

# Globals read inside @triton.jit functions must be tl.constexpr objects: compiled Triton refuses
# any other global (NameError at compile time), although the interpreter accepts them.
# tests/test_optim_adafactor.py::test_kernels_read_only_constexpr_globals checks this on the CPU.
LOG2_SPAN = tl.constexpr(40.0)

# Columns of the per-tensor int64 table (addresses are 0 where a tensor has no such state).
_M_G, _M_P, _M_STEP, _M_V, _M_VR, _M_COL, _M_COLR, _M_M, _M_MS = (tl.constexpr(i) for i in range(9))
_M_R, _M_C, _M_B, _M_ITEM0, _M_NITEMS, _M_COLPART, _M_ROWTMP, _M_COLTMP, _M_RMEAN, _M_SALT = (
    tl.constexpr(i) for i in range(9, 19))
# Sharded tensors only (read by the SHARDED / PHASE variants; 0 in a single-device plan): the global
# index of the local first row (factored: row of each matrix; full: element), the global rows of
# each matrix (factored) or elements (full), and workspace offsets of the slots exchanged with the
# other ranks: column and row-statistic sums, (p^2, u^2) sums, range slots (-lo, hi) of code blocks
# that ranks share, the first moment's absmax slots, the new first moment (fp32) awaiting its
# absmax; the number of row-range entries the finish kernel writes.
_M_ROW0, _M_RG, _M_SUMA, _M_SUMB, _M_MAXB, _M_MAXC, _M_MTMP, _M_NRANGE = (tl.constexpr(i) for i in range(19, 27))
NMETA = tl.constexpr(27)
# Random streams for stochastic rounding (one per kind of state, so their noise is independent).
_STREAM_ROW, _STREAM_COL, _STREAM_V, _STREAM_M = (tl.constexpr(i) for i in range(4))

# log2 of 0 is -inf: values are floored here before encoding. The smallest normal fp32: Triton types a
# smaller literal (an fp32 subnormal) as fp64, and every expression it enters is then computed in fp64.
_TINY = tl.constexpr(2.0 ** -126)


# ----------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _seed(t, salt, stream: tl.constexpr):
    # step t (fp32, exact below 2^24), parameter salt and stream -> an int32 Philox seed
    return t.to(tl.int32) * 4 + stream + salt.to(tl.int32) * 1000003


@triton.jit
def _one_minus_beta2(t, beta2, decay_rate, FIXED_BETA2: tl.constexpr):
    # 1 - beta2_t = t^decay_rate; returned as beta2_t (the EMA keeps beta2_t * old + (1 - beta2_t) new)
    if FIXED_BETA2:
        return beta2
    return 1.0 - tl.exp2(decay_rate * tl.log2(t))


# Multiply-adds are written as tl.fma: the compiler contracts a * b + c into one differently from
# kernel to kernel, and the sharded step computes in other kernels the values one device computes.
@triton.jit
def _log2_range(logx, mask, axis: tl.constexpr):
    hi = tl.max(tl.where(mask, logx, -float("inf")), axis=axis)
    lo = tl.min(tl.where(mask, logx, float("inf")), axis=axis)
    return tl.maximum(lo, hi - LOG2_SPAN), hi


@triton.jit
def _log2_encode(logx, lo, hi, noise):
    # hi == lo (a constant block) encodes everything as 0, which decodes to 2^lo exactly
    scale = 255.0 / tl.maximum(hi - lo, 1e-30)
    q = tl.floor(tl.where(hi > lo, tl.fma(logx - lo, scale, noise), noise))
    return tl.minimum(tl.maximum(q, 0.0), 255.0).to(tl.uint8)


@triton.jit
def _log2_decode(q, lo, hi):
    return tl.exp2(tl.fma(q.to(tl.float32), (hi - lo) / 255.0, lo))


@triton.jit
def _signed_encode(m, absmax, noise):
    inv = tl.where(absmax > 0.0, 1.0 / tl.maximum(absmax, _TINY), 0.0)
    mag = tl.minimum(tl.floor(tl.fma(127.0, tl.sqrt(tl.abs(m) * inv), noise)), 127.0)
    return (mag + tl.where(m < 0.0, 128.0, 0.0)).to(tl.uint8)


@triton.jit
def _signed_decode(q, absmax):
    qi = q.to(tl.int32)
    mag = (qi & 127).to(tl.float32) * (1.0 / 127.0)
    return tl.where(qi >= 128, -1.0, 1.0) * mag * mag * absmax


# ----------------------------------------------------------------------------------------------
# Factored tensors
# ----------------------------------------------------------------------------------------------
@triton.jit
def _work_item(items_ptr, meta_ptr):
    """This program's work item: the tensor index k, the block j within it, and k's row of the
    per-tensor table."""
    pid = tl.program_id(0)
    k = tl.load(items_ptr + 2 * pid)
    j = tl.load(items_ptr + 2 * pid + 1)
    return k, j, meta_ptr + k * NMETA


@triton.jit
def _matrix_rows(meta, j, ALIGNED: tl.constexpr, BR: tl.constexpr):
    """A factored tensor's g and p (fp32 pointers), its (R, C) matrices, and the BR rows of work
    item j: the matrix b, the rows within it, their mask, their row index over all of the
    tensor's rows and the element offset where each starts."""
    g_addr = tl.load(meta + _M_G)
    p_addr = tl.load(meta + _M_P)
    R = tl.load(meta + _M_R)
    C = tl.load(meta + _M_C)
    if ALIGNED:  # every address 16-byte aligned and C % 16 == 0: lets the compiler vectorise
        g_addr = tl.multiple_of(g_addr, 16)
        p_addr = tl.multiple_of(p_addr, 16)
        C = tl.multiple_of(C, 16)
    nrb = (R + BR - 1) // BR
    b = j // nrb
    rows = (j - b * nrb) * BR + tl.arange(0, BR)
    row_mask = rows < R
    row_index = b * R + rows
    row_start = row_index.to(tl.int64) * C
    return (g_addr.to(tl.pointer_type(tl.float32)), p_addr.to(tl.pointer_type(tl.float32)), R, C, b,
            row_mask, row_index, row_start)


@triton.jit
def _flat_blocks(meta, j, NB: tl.constexpr, QB: tl.constexpr):
    """A full (unfactored) tensor's element count and work item j's NB blocks of QB elements:
    block indices, element offsets (NB, QB), and their masks."""
    N = tl.load(meta + _M_R)
    blocks = j * NB + tl.arange(0, NB)
    offs = blocks[:, None] * QB + tl.arange(0, QB)[None, :]
    return N, blocks, offs, offs < N, blocks * QB < N


@triton.jit
def _flat_blocks_sharded(meta, j, NB: tl.constexpr, QB: tl.constexpr):
    """Work item j of a sharded full tensor: NB blocks of QB elements of the *whole* tensor (so
    that one program on each rank owns a code block whichever ranks hold its elements), their
    element indices in the whole tensor, offsets in the local shard, and masks: elements held
    here, blocks within the tensor."""
    blocks = j * NB + tl.arange(0, NB)
    global_offs = blocks[:, None] * QB + tl.arange(0, QB)[None, :]
    offs = global_offs - tl.load(meta + _M_ROW0)
    mask = (offs >= 0) & (offs < tl.load(meta + _M_R))
    return blocks, global_offs, offs, mask, blocks * QB < tl.load(meta + _M_RG)


@triton.jit
def _update_factor(meta, ws_ptr, index, mask, j, new, t, beta2t,
                   STATE: tl.constexpr, RANGE: tl.constexpr, TMP: tl.constexpr, STREAM: tl.constexpr,
                   QUANT: tl.constexpr):
    """One factored statistic (row or column means of g^2) of work item j at ``index``: the
    moving average of its old value (8-bit log2 codes with one range per item, or fp32) and
    ``new``, written to the workspace (table column TMP) for the apply kernel and back to the
    state (table columns STATE / RANGE), requantised with stochastic rounding. Returns it."""
    if QUANT:
        q_ptr = tl.load(meta + STATE).to(tl.pointer_type(tl.uint8))
        range_ptr = tl.load(meta + RANGE).to(tl.pointer_type(tl.float32))
        lo = tl.load(range_ptr + 2 * j)
        hi = tl.load(range_ptr + 2 * j + 1)
        old = _log2_decode(tl.load(q_ptr + index, mask=mask, other=0), lo, hi)
    else:
        old = tl.load(tl.load(meta + STATE).to(tl.pointer_type(tl.float32)) + index, mask=mask, other=0.0)
    old = tl.where(t > 1.0, old, 0.0)                        # fresh state is zero
    value = tl.fma(beta2t, old, (1.0 - beta2t) * new)
    tl.store(ws_ptr + tl.load(meta + TMP) + index, value, mask=mask)
    if QUANT:
        logv = tl.log2(tl.maximum(value, _TINY))
        lo, hi = _log2_range(logv, mask, 0)
        noise = tl.rand(_seed(t, tl.load(meta + _M_SALT), STREAM), index.to(tl.int32))
        tl.store(q_ptr + index, _log2_encode(logv, lo, hi, noise), mask=mask)
        tl.store(range_ptr + 2 * j, lo)
        tl.store(range_ptr + 2 * j + 1, hi)
    else:
        tl.store(tl.load(meta + STATE).to(tl.pointer_type(tl.float32)) + index, value, mask=mask)
    return value


@triton.jit
def _global_row_block(meta, b, rows, BR: tl.constexpr):
    """Index in the row statistic's range table of the block holding each local row of matrix b
    (blocks of BR rows of the whole matrix, which a shard boundary may cut)."""
    RG = tl.load(meta + _M_RG)
    return b * ((RG + BR - 1) // BR) + (tl.load(meta + _M_ROW0) + rows) // BR


@triton.jit
def _update_rows_sharded(meta, ws_ptr, row_index, row_mask, row_block, new, t, beta2t, QUANT: tl.constexpr):
    """The row statistic of a sharded tensor's local rows: the moving average into the workspace
    (and, fp32, into the state). 8-bit codes are written by the apply kernel, once the ranges of
    the row blocks this rank shares with others have been reduced across the ranks."""
    if QUANT:
        q_ptr = tl.load(meta + _M_V).to(tl.pointer_type(tl.uint8))
        range_ptr = tl.load(meta + _M_VR).to(tl.pointer_type(tl.float32))
        lo = tl.load(range_ptr + 2 * row_block, mask=row_mask, other=0.0)
        hi = tl.load(range_ptr + 2 * row_block + 1, mask=row_mask, other=0.0)
        old = _log2_decode(tl.load(q_ptr + row_index, mask=row_mask, other=0), lo, hi)
    else:
        old = tl.load(tl.load(meta + _M_V).to(tl.pointer_type(tl.float32)) + row_index, mask=row_mask, other=0.0)
    old = tl.where(t > 1.0, old, 0.0)
    value = tl.fma(beta2t, old, (1.0 - beta2t) * new)
    tl.store(ws_ptr + tl.load(meta + _M_ROWTMP) + row_index, value, mask=row_mask)
    if not QUANT:
        tl.store(tl.load(meta + _M_V).to(tl.pointer_type(tl.float32)) + row_index, value, mask=row_mask)
    return value


@triton.jit
def _factored_stats_kernel(
    items_ptr,      # int32 [n_items, 2]: (tensor index, row block across the tensor's matrices)
    meta_ptr,       # int64 [n_tensors, NMETA]: addresses and sizes
    ws_ptr,         # fp32 workspace: item partials (3 per item), tmp rows / cols, column partials
    eps1, beta2, decay_rate,
    QUANT: tl.constexpr, FIXED_BETA2: tl.constexpr, SCALE_PARAM: tl.constexpr, ALIGNED: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr,
    SHARDED: tl.constexpr = False,  # local rows of a sharded tensor: row codes wait for shared ranges
):
    k, j, meta = _work_item(items_ptr, meta_ptr)
    g_ptr, p_ptr, R, C, b, row_mask, row_index, row_start = _matrix_rows(meta, j, ALIGNED, BR)
    colpart = ws_ptr + tl.load(meta + _M_COLPART) + j.to(tl.int64) * C
    row_acc = tl.zeros([BR], dtype=tl.float32)
    p_acc = tl.zeros([BR], dtype=tl.float32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        col_mask = cols < C
        mask = row_mask[:, None] & col_mask[None, :]
        offs = row_start[:, None] + cols[None, :]
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        g2 = g * g
        row_acc += tl.sum(g2, axis=1)
        tl.store(colpart + cols, tl.sum(g2, axis=0), mask=col_mask)
        if SCALE_PARAM:
            p = tl.load(p_ptr + offs, mask=mask, other=0.0)
            p_acc += tl.sum(p * p, axis=1)

    t = tl.load(tl.load(meta + _M_STEP).to(tl.pointer_type(tl.float32))) + 1.0
    beta2t = _one_minus_beta2(t, beta2, decay_rate, FIXED_BETA2)
    new = row_acc / C.to(tl.float32) + eps1
    if SHARDED:
        r = _update_rows_sharded(meta, ws_ptr, row_index, row_mask, _global_row_block(meta, b, row_index - b * R, BR),
                                 new, t, beta2t, QUANT)
    else:
        r = _update_factor(meta, ws_ptr, row_index, row_mask, j, new, t, beta2t,
                           _M_V, _M_VR, _M_ROWTMP, _STREAM_ROW, QUANT)
    item = tl.load(meta + _M_ITEM0) + j
    tl.store(ws_ptr + 3 * item, tl.sum(p_acc, axis=0))
    tl.store(ws_ptr + 3 * item + 2, tl.sum(tl.where(row_mask, r, 0.0), axis=0))


@triton.jit
def _factored_cols_kernel(
    col_items_ptr,  # int32 [n_col_items, 2]: (tensor index, column block across the matrices)
    meta_ptr, ws_ptr,
    eps1, beta2, decay_rate,
    QUANT: tl.constexpr, FIXED_BETA2: tl.constexpr,
    BR: tl.constexpr, BCC: tl.constexpr, PR: tl.constexpr, RB: tl.constexpr,
    # 0: the whole tensor is here. Sharded tensors run twice around an all-reduce of the sums:
    # 1 writes this rank's column sums, row-statistic sum and row-block ranges to the exchange
    # slots; 2 finishes from the reduced sums.
    PHASE: tl.constexpr = 0,
):
    k, j, meta = _work_item(col_items_ptr, meta_ptr)
    R = tl.load(meta + _M_R)
    C = tl.load(meta + _M_C)
    nrb = (R + BR - 1) // BR
    ncb = (C + BCC - 1) // BCC
    b = j // ncb
    cb = j - b * ncb
    cols = cb * BCC + tl.arange(0, BCC)
    col_mask = cols < C
    if PHASE == 2:
        sums = ws_ptr + tl.load(meta + _M_SUMA)
        acc = tl.load(sums + b * C + cols, mask=col_mask, other=0.0)
    else:
        base = ws_ptr + tl.load(meta + _M_COLPART) + (b * nrb).to(tl.int64) * C
        acc = tl.zeros([BCC], dtype=tl.float32)
        for r0 in range(0, nrb, PR):
            prow = r0 + tl.arange(0, PR)
            mask = (prow < nrb)[:, None] & col_mask[None, :]
            acc += tl.sum(tl.load(base + prow.to(tl.int64)[:, None] * C + cols[None, :], mask=mask, other=0.0), axis=0)

    if PHASE == 1:
        sums = ws_ptr + tl.load(meta + _M_SUMA)
        n_sums = tl.load(meta + _M_B) * C
        tl.store(sums + b * C + cols, acc, mask=col_mask)
        if cb == 0:
            item0 = tl.load(meta + _M_ITEM0) + b * nrb
            s = tl.zeros([RB], dtype=tl.float32)
            for i0 in range(0, nrb, RB):
                i = i0 + tl.arange(0, RB)
                s += tl.load(ws_ptr + 3 * (item0 + i) + 2, mask=i < nrb, other=0.0)
            tl.store(sums + n_sums + b, tl.sum(s, axis=0))
            if QUANT:  # log2 min / max of the new row statistic over this rank's rows of each row block
                row0 = tl.load(meta + _M_ROW0)
                RG = tl.load(meta + _M_RG)
                rowtmp = ws_ptr + tl.load(meta + _M_ROWTMP) + b * R
                slots = ws_ptr + tl.load(meta + _M_MAXB) + 2 * b * ((RG + BR - 1) // BR)
                for g in range(row0 // BR, (row0 + R + BR - 1) // BR):
                    rows = g * BR + tl.arange(0, BR) - row0
                    mask = (rows >= 0) & (rows < R)
                    logv = tl.log2(tl.maximum(tl.load(rowtmp + rows, mask=mask, other=1.0), _TINY))
                    tl.store(slots + 2 * g, -tl.min(tl.where(mask, logv, float("inf")), axis=0))
                    tl.store(slots + 2 * g + 1, tl.max(tl.where(mask, logv, -float("inf")), axis=0))
    else:
        if PHASE == 2:
            rows_f = tl.load(meta + _M_RG).to(tl.float32)
        else:
            rows_f = R.to(tl.float32)
        t = tl.load(tl.load(meta + _M_STEP).to(tl.pointer_type(tl.float32))) + 1.0
        beta2t = _one_minus_beta2(t, beta2, decay_rate, FIXED_BETA2)
        new = acc / rows_f + eps1
        _update_factor(meta, ws_ptr, b * C + cols, col_mask, j, new, t, beta2t,
                       _M_COL, _M_COLR, _M_COLTMP, _STREAM_COL, QUANT)

        if cb == 0:  # one program per matrix also reduces the row statistic's mean
            if PHASE == 2:
                total = tl.load(sums + tl.load(meta + _M_B) * C + b)
            else:
                item0 = tl.load(meta + _M_ITEM0) + b * nrb
                s = tl.zeros([RB], dtype=tl.float32)
                for i0 in range(0, nrb, RB):
                    i = i0 + tl.arange(0, RB)
                    s += tl.load(ws_ptr + 3 * (item0 + i) + 2, mask=i < nrb, other=0.0)
                total = tl.sum(s, axis=0)
            tl.store(ws_ptr + tl.load(meta + _M_RMEAN) + b, total / rows_f)


@triton.jit
def _row_factors(meta, ws_ptr, b, row_index, row_mask):
    # rsqrt(r / mean(r)) for the program's rows (padding rows get 0, their g is masked anyway)
    r = tl.load(ws_ptr + tl.load(meta + _M_ROWTMP) + row_index, mask=row_mask, other=1.0)
    r_mean = tl.load(ws_ptr + tl.load(meta + _M_RMEAN) + b)
    return tl.where(row_mask, tl.rsqrt(r / r_mean), 0.0)


@triton.jit
def _factored_rms_kernel(
    items_ptr, meta_ptr, ws_ptr,
    ALIGNED: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):
    k, j, meta = _work_item(items_ptr, meta_ptr)
    g_ptr, _, R, C, b, row_mask, row_index, row_start = _matrix_rows(meta, j, ALIGNED, BR)
    rf = _row_factors(meta, ws_ptr, b, row_index, row_mask)
    coltmp = ws_ptr + tl.load(meta + _M_COLTMP) + b * C
    acc = tl.zeros([BR, BC], dtype=tl.float32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        col_mask = cols < C
        mask = row_mask[:, None] & col_mask[None, :]
        g = tl.load(g_ptr + row_start[:, None] + cols[None, :], mask=mask, other=0.0)
        cf = tl.rsqrt(tl.load(coltmp + cols, mask=col_mask, other=1.0))
        u = rf[:, None] * cf[None, :] * g
        acc += u * u
    item = tl.load(meta + _M_ITEM0) + j
    tl.store(ws_ptr + 3 * item + 1, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _factored_apply_kernel(
    items_ptr, meta_ptr, ws_ptr,
    scal_off,       # workspace offset of the per-tensor scalars (alpha, 1/clip, decay, t)
    beta1,
    QUANT: tl.constexpr, HAS_M: tl.constexpr, ALIGNED: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr,
    SHARDED: tl.constexpr = False,  # also writes the row codes (ranges reduced across the ranks)
):
    k, j, meta = _work_item(items_ptr, meta_ptr)
    g_ptr, p_ptr, R, C, b, row_mask, row_index, row_start = _matrix_rows(meta, j, ALIGNED, BR)
    rf = _row_factors(meta, ws_ptr, b, row_index, row_mask)
    coltmp = ws_ptr + tl.load(meta + _M_COLTMP) + b * C
    scal = ws_ptr + scal_off + 4 * k
    alpha = tl.load(scal)
    inv_clip = tl.load(scal + 1)
    decay = tl.load(scal + 2)
    t = tl.load(scal + 3)
    ncb = (C + BC - 1) // BC
    if SHARDED:  # rounding noise is seeded by global indices, so the codes are those of one device
        global_rows = b * tl.load(meta + _M_RG) + tl.load(meta + _M_ROW0) + (row_index - b * R)
        noise_start = global_rows.to(tl.int64) * C
        if QUANT:
            row_block = _global_row_block(meta, b, row_index - b * R, BR)
            range_ptr = tl.load(meta + _M_VR).to(tl.pointer_type(tl.float32))
            r = tl.load(ws_ptr + tl.load(meta + _M_ROWTMP) + row_index, mask=row_mask, other=1.0)
            row_noise = tl.rand(_seed(t, tl.load(meta + _M_SALT), _STREAM_ROW), global_rows.to(tl.int32))
            lo = tl.load(range_ptr + 2 * row_block, mask=row_mask, other=0.0)
            hi = tl.load(range_ptr + 2 * row_block + 1, mask=row_mask, other=0.0)
            q = _log2_encode(tl.log2(tl.maximum(r, _TINY)), lo, hi, row_noise)
            tl.store(tl.load(meta + _M_V).to(tl.pointer_type(tl.uint8)) + row_index, q, mask=row_mask)
    if HAS_M:
        if QUANT:
            mq_addr = tl.load(meta + _M_M)
            if ALIGNED:
                mq_addr = tl.multiple_of(mq_addr, 16)
            mq_ptr = mq_addr.to(tl.pointer_type(tl.uint8))
            ms_ptr = tl.load(meta + _M_MS).to(tl.pointer_type(tl.float32))
            seed = _seed(t, tl.load(meta + _M_SALT), _STREAM_M)
        else:
            m_addr = tl.load(meta + _M_M)
            if ALIGNED:
                m_addr = tl.multiple_of(m_addr, 16)
            m_ptr = m_addr.to(tl.pointer_type(tl.float32))
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        col_mask = cols < C
        mask = row_mask[:, None] & col_mask[None, :]
        offs = row_start[:, None] + cols[None, :]
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        cf = tl.rsqrt(tl.load(coltmp + cols, mask=col_mask, other=1.0))
        u = rf[:, None] * cf[None, :] * g * inv_clip
        if HAS_M:
            if QUANT:
                block = row_index.to(tl.int64) * ncb + c0 // BC      # one absmax per (row, tile)
                m = _signed_decode(tl.load(mq_ptr + offs, mask=mask, other=0),
                                   tl.load(ms_ptr + block, mask=row_mask, other=0.0)[:, None])
                m = tl.where(t > 1.0, m, 0.0)
                m = tl.fma(beta1, m, (1.0 - beta1) * u)
                absmax = tl.max(tl.where(mask, tl.abs(m), 0.0), axis=1)
                if SHARDED:
                    noise = tl.rand(seed, (noise_start[:, None] + cols[None, :]).to(tl.int32))
                else:
                    noise = tl.rand(seed, offs.to(tl.int32))
                tl.store(mq_ptr + offs, _signed_encode(m, absmax[:, None], noise), mask=mask)
                tl.store(ms_ptr + block, absmax, mask=row_mask)
            else:
                m = tl.load(m_ptr + offs, mask=mask, other=0.0)
                m = tl.fma(beta1, m, (1.0 - beta1) * u)
                tl.store(m_ptr + offs, m, mask=mask)
            u = m
        tl.store(p_ptr + offs, tl.fma(p, decay, -alpha * u), mask=mask)


# ----------------------------------------------------------------------------------------------
# Full (non-factored) tensors: 1-dim params
# ----------------------------------------------------------------------------------------------
@triton.jit
def _full_second_moment(g, meta, offs, blocks, mask, block_mask, t, eps1, beta2, decay_rate,
                        QUANT: tl.constexpr, FIXED_BETA2: tl.constexpr):
    # v' = beta2_t v + (1 - beta2_t) (g^2 + eps1): N1 and N3 run this same code
    if QUANT:
        range_ptr = tl.load(meta + _M_VR).to(tl.pointer_type(tl.float32))
        lo = tl.load(range_ptr + 2 * blocks, mask=block_mask, other=0.0)[:, None]
        hi = tl.load(range_ptr + 2 * blocks + 1, mask=block_mask, other=0.0)[:, None]
        q_ptr = tl.load(meta + _M_V).to(tl.pointer_type(tl.uint8))
        old = _log2_decode(tl.load(q_ptr + offs, mask=mask, other=0), lo, hi)
    else:
        old = tl.load(tl.load(meta + _M_V).to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
    old = tl.where(t > 1.0, old, 0.0)
    beta2t = _one_minus_beta2(t, beta2, decay_rate, FIXED_BETA2)
    return tl.fma(beta2t, old, (1.0 - beta2t) * tl.fma(g, g, eps1))


@triton.jit
def _full_rms_kernel(
    items_ptr,      # int32 [n_items, 2]: (tensor index, chunk of NB * QB elements)
    meta_ptr, ws_ptr,
    eps1, beta2, decay_rate,
    QUANT: tl.constexpr, FIXED_BETA2: tl.constexpr, SCALE_PARAM: tl.constexpr,
    NB: tl.constexpr, QB: tl.constexpr,
    SHARDED: tl.constexpr = False,  # also writes this rank's log2 range of each code block (8-bit)
):
    k, j, meta = _work_item(items_ptr, meta_ptr)
    if SHARDED:
        blocks, global_offs, offs, mask, block_mask = _flat_blocks_sharded(meta, j, NB, QB)
    else:
        N, blocks, offs, mask, block_mask = _flat_blocks(meta, j, NB, QB)
    t = tl.load(tl.load(meta + _M_STEP).to(tl.pointer_type(tl.float32))) + 1.0
    g = tl.load(tl.load(meta + _M_G).to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
    v = _full_second_moment(g, meta, offs, blocks, mask, block_mask, t, eps1, beta2, decay_rate,
                            QUANT, FIXED_BETA2)
    u = tl.where(mask, g * tl.rsqrt(v), 0.0)
    item = tl.load(meta + _M_ITEM0) + j
    tl.store(ws_ptr + 3 * item + 1, tl.sum(tl.sum(u * u, axis=1), axis=0))
    if SCALE_PARAM:
        p = tl.load(tl.load(meta + _M_P).to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
        tl.store(ws_ptr + 3 * item, tl.sum(tl.sum(p * p, axis=1), axis=0))
    else:
        tl.store(ws_ptr + 3 * item, 0.0)
    if SHARDED:
        if QUANT:
            logv = tl.log2(tl.maximum(v, _TINY))
            slots = ws_ptr + tl.load(meta + _M_MAXB) + 2 * blocks
            tl.store(slots, -tl.min(tl.where(mask, logv, float("inf")), axis=1), mask=block_mask)
            tl.store(slots + 1, tl.max(tl.where(mask, logv, -float("inf")), axis=1), mask=block_mask)


@triton.jit
def _full_apply_kernel(
    items_ptr, meta_ptr, ws_ptr,
    scal_off, eps1, beta2, decay_rate, beta1,
    QUANT: tl.constexpr, FIXED_BETA2: tl.constexpr, HAS_M: tl.constexpr,
    NB: tl.constexpr, QB: tl.constexpr,
    # v's codes from ranges reduced across the ranks; an 8-bit first moment is left (fp32) in the
    # workspace with this rank's absmax per block, for _full_m_encode_kernel after their reduction
    SHARDED: tl.constexpr = False,
):
    k, j, meta = _work_item(items_ptr, meta_ptr)
    if SHARDED:
        blocks, global_offs, offs, mask, block_mask = _flat_blocks_sharded(meta, j, NB, QB)
    else:
        N, blocks, offs, mask, block_mask = _flat_blocks(meta, j, NB, QB)
    scal = ws_ptr + scal_off + 4 * k
    alpha = tl.load(scal)
    inv_clip = tl.load(scal + 1)
    decay = tl.load(scal + 2)
    t = tl.load(scal + 3)
    salt = tl.load(meta + _M_SALT)
    g_ptr = tl.load(meta + _M_G).to(tl.pointer_type(tl.float32))
    p_ptr = tl.load(meta + _M_P).to(tl.pointer_type(tl.float32))
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    v = _full_second_moment(g, meta, offs, blocks, mask, block_mask, t, eps1, beta2, decay_rate,
                            QUANT, FIXED_BETA2)
    u = g * tl.rsqrt(v) * inv_clip
    if QUANT:
        logv = tl.log2(tl.maximum(v, _TINY))
        if SHARDED:
            slots = ws_ptr + tl.load(meta + _M_MAXB) + 2 * blocks
            hi = tl.load(slots + 1, mask=block_mask, other=0.0)
            lo = tl.maximum(-tl.load(slots, mask=block_mask, other=0.0), hi - LOG2_SPAN)
            noise = tl.rand(_seed(t, salt, _STREAM_V), global_offs.to(tl.int32))
        else:
            lo, hi = _log2_range(logv, mask, 1)
            noise = tl.rand(_seed(t, salt, _STREAM_V), offs.to(tl.int32))
        q_ptr = tl.load(meta + _M_V).to(tl.pointer_type(tl.uint8))
        tl.store(q_ptr + offs, _log2_encode(logv, lo[:, None], hi[:, None], noise), mask=mask)
        range_ptr = tl.load(meta + _M_VR).to(tl.pointer_type(tl.float32))
        tl.store(range_ptr + 2 * blocks, lo, mask=block_mask)
        tl.store(range_ptr + 2 * blocks + 1, hi, mask=block_mask)
    else:
        tl.store(tl.load(meta + _M_V).to(tl.pointer_type(tl.float32)) + offs, v, mask=mask)
    if HAS_M:
        if QUANT:
            mq_ptr = tl.load(meta + _M_M).to(tl.pointer_type(tl.uint8))
            ms_ptr = tl.load(meta + _M_MS).to(tl.pointer_type(tl.float32))
            m = _signed_decode(tl.load(mq_ptr + offs, mask=mask, other=0),
                               tl.load(ms_ptr + blocks, mask=block_mask, other=0.0)[:, None])
            m = tl.where(t > 1.0, m, 0.0)
            m = tl.fma(beta1, m, (1.0 - beta1) * u)
            absmax = tl.max(tl.where(mask, tl.abs(m), 0.0), axis=1)
            if SHARDED:
                tl.store(ws_ptr + tl.load(meta + _M_MTMP) + offs, m, mask=mask)
                tl.store(ws_ptr + tl.load(meta + _M_MAXC) + blocks, absmax, mask=block_mask)
            else:
                noise = tl.rand(_seed(t, salt, _STREAM_M), offs.to(tl.int32))
                tl.store(mq_ptr + offs, _signed_encode(m, absmax[:, None], noise), mask=mask)
                tl.store(ms_ptr + blocks, absmax, mask=block_mask)
        else:
            m_ptr = tl.load(meta + _M_M).to(tl.pointer_type(tl.float32))
            m = tl.fma(beta1, tl.load(m_ptr + offs, mask=mask, other=0.0), (1.0 - beta1) * u)
            tl.store(m_ptr + offs, m, mask=mask)
        u = m
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    tl.store(p_ptr + offs, tl.fma(p, decay, -alpha * u), mask=mask)


@triton.jit
def _full_m_encode_kernel(
    items_ptr, meta_ptr, ws_ptr, scal_off,
    NB: tl.constexpr, QB: tl.constexpr,
):
    """Sharded full tensors with an 8-bit first moment: its codes, from the new values the apply
    kernel left in the workspace and each block's absmax reduced across the ranks."""
    k, j, meta = _work_item(items_ptr, meta_ptr)
    blocks, global_offs, offs, mask, block_mask = _flat_blocks_sharded(meta, j, NB, QB)
    t = tl.load(ws_ptr + scal_off + 4 * k + 3)
    m = tl.load(ws_ptr + tl.load(meta + _M_MTMP) + offs, mask=mask, other=0.0)
    absmax = tl.load(ws_ptr + tl.load(meta + _M_MAXC) + blocks, mask=block_mask, other=0.0)
    noise = tl.rand(_seed(t, tl.load(meta + _M_SALT), _STREAM_M), global_offs.to(tl.int32))
    tl.store(tl.load(meta + _M_M).to(tl.pointer_type(tl.uint8)) + offs, _signed_encode(m, absmax[:, None], noise),
             mask=mask)
    tl.store(tl.load(meta + _M_MS).to(tl.pointer_type(tl.float32)) + blocks, absmax, mask=block_mask)


# ----------------------------------------------------------------------------------------------
# Per-tensor scalars
# ----------------------------------------------------------------------------------------------
@triton.jit
def _finish_kernel(
    meta_ptr, ws_ptr, scal_off,
    lr, eps2, clip_threshold, weight_decay,
    RELATIVE_STEP: tl.constexpr, SCALE_PARAM: tl.constexpr, RB: tl.constexpr,
    # 0: the whole tensor is here. Sharded plans run twice around an all-reduce: 1 writes this
    # rank's sums of p^2 and u^2 to the exchange slots; 2 finishes from the reduced sums and also
    # writes the row ranges of 8-bit factored tensors (reduced across the ranks).
    PHASE: tl.constexpr = 0,
):
    """Per tensor: reduce the item partials of p^2 and u^2, derive alpha, 1/clip and the decay
    factor for the apply kernels, and advance the step counter (after every kernel that reads it)."""
    k = tl.program_id(0)
    meta = meta_ptr + k * NMETA
    if PHASE == 2:
        sums = ws_ptr + tl.load(meta + _M_SUMB)
        numel = (tl.load(meta + _M_RG) * tl.load(meta + _M_C) * tl.load(meta + _M_B)).to(tl.float32)
        p2_total = tl.load(sums)
        u2_total = tl.load(sums + 1)
        n_range = tl.load(meta + _M_NRANGE)
        slots = ws_ptr + tl.load(meta + _M_MAXB)
        range_ptr = tl.load(meta + _M_VR).to(tl.pointer_type(tl.float32))
        for i0 in range(0, n_range, RB):
            i = i0 + tl.arange(0, RB)
            hi = tl.load(slots + 2 * i + 1, mask=i < n_range, other=0.0)
            lo = tl.maximum(-tl.load(slots + 2 * i, mask=i < n_range, other=0.0), hi - LOG2_SPAN)
            tl.store(range_ptr + 2 * i, lo, mask=i < n_range)
            tl.store(range_ptr + 2 * i + 1, hi, mask=i < n_range)
    else:
        item0 = tl.load(meta + _M_ITEM0)
        n_items = tl.load(meta + _M_NITEMS)
        numel = (tl.load(meta + _M_R) * tl.load(meta + _M_C) * tl.load(meta + _M_B)).to(tl.float32)
        p2 = tl.zeros([RB], dtype=tl.float32)
        u2 = tl.zeros([RB], dtype=tl.float32)
        for i0 in range(0, n_items, RB):
            i = i0 + tl.arange(0, RB)
            p2 += tl.load(ws_ptr + 3 * (item0 + i), mask=i < n_items, other=0.0)
            u2 += tl.load(ws_ptr + 3 * (item0 + i) + 1, mask=i < n_items, other=0.0)
        p2_total = tl.sum(p2, axis=0)
        u2_total = tl.sum(u2, axis=0)
    if PHASE == 1:
        sums = ws_ptr + tl.load(meta + _M_SUMB)
        tl.store(sums, p2_total)
        tl.store(sums + 1, u2_total)
    else:
        step_ptr = tl.load(meta + _M_STEP).to(tl.pointer_type(tl.float32))
        t = tl.load(step_ptr) + 1.0
        if RELATIVE_STEP:
            rho = tl.minimum(lr, tl.rsqrt(t))
        else:
            rho = lr + 0.0 * t
        if SCALE_PARAM:
            alpha = rho * tl.maximum(eps2, tl.sqrt(p2_total / numel))
        else:
            alpha = rho
        rms_u = tl.sqrt(u2_total / numel)
        scal = ws_ptr + scal_off + 4 * k
        tl.store(scal, alpha)
        tl.store(scal + 1, 1.0 / tl.maximum(1.0, rms_u / clip_threshold))
        tl.store(scal + 2, 1.0 - rho * weight_decay)
        tl.store(scal + 3, t)
        tl.store(step_ptr, t)


