"""Newton-Schulz's host side: tile configurations (``GemmConfig``, picked per shape by a wave
model over ``TILE_CONFIGS``), the symmetric tile tables, the launches of both paths' kernels
(``kernels.py``) and the iteration itself (``forward``).

- classic: pointer-load kernels on a grid of tiles.
- hopper (sm_90, triton >= 3.4): TMA descriptors built here
  (``triton.tools.tensor_descriptor.TensorDescriptor``) and one persistent program per SM. A
  persistent kernel keeps the next tile's operand buffers live during the epilogue, so the
  epilogue's buffers add to the pipeline's; ``smem_bytes`` models the total and each launch runs
  the most stages (up to the config's) that fit the device. ``launch`` retries with one stage
  fewer if Triton still reports OutOfResources (the model estimates Triton's allocation).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
from triton.runtime.errors import OutOfResources

from .._device import sm_count
from .kernels import (
    _hopper_sym_gram_kernel,
    _hopper_update_kernel,
    _normalize_kernel,
    _sym_gram_kernel,
    _update_kernel,
)

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and pipeline depth of one GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    group_m: int = 8  # rows of tiles walked together so their operands stay in L2


# -- tile configurations -----------------------------------------------------------------------
# Candidates, largest first. 128x256x64 with 8 warps (two warpgroups of 64x256 wgmma) and 3
# stages (3 * (128 + 256) * 64 * 2 B = 144 KiB of shared memory) is the tile that reaches cuBLAS
# rates on Hopper when there are enough tiles to fill the SMs; smaller tiles trade per-tile
# efficiency for more tiles, which wins when the big tile leaves SMs idle (n <= 4096).
# THROUGHPUT is the assumed per-SM rate of each tile relative to the largest: an estimate that
# picked the fastest (Gram, update) pair of a full sweep on every measured shape.
TILE_CONFIGS = (
    GemmConfig(128, 256, 64, num_stages=3, num_warps=8),
    GemmConfig(128, 128, 64, num_stages=4, num_warps=8),
    GemmConfig(64, 128, 64, num_stages=4, num_warps=4),
    GemmConfig(64, 64, 64, num_stages=4, num_warps=4),
)
THROUGHPUT = {(128, 256): 1.0, (128, 128): 0.85, (64, 128): 0.65, (64, 64): 0.45}
# The interpreter: tiles small enough that test matrices of a few dozen rows span several, and
# no smaller (the interpreter's time grows with the number of programs).
INTERPRETER_CONFIG = GemmConfig(32, 64, 32, num_stages=1, num_warps=4, group_m=2)


def sym_tile_count(m: int, cfg: GemmConfig) -> int:
    """Tiles the Gram kernels launch for an m x m symmetric result (upper triangle only)."""
    return sum(math.ceil((m - i * cfg.block_m) / cfg.block_n) for i in range(math.ceil(m / cfg.block_m)))


def _cost(tiles: int, cfg: GemmConfig, sms: int) -> float:
    # Waves of tiles (a partial wave costs a whole one) times the time of one tile.
    return math.ceil(tiles / sms) * cfg.block_m * cfg.block_n / THROUGHPUT[(cfg.block_m, cfg.block_n)]


def configs_for(m: int, n: int, batch: int, sms: int) -> tuple[GemmConfig, GemmConfig]:
    """(Gram config, update config) for X of shape (batch, m, n) on a GPU of ``sms`` SMs, by the
    wave model above. The stages are the most a launch uses: the Hopper kernels run fewer where
    the output's epilogue would not fit shared memory (stages_that_fit)."""
    gram = min(TILE_CONFIGS, key=lambda c: _cost(batch * sym_tile_count(m, c), c, sms))
    upd = min(TILE_CONFIGS, key=lambda c: _cost(batch * math.ceil(m / c.block_m) * math.ceil(n / c.block_n), c, sms))
    return gram, upd


@functools.lru_cache(maxsize=256)
def pick_configs(m: int, n: int, batch: int, device: torch.device) -> tuple[GemmConfig, GemmConfig]:
    """configs_for on ``device`` (INTERPRETER_CONFIG for both off CUDA)."""
    if device.type != "cuda":
        return INTERPRETER_CONFIG, INTERPRETER_CONFIG
    return configs_for(m, n, batch, sm_count(device))


# -- symmetric tiles and the launch ------------------------------------------------------------
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
    return os.environ.get("TRITON_INTERPRET") == "1"


# -- classic: pointer loads ----------------------------------------------------------------------
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


# -- hopper: TMA descriptors, persistent tiles ---------------------------------------------------
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


def smem_bytes(kind: str, cfg: GemmConfig, stages: int, out_itemsize: int = 2) -> int:
    """Shared memory a Hopper kernel of ``kind`` ("gram", "gram-poly", "update") needs.

    - every kind: ``stages`` bf16 operand buffers of (block_m + block_n) x block_k;
    - "gram", "gram-poly": the bf16 TMA store buffer of the output tile;
    - "gram-poly": the epilogue's loaded A tile, converted to the accumulator's layout through
      shared memory (another bf16 tile);
    - "update": the output tile converted for the pointer store, at the output's element size
      (the last iteration writes fp32 when the caller's input is fp32).

    Checked against what Triton 3.6.0 asked for on an H200 (tests/test_muon_ns.py holds the
    cases: the model is Triton's figure less its 24 bytes of barriers)."""
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


def hopper_sym_gram(x: torch.Tensor, out: torch.Tensor, cfg: GemmConfig, alpha: float = 0.0, beta: float = 1.0,
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


def hopper_update(b: torch.Tensor, x: torch.Tensor, out: torch.Tensor, coef: float, cfg: GemmConfig,
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


class GemmPath(NamedTuple):
    """A path's two GEMM launches."""

    sym_gram: object
    update: object


GEMMS = {"classic": GemmPath(sym_gram, update), "hopper": GemmPath(hopper_sym_gram, hopper_update)}


# -- the iteration ------------------------------------------------------------------------------
def forward(G: torch.Tensor, steps: int, path: str, eps: float = NS_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` iterations on G (m x n or batch x m x n) with the ``path`` ("classic" or "hopper")
    kernels: (the result in G's dtype and orientation, G's fp32 Frobenius norm per matrix)."""
    gemms = GEMMS[path]
    squeeze = G.dim() == 2
    G3 = G.unsqueeze(0) if squeeze else G
    transposed = G3.size(-2) > G3.size(-1)
    Gv = G3.mT if transposed else G3  # (batch, m, n), m <= n: a view, no copy
    batch, m, n = Gv.shape
    if path == "hopper":
        reason = unavailable_reason(G.device, (m, n), (m, m))
        if reason is not None:
            raise ValueError(f"path 'hopper' is unavailable: {reason}")
    gram_cfg, upd_cfg = pick_configs(m, n, batch, G.device)

    norm = torch.linalg.vector_norm(Gv, dim=(-2, -1), dtype=torch.float32)
    x = torch.empty((batch, m, n), device=G.device, dtype=torch.bfloat16)
    normalize(Gv, norm, x, eps)
    out = torch.empty_like(G3)  # the caller's dtype and orientation
    out_view = out.mT if transposed else out
    if steps == 0:
        out_view.copy_(x)
        return (out.squeeze(0) if squeeze else out), norm

    a, b, c = NS_COEFFICIENTS
    gram = torch.empty((batch, m, m), device=G.device, dtype=torch.bfloat16)
    poly = torch.empty_like(gram)
    x_next = torch.empty_like(x)
    for step in range(steps):
        gemms.sym_gram(x, gram, gram_cfg)
        gemms.sym_gram(gram, poly, gram_cfg, alpha=b, beta=c, fuse_poly=True)
        last = step == steps - 1
        gemms.update(poly, x, out_view if last else x_next, a, upd_cfg)
        x, x_next = x_next, x
    return (out.squeeze(0) if squeeze else out), norm
