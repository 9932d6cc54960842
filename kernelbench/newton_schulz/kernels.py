"""Newton-Schulz's Triton kernels: one quintic iteration as three GEMMs with fused epilogues, on
pointer loads (any CUDA GPU Triton supports, and the interpreter) or, for Hopper (sm_90), on TMA
descriptors with persistent scheduling. Host code, tile configurations and the iteration: ``host.py``.

One iteration on X (m x n, m <= n), with (a, b, c) = (3.4445, -4.7750, 2.0315):

    A     = X X^T                 (m x m, symmetric)       -> _sym_gram_kernel, FUSE_POLY=False
    B     = b A + c A A           (m x m, symmetric)       -> _sym_gram_kernel, FUSE_POLY=True
    X_new = a X + B X             (m x n)                  -> _update_kernel

Symmetry: A and A A = A A^T are symmetric, so the two Gram kernels compute only tiles on or
above the diagonal and write each tile twice, as itself and as its transpose. Row block i
(rows [i*BM, (i+1)*BM)) owns the columns from i*BM to m in BN-wide tiles; a tile mirrors only its
columns at or beyond (i+1)*BM, so every output element is written exactly once (the lower half
of a diagonal block is stored directly, from the same tile). That skips ~half of the tiles of
two of the three GEMMs: about 1/3 of an iteration's FLOP.

Fusion: B needs A's own tile, so the A A kernel loads it in its epilogue (alpha*A + beta*A A);
the B X kernel loads X's tile in its epilogue (coef*X + B X). No pass over memory is added.

All accumulation is fp32; operands and outputs are bf16 (the update's output may be fp32 and
strided: the last iteration writes the caller's dtype and orientation directly).
Under TRITON_INTERPRET=1 (UPCAST=True) operands are converted to fp32 before tl.dot, because the
interpreter's bf16 dot is wrong; values are still rounded to bf16 between GEMMs, as on the GPU.

The Hopper kernels (``_hopper_*``) keep the math, the tile scheme and the epilogues:
- operands come through host-built 3-D (batch, rows, cols) TMA descriptors, so the hardware
  zero-fills and clips at each matrix's own edge: a tile never touches the next matrix of a batch;
- the grid is one program per SM, each walking tiles ``pid, pid + NUM_SMS, ...`` in
  ``tl.range(..., flatten=True)``, so the pipeliner issues the next tile's loads during the
  current tile's epilogue;
- ``WARP_SPECIALIZE`` stays off on sm_90 (Triton offers it for Blackwell only); a Triton that
  supports it on Hopper can switch it on in one place;
- the Gram kernels store the direct tile by TMA; the mirrored tile is a masked pointer store,
  since TMA stores cannot mask the diagonal block.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _sym_gram_kernel(
    x_ptr,  # (batch, M, K) operand; the product is X X^T (M x M)
    out_ptr,  # (batch, M, M) output, written in full (upper tiles and their mirror)
    tiles_ptr,  # int32 (num_tiles, 2): element offsets (row, col) of the upper tiles, in L2 order
    M, K,
    stride_xb, stride_xm, stride_xk,
    stride_ob, stride_om, stride_on,
    alpha, beta,  # FUSE_POLY: out = alpha * X + beta * X X^T (X is square then)
    FUSE_POLY: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: the K loop runs without masks
    UPCAST: tl.constexpr,  # interpreter: tl.dot in fp32 (bf16 dot is wrong there)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    off_m = tl.load(tiles_ptr + 2 * pid)
    off_n = tl.load(tiles_ptr + 2 * pid + 1)
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_base = x_ptr + batch * stride_xb
    # Rows past M wrap around instead of being masked: their results are never stored, and the
    # loads stay unmasked (as in Triton's matmul tutorial).
    a_ptrs = x_base + (rows % M)[:, None] * stride_xm + ks[None, :] * stride_xk
    b_ptrs = x_base + (cols % M)[:, None] * stride_xm + ks[None, :] * stride_xk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = ks[None, :] < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok, other=0.0)
            b = tl.load(b_ptrs, mask=k_ok, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_xk

    in_range = (rows[:, None] < M) & (cols[None, :] < M)
    if FUSE_POLY:
        own = tl.load(x_base + rows[:, None] * stride_xm + cols[None, :] * stride_xk, mask=in_range, other=0.0)
        acc = alpha * own.to(tl.float32) + beta * acc
    out = acc.to(out_ptr.dtype.element_ty)
    o_base = out_ptr + batch * stride_ob
    tl.store(o_base + rows[:, None] * stride_om + cols[None, :] * stride_on, out, mask=in_range)
    # The transpose goes below the diagonal, except for the tile's own diagonal block.
    mirror = in_range & (cols[None, :] >= off_m + BLOCK_M)
    tl.store(o_base + cols[None, :] * stride_om + rows[:, None] * stride_on, out, mask=mirror)


@triton.jit
def _update_kernel(
    b_ptr,  # (batch, M, M) B = b A + c A A
    x_ptr,  # (batch, M, N) X, read as the right operand and again in the epilogue
    out_ptr,  # (batch, M, N) X_new = coef * X + B X, any float dtype and strides
    M, N,
    stride_bb, stride_bm, stride_bk,
    stride_xb, stride_xm, stride_xn,
    stride_ob, stride_om, stride_on,
    coef,
    EVEN_K: tl.constexpr,  # M % BLOCK_K == 0 (K is M here)
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    # Grouped order: GROUP_M rows of tiles advance column by column, so a wave of programs
    # shares few B row blocks and X column blocks and they stay in L2.
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    b_base = b_ptr + batch * stride_bb
    x_base = x_ptr + batch * stride_xb
    b_ptrs = b_base + (rows % M)[:, None] * stride_bm + ks[None, :] * stride_bk
    x_ptrs = x_base + ks[:, None] * stride_xm + (cols % N)[None, :] * stride_xn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(M, BLOCK_K)):
        if EVEN_K:
            bm = tl.load(b_ptrs)
            xk = tl.load(x_ptrs)
        else:
            k_left = M - k * BLOCK_K
            bm = tl.load(b_ptrs, mask=ks[None, :] < k_left, other=0.0)
            xk = tl.load(x_ptrs, mask=ks[:, None] < k_left, other=0.0)
        if UPCAST:
            bm = bm.to(tl.float32)
            xk = xk.to(tl.float32)
        acc = tl.dot(bm, xk, acc)
        b_ptrs += BLOCK_K * stride_bk
        x_ptrs += BLOCK_K * stride_xm

    in_range = (rows[:, None] < M) & (cols[None, :] < N)
    own = tl.load(x_base + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=in_range, other=0.0)
    acc += coef * own.to(tl.float32)
    o_ptrs = out_ptr + batch * stride_ob + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_range)


@triton.jit
def _normalize_kernel(
    g_ptr,  # (batch, M, N) G as the iteration sees it (a transposed view when rows > cols)
    norm_ptr,  # (batch,) fp32 Frobenius norms of G
    x_ptr,  # (batch, M, N) contiguous bf16 output X = G / (||G|| + eps)
    M, N,
    stride_gb, stride_gm, stride_gn,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_range = (rows[:, None] < M) & (cols[None, :] < N)
    g = tl.load(g_ptr + batch * stride_gb + rows[:, None] * stride_gm + cols[None, :] * stride_gn, mask=in_range)
    scale = 1.0 / (tl.load(norm_ptr + batch) + eps)
    x = (g.to(tl.float32) * scale).to(x_ptr.dtype.element_ty)
    tl.store(x_ptr + batch * M * N + rows[:, None] * N + cols[None, :], x, mask=in_range)


@triton.jit
def _hopper_sym_gram_kernel(
    x_rows_desc,  # TMA over X (batch, M, K), block (1, BLOCK_M, BLOCK_K): the left operand
    x_cols_desc,  # TMA over X (batch, M, K), block (1, BLOCK_N, BLOCK_K): the right operand X^T
    x_ptr,  # X again, for the epilogue's pointer load of its own tile (FUSE_POLY; X is square)
    out_desc,  # TMA over out (batch, M, M), block (1, BLOCK_M, BLOCK_N): the direct tile store
    out_ptr,  # out again, for the masked pointer store of the mirrored tile
    tiles_ptr,  # int32 (num_tiles, 2): element offsets (row, col) of the upper tiles, in L2 order
    num_tiles, batch, M, K,
    stride_xb, stride_xm,  # X and out are contiguous: their column stride is 1
    stride_ob, stride_om,
    alpha, beta,  # FUSE_POLY: out = alpha * X + beta * X X^T
    FUSE_POLY: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: tl.dot in fp32 (bf16 dot is wrong there)
    WARP_SPECIALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    k_tiles = tl.cdiv(K, BLOCK_K)
    for work in tl.range(tl.program_id(0), num_tiles * batch, NUM_SMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        b = work // num_tiles
        tile = work - b * num_tiles
        off_m = tl.load(tiles_ptr + 2 * tile)
        off_n = tl.load(tiles_ptr + 2 * tile + 1)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = x_rows_desc.load([b, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
            c = x_cols_desc.load([b, off_n, off_k]).reshape(BLOCK_N, BLOCK_K)
            if UPCAST:
                a = a.to(tl.float32)
                c = c.to(tl.float32)
            acc = tl.dot(a, c.T, acc)
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        in_range = (rows[:, None] < M) & (cols[None, :] < M)
        if FUSE_POLY:
            # A pointer load, not TMA: a TMA buffer for this tile would add 64 KiB of shared
            # memory to the pipeline's 144 KiB and the store's 64 KiB, past Hopper's 227 KiB.
            own_ptrs = x_ptr + b.to(tl.int64) * stride_xb + rows[:, None] * stride_xm + cols[None, :]
            own = tl.load(own_ptrs, mask=in_range, other=0.0)
            acc = alpha * own.to(tl.float32) + beta * acc
        out = acc.to(out_ptr.dtype.element_ty)
        out_desc.store([b, off_m, off_n], out.reshape(1, BLOCK_M, BLOCK_N))
        mirror = in_range & (cols[None, :] >= off_m + BLOCK_M)
        o_base = out_ptr + b.to(tl.int64) * stride_ob
        tl.store(o_base + cols[None, :] * stride_om + rows[:, None], out, mask=mirror)


@triton.jit
def _hopper_update_kernel(
    b_desc,  # TMA over B (batch, M, M), block (1, BLOCK_M, BLOCK_K)
    x_desc,  # TMA over X (batch, M, N), block (1, BLOCK_K, BLOCK_N): the right operand
    x_ptr,  # X again, for the epilogue's pointer load of its own tile (saves a TMA buffer)
    out_ptr,  # (batch, M, N) X_new = coef * X + B X, any float dtype and strides (pointer store)
    batch, M, N,
    stride_xb, stride_xm,  # X is contiguous: its column stride is 1
    stride_ob, stride_om, stride_on,
    coef,
    UPCAST: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # rows of tiles walked together (L2 reuse of B rows and X columns)
    NUM_SMS: tl.constexpr,
):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_m * tiles_n
    per_group = GROUP_M * tiles_n
    k_tiles = tl.cdiv(M, BLOCK_K)
    for work in tl.range(tl.program_id(0), num_tiles * batch, NUM_SMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        b = work // num_tiles
        tile = work - b * num_tiles
        first_m = (tile // per_group) * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_rows) * BLOCK_M
        off_n = ((tile % per_group) // group_rows) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            bm = b_desc.load([b, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
            xk = x_desc.load([b, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
            if UPCAST:
                bm = bm.to(tl.float32)
                xk = xk.to(tl.float32)
            acc = tl.dot(bm, xk, acc)
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        in_range = (rows[:, None] < M) & (cols[None, :] < N)
        own = tl.load(x_ptr + b.to(tl.int64) * stride_xb + rows[:, None] * stride_xm + cols[None, :],
                      mask=in_range, other=0.0)
        acc += coef * own.to(tl.float32)
        o_ptrs = out_ptr + b.to(tl.int64) * stride_ob + rows[:, None] * stride_om + cols[None, :] * stride_on
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_range)
