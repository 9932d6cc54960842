"""Cross-entropy's Triton kernels. Host code and launch configuration: ``host.py``.

Math, for a row x of V logits with target t (in fp32 whatever the logits' dtype; fp64 for fp64):

    lse   = log(sum_j exp(x_j))                  (running max and sum of exp, chunk by chunk)
    loss  = lse - x_t                            (0 for a row whose target is ignore_index)
    dx_j  = (exp(x_j - lse) - [j == t]) * g      (0 for an ignored row)

g, the row's upstream gradient: grad_output[row] for reduction "none", grad_output for "sum",
grad_output / n_valid for "mean", where n_valid (the rows not ignored) is counted on the device by
the forward, so neither direction waits for the host.

- ``_xent_fwd_kernel``: one row per program, read once in chunks of ``BLOCK_V``; a running max
  and sum of exp per group of ``GROUP`` adjacent logits, combined once at the end; the target's
  logit is loaded directly. Writes the row's loss and lse (saved for the backward). Ignored rows read
  nothing.
- ``_xent_reduce_kernel`` ("mean" / "sum"): one program sums the row losses and counts the valid
  targets in a fixed order, so the loss is the same bit for bit on every run.
- ``_xent_bwd_kernel``: one row per program, reads the row once and writes dx in the logits'
  dtype; ignored rows only write zeros.

Bytes: the forward reads M * V logits, the backward reads and writes M * V, besides per-row terms.
Targets outside [0, V) other than ignore_index are not checked on the host (that would be a
device-to-host sync): their row's loss is NaN and their gradient lacks the one-hot term.
"""

from __future__ import annotations

from .._triton_support import tl, triton


@triton.jit
def _xent_fwd_kernel(
    x_ptr, x_stride,  # logits (M, V), unit column stride
    t_ptr,  # targets (M,) int64
    loss_ptr,  # (M,) row losses, ACC
    lse_ptr,  # (M,) logsumexp of each row, ACC (0 for ignored rows)
    V, ignore_index,
    BLOCK_V: tl.constexpr,
    GROUP: tl.constexpr,  # adjacent logits that share a running max (divides BLOCK_V)
    STAGES: tl.constexpr,  # chunks in flight through shared memory (1: loads straight to registers)
    ACC: tl.constexpr,  # fp32; fp64 for fp64 logits
):
    row = tl.program_id(0)
    target = tl.load(t_ptr + row)
    if target != ignore_index:
        x_row = x_ptr + row.to(tl.int64) * x_stride
        # The target's logit first: its load's latency hides under the row's.
        in_range = (target >= 0) & (target < V)
        x_t = tl.load(x_row + target, mask=in_range, other=float("nan")).to(ACC)
        # A chunk as (BLOCK_V / GROUP) groups of GROUP adjacent logits, each group with its own
        # running max and sum of exp: a group's max is a reduction within a thread or two lanes,
        # so no chunk waits on a reduction across the program's warps; one per row at the end.
        cols = tl.arange(0, BLOCK_V // GROUP)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        m = tl.full([BLOCK_V // GROUP], float("-inf"), ACC)
        s = tl.zeros([BLOCK_V // GROUP], ACC)
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(ACC)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            # A group of -inf only (so far) keeps m = -inf: shift by 0 there, not by -inf (NaN).
            shift = tl.where(m_new == float("-inf"), 0.0, m_new).to(ACC)
            s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
            m = m_new
        m_row = tl.max(m, axis=0)
        shift_row = tl.where(m_row == float("-inf"), 0.0, m_row).to(ACC)
        lse = shift_row + tl.log(tl.sum(s * tl.exp(m - shift_row), axis=0))
        tl.store(loss_ptr + row, lse - x_t)
        tl.store(lse_ptr + row, lse)
    else:
        tl.store(loss_ptr + row, tl.zeros([], ACC))
        tl.store(lse_ptr + row, tl.zeros([], ACC))  # never read: written so the op's outputs are defined


@triton.jit
def _xent_reduce_kernel(
    loss_rows_ptr,  # (M,) row losses, ACC
    t_ptr,  # targets (M,) int64
    out_ptr,  # () the reduced loss, ACC
    n_valid_ptr,  # () rows whose target is not ignore_index, ACC
    M, ignore_index,
    MEAN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ACC: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_M)
    total = tl.zeros([BLOCK_M], ACC)
    count = tl.zeros([BLOCK_M], tl.int32)
    for start in range(0, M, BLOCK_M):
        rows = start + offs
        mask = rows < M
        total += tl.load(loss_rows_ptr + rows, mask=mask, other=0.0)
        t = tl.load(t_ptr + rows, mask=mask, other=0)
        count += ((t != ignore_index) & mask).to(tl.int32)
    n_valid = tl.sum(count, axis=0).to(ACC)
    loss = tl.sum(total, axis=0)
    if MEAN:
        loss = loss / n_valid  # 0 / 0 = NaN when every row is ignored, as torch
    tl.store(out_ptr, loss)
    tl.store(n_valid_ptr, n_valid)


@triton.jit
def _xent_bwd_kernel(
    g_ptr, g_stride,  # upstream gradient: (M,) for "none", a scalar (stride 0) otherwise
    x_ptr, x_stride,  # logits (M, V)
    t_ptr,  # targets (M,) int64
    lse_ptr,  # (M,) from the forward, ACC
    n_valid_ptr,  # () from the forward (MEAN)
    dx_ptr, dx_stride,  # (M, V) in the logits' dtype
    V, ignore_index,
    MEAN: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,
    ACC: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    target = tl.load(t_ptr + row)
    cols = tl.arange(0, BLOCK_V)
    dx_row = dx_ptr + row64 * dx_stride
    if target != ignore_index:
        g = tl.load(g_ptr + row64 * g_stride).to(ACC)
        if MEAN:
            g = g / tl.load(n_valid_ptr)
        lse = tl.load(lse_ptr + row)
        x_row = x_ptr + row64 * x_stride
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            mask = offs < V
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(ACC)
            p = tl.exp(x - lse)
            dx = tl.where(offs == target, p - 1.0, p) * g
            tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        zeros = tl.zeros([BLOCK_V], dx_ptr.dtype.element_ty)
        for start in range(0, V, BLOCK_V):
            offs = start + cols
            tl.store(dx_row + offs, zeros, mask=offs < V)
