"""Newton-Schulz GEMMs for Hopper (sm_90): TMA tensor descriptors and persistent scheduling.

Same math, same symmetric tile scheme and same fused epilogues as ``classic.py`` (read its
docstring first); what changes is how operands reach shared memory and how tiles are scheduled:

- Operands are loaded through host-built TMA descriptors
  (``triton.tools.tensor_descriptor.TensorDescriptor``, triton >= 3.4; this code is written for
  the 3.6.0 on the GPU machine and runs in 3.9.0's interpreter). Descriptors are 3-D
  (batch, rows, cols) so the hardware zero-fills and clips at each matrix's own edge: a tile
  never reads or writes the neighbouring matrix of a batch.
- Persistent: the grid is one program per SM; each walks tiles ``pid, pid + NUM_SMS, ...`` in
  ``tl.range(..., flatten=True)``, which lets the software pipeliner issue the next tile's TMA
  loads while the current tile's epilogue runs.
- Warp specialisation: Triton 3.6 offers ``tl.range(..., warp_specialize=True)`` for
  Blackwell only (its persistent-matmul tutorial gates it on capability >= 10), so on sm_90 it
  is off. The WARP_SPECIALIZE constexpr stays so that a Triton supporting it on Hopper can
  switch it on in one place.
- The Gram kernels store the direct tile by TMA; the mirrored (transposed) tile is a masked
  pointer store, since TMA stores cannot mask the diagonal block.
- Shared memory: a persistent kernel keeps the next tile's operand buffers live during the
  epilogue, so the epilogue's own buffers add to the pipeline's instead of reusing it.
  smem_bytes models the total and each launch runs the most stages (up to the config's) that
  fit the device; classic.launch retries with fewer stages if Triton still reports
  OutOfResources (the model is an estimate of Triton's allocation, not its output).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._device import sm_count
from .classic import GemmConfig, _tile_table, interpreting, launch

# Shared memory one block may use on sm_90 (227 KiB, H100 and H200 alike); read from the device
# where there is one. The interpreter uses this value so the stage arithmetic runs on a CPU too.
SM90_SMEM_LIMIT = 232448
# Left free for what the model does not count (mbarriers: 24 bytes in the measured kernel).
SMEM_RESERVE = 1024


def descriptor_class():
    """Triton's host-side TMA descriptor, or None when this Triton has none (< 3.4)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def unavailable_reason(device: torch.device, *shapes: tuple[int, ...]) -> str | None:
    """Why the Hopper path cannot run on ``device`` for matrices of ``shapes``, or None."""
    if descriptor_class() is None:
        return f"triton {triton.__version__} has no tensor descriptors (needs >= 3.4)"
    for shape in shapes:
        if shape[-1] % 8:
            return f"TMA needs rows of a multiple of 16 bytes (8 bf16 values); got {shape[-1]} columns"
    if device.type != "cuda":
        return None if interpreting() else "the Hopper path needs a CUDA tensor (or TRITON_INTERPRET=1)"
    cap = torch.cuda.get_device_capability(device)
    if cap[0] != 9:
        return f"the Hopper path needs sm_90 (TMA + wgmma), this GPU is sm_{cap[0]}{cap[1]}"
    return None


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


def smem_bytes(kind: str, cfg: GemmConfig, stages: int, out_itemsize: int = 2) -> int:
    """Shared memory a Hopper kernel of ``kind`` ("gram", "gram-poly", "update") needs.

    - every kind: ``stages`` bf16 operand buffers of (block_m + block_n) x block_k;
    - "gram", "gram-poly": the bf16 TMA store buffer of the output tile;
    - "gram-poly": the epilogue's loaded A tile, converted to the accumulator's layout through
      shared memory (another bf16 tile);
    - "update": the output tile converted for the pointer store, at the output's element size
      (the last iteration writes fp32 when the caller's input is fp32).

    Checked against the H200 (triton 3.6.0): the fp32 update at 128x256x64 with 3 stages asked
    for 278552 B (this model: 278528, plus 24 B of barriers), the bf16 one ran; the fused Gram
    at 128x256x64 runs with 2 stages and not 3 (229376 / 278528 here)."""
    tile = cfg.block_m * cfg.block_n
    pipeline = stages * (cfg.block_m + cfg.block_n) * cfg.block_k * 2
    if kind == "gram":
        return pipeline + 2 * tile
    if kind == "gram-poly":
        return pipeline + 2 * 2 * tile
    if kind == "update":
        return pipeline + max(out_itemsize, 2) * tile
    raise ValueError(f"unknown kernel kind {kind!r}; accepted: gram, gram-poly, update")


def stages_that_fit(kind: str, cfg: GemmConfig, out_itemsize: int = 2, limit: int = SM90_SMEM_LIMIT) -> int:
    """The most pipeline stages, up to cfg.num_stages, whose smem_bytes fit ``limit`` (at least 1)."""
    stages = cfg.num_stages
    while stages > 1 and smem_bytes(kind, cfg, stages, out_itemsize) > limit - SMEM_RESERVE:
        stages -= 1
    return stages


@functools.lru_cache(maxsize=8)
def smem_limit(device: torch.device) -> int:
    """Shared memory one block may opt into on ``device`` (SM90_SMEM_LIMIT off CUDA)."""
    if device.type != "cuda":
        return SM90_SMEM_LIMIT
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", SM90_SMEM_LIMIT)


def _desc(t: torch.Tensor, rows: int, cols: int):
    return descriptor_class().from_tensor(t, [1, rows, cols])


def _grid(work: int, device: torch.device) -> tuple[int, int]:
    sms = sm_count(device)
    return sms, min(sms, work)


def sym_gram(x: torch.Tensor, out: torch.Tensor, cfg: GemmConfig, alpha: float = 0.0, beta: float = 1.0,
             fuse_poly: bool = False, warp_specialize: bool = False) -> torch.Tensor:
    """out = X X^T, or alpha * X + beta * X X^T with fuse_poly. x: (batch, M, K) contiguous."""
    batch, m, k = x.shape
    tiles = _tile_table(m, cfg.block_m, cfg.block_n, cfg.group_m, x.device)
    num_tiles = tiles.shape[0]
    sms, programs = _grid(num_tiles * batch, x.device)
    kind = "gram-poly" if fuse_poly else "gram"
    stages = stages_that_fit(kind, cfg, out.element_size(), smem_limit(x.device))
    launch(
        _hopper_sym_gram_kernel, (programs,), stages, (kind, cfg, x.dtype, out.dtype, x.device),
        _desc(x, cfg.block_m, cfg.block_k), _desc(x, cfg.block_n, cfg.block_k), x,
        _desc(out, cfg.block_m, cfg.block_n), out, tiles,
        num_tiles, batch, m, k, x.stride(0), x.stride(1), out.stride(0), out.stride(1), alpha, beta,
        FUSE_POLY=fuse_poly, UPCAST=interpreting(), WARP_SPECIALIZE=warp_specialize,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_SMS=sms,
        num_warps=cfg.num_warps,
    )
    return out


def update(b: torch.Tensor, x: torch.Tensor, out: torch.Tensor, coef: float, cfg: GemmConfig,
           warp_specialize: bool = False) -> torch.Tensor:
    """out = coef * X + B X. b: (batch, M, M) and x: (batch, M, N) contiguous; out any strides."""
    batch, m, n = x.shape
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    sms, programs = _grid(num_tiles * batch, x.device)
    stages = stages_that_fit("update", cfg, out.element_size(), smem_limit(x.device))
    launch(
        _hopper_update_kernel, (programs,), stages, ("update", cfg, x.dtype, out.dtype, out.stride(-1) == 1, x.device),
        _desc(b, cfg.block_m, cfg.block_k), _desc(x, cfg.block_k, cfg.block_n), x,
        out, batch, m, n, x.stride(0), x.stride(1), out.stride(0), out.stride(1), out.stride(2), coef,
        UPCAST=interpreting(), WARP_SPECIALIZE=warp_specialize,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_SMS=sms,
        num_warps=cfg.num_warps,
    )
    return out
