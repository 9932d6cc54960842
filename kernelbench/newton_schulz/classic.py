"""Newton-Schulz GEMMs with pointer loads (any CUDA GPU Triton supports, and the interpreter).

One quintic iteration on X (m x n, m <= n), with (a, b, c) = (3.4445, -4.7750, 2.0315):

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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and pipeline depth of one GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    group_m: int = 8  # rows of tiles walked together so their operands stay in L2


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


def upper_tiles(m: int, block_m: int, block_n: int, group: int) -> list[tuple[int, int]]:
    """(row, col) element offsets of the tiles covering the upper triangle of an m x m matrix.

    Row block i starts at the diagonal (col i*block_m) and steps block_n to m. The order walks
    `group` row blocks together, column by column, so concurrent programs share operands in L2.
    """
    row_blocks = triton.cdiv(m, block_m)
    tiles = []
    for first in range(0, row_blocks, group):
        band = []
        for i in range(first, min(first + group, row_blocks)):
            band += [(i * block_m, col) for col in range(i * block_m, m, block_n)]
        tiles += sorted(band, key=lambda t: (t[1], t[0]))
    return tiles


@functools.lru_cache(maxsize=64)
def _tile_table(m: int, block_m: int, block_n: int, group: int, device: torch.device) -> torch.Tensor:
    # Built once per shape and config; the copy to the device is the only transfer.
    table = torch.tensor(upper_tiles(m, block_m, block_n, group), dtype=torch.int32)
    return table.to(device)


# (kernel, key) -> the stages that fit, for launches whose first try ran out of shared memory.
_FITTED_STAGES: dict[tuple, int] = {}


def launch(kernel, grid: tuple[int, ...], stages: int, key: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, num_stages=stages, **kwargs)``; when Triton reports that the
    compiled kernel needs more shared memory than the GPU has (OutOfResources, raised before
    anything runs), retry with one stage fewer, and remember what fit under ``key`` (which must
    name everything that changes the compiled kernel: config, dtypes, fused epilogues, device)."""
    stages = _FITTED_STAGES.get((kernel, key, stages), stages)
    first = stages
    while True:
        try:
            kernel[grid](*args, num_stages=stages, **kwargs)
            break
        except OutOfResources:
            if stages == 1:
                raise
            stages -= 1
    if stages != first:
        _FITTED_STAGES[(kernel, key, first)] = stages


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def sym_gram(x: torch.Tensor, out: torch.Tensor, cfg: GemmConfig, alpha: float = 0.0, beta: float = 1.0,
             fuse_poly: bool = False) -> torch.Tensor:
    """out = X X^T, or alpha * X + beta * X X^T with fuse_poly (X square). x: (batch, M, K)."""
    batch, m, k = x.shape
    tiles = _tile_table(m, cfg.block_m, cfg.block_n, cfg.group_m, x.device)
    launch(
        _sym_gram_kernel, (tiles.shape[0], batch), cfg.num_stages, (cfg, fuse_poly, x.dtype, out.dtype, x.device),
        x, out, tiles, m, k,
        x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        alpha, beta,
        FUSE_POLY=fuse_poly, EVEN_K=k % cfg.block_k == 0, UPCAST=interpreting(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
    )
    return out


def update(b: torch.Tensor, x: torch.Tensor, out: torch.Tensor, coef: float, cfg: GemmConfig) -> torch.Tensor:
    """out = coef * X + B X. b: (batch, M, M), x and out: (batch, M, N)."""
    batch, m, n = x.shape
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), batch)
    launch(
        _update_kernel, grid, cfg.num_stages, (cfg, x.dtype, out.dtype, out.stride(-1) == 1, x.device),
        b, x, out, m, n,
        b.stride(0), b.stride(1), b.stride(2),
        x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        coef,
        EVEN_K=m % cfg.block_k == 0, UPCAST=interpreting(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
    )
    return out


def normalize(g: torch.Tensor, norm: torch.Tensor, out: torch.Tensor, eps: float) -> torch.Tensor:
    """out (contiguous bf16) = g / (norm + eps), per batch entry; g may be any strided view."""
    batch, m, n = g.shape
    # 64 x 64 tiles: each side of a transposed read still touches 128-byte lines in full.
    block = 64
    grid = (triton.cdiv(m, block), triton.cdiv(n, block), batch)
    _normalize_kernel[grid](
        g, norm, out, m, n, g.stride(0), g.stride(1), g.stride(2), eps,
        BLOCK_M=block, BLOCK_N=block, num_warps=4,
    )
    return out
