"""Cross-entropy's host side: the launch configuration (``XentConfig``; defaults per V from
``fwd_config`` / ``bwd_config``), input checks, and ``forward`` / ``backward`` on rows (``x2d``:
(M, V) logits with unit column stride, ``t1d``: (M,) int64 targets), launched through a
``CachedLauncher`` per (shape, dtype, device, config).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...fast_launch import CachedLauncher, PlanCache
from .._triton_support import acc_dtype, capped_power_of_two, is_power_of_two, static_int, tl_acc, triton
from .kernels import _xent_bwd_kernel, _xent_fwd_kernel, _xent_reduce_kernel

# fp64 is computed in fp64 throughout (for gradcheck); the others in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
REDUCTIONS = ("mean", "sum", "none")

# Widest chunk a program holds: at 16 warps, 16 values a thread (two 16-byte bf16 vectors).
_MAX_BLOCK_V = 8192
_VALUES_PER_THREAD = 16
# The forward waits on no reduction across its warps until a row's end, so more programs of 8
# warps and no software pipelining keep the loads going best: 4096 / 8 / 1 was fastest of 12
# launches at 32k and 128k columns (results/2026-11-29-h200-xent-fwd-groups).
_FWD_MAX_BLOCK_V = 4096
_FWD_STAGES = 1
_BWD_STAGES = 1
# The reduction over rows: 4096 rows a step at 16 warps (8 values a thread).
_REDUCE_BLOCK_M = 4096


@dataclass(frozen=True)
class XentConfig:
    """Launch of the forward or backward kernel: one row per program in chunks of ``block_v``,
    ``num_stages`` chunks in flight (1: no software pipelining)."""

    block_v: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        if not is_power_of_two(self.block_v):
            raise ValueError(f"cross_entropy XentConfig: block_v must be a power of two, got {self.block_v}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"cross_entropy XentConfig: num_warps must be one of 1, 2, 4, 8, 16, 32, "
                             f"got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"cross_entropy XentConfig: num_stages must be 1 to 4, got {self.num_stages}")


def _chunk(v: int, max_block_v: int = _MAX_BLOCK_V) -> tuple[int, int]:
    block_v = min(max_block_v, triton.next_power_of_2(v))
    return block_v, max(1, min(16, block_v // (32 * _VALUES_PER_THREAD)))


@functools.cache
def fwd_config(v: int) -> XentConfig:
    """The forward's default launch for rows of V logits."""
    block_v, warps = _chunk(v, _FWD_MAX_BLOCK_V)
    return XentConfig(block_v, warps, _FWD_STAGES)


@functools.cache
def bwd_config(v: int) -> XentConfig:
    """The backward's default launch for rows of V logits."""
    block_v, warps = _chunk(v)
    return XentConfig(block_v, warps, _BWD_STAGES if v > block_v else 1)


# ------------------------------------------------------------------------------------------------
# Launches
# ------------------------------------------------------------------------------------------------
def as_rows(logits: torch.Tensor) -> torch.Tensor:
    """(M, V) view with unit column stride (copies only when that needs one)."""
    rows = logits.reshape(-1, logits.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[0] == 0 else rows.contiguous()


def as_targets(targets: torch.Tensor) -> torch.Tensor:
    flat = targets.reshape(-1)
    return flat if flat.stride(0) == 1 or flat.numel() <= 1 else flat.contiguous()


# Launchers by (rows, V, dtype, device, config...): a shape seen before costs no configuration
# work.
_plans: PlanCache = PlanCache()


def _launcher(key: tuple, make) -> CachedLauncher:
    launch = _plans.get(key)
    if launch is None:
        launch = _plans.remember(key, make())
    return launch


def forward(x2d: torch.Tensor, t1d: torch.Tensor, ignore_index: int, reduction: str,
            config: XentConfig | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, n_valid): loss (M,) for "none", else a scalar; lse (M,); n_valid a scalar
    ("mean" / "sum") or an empty tensor ("none"). ``config`` None: ``fwd_config(V)``."""
    m, v = x2d.shape
    acc = acc_dtype(x2d.dtype)
    lse = torch.empty(m, dtype=acc, device=x2d.device)
    loss_rows = torch.empty(m, dtype=acc, device=x2d.device)
    if m:
        cfg = config or fwd_config(static_int(v))  # the vocabulary: specialized under dynamic shapes
        launch = _launcher(("fwd", m, v, x2d.dtype, x2d.device, cfg), lambda: CachedLauncher(
            _xent_fwd_kernel, (m,), **fwd_meta(cfg, x2d.dtype)))
        launch(x2d, x2d.stride(0), t1d, loss_rows, lse, v, ignore_index)
    if reduction == "none":
        return loss_rows, lse, lse.new_empty(0)
    if not m:
        empty = float("nan") if reduction == "mean" else 0.0
        return torch.full((), empty, dtype=acc, device=x2d.device), lse, torch.zeros((), dtype=acc, device=x2d.device)
    loss = torch.empty((), dtype=acc, device=x2d.device)
    n_valid = torch.empty((), dtype=acc, device=x2d.device)
    launch = _launcher(("reduce", m, x2d.dtype, x2d.device, reduction), lambda: CachedLauncher(
        _xent_reduce_kernel, (1,), **reduce_meta(m, x2d.dtype, reduction)))
    launch(loss_rows, t1d, loss, n_valid, m, ignore_index)
    return loss, lse, n_valid


def fwd_meta(cfg: XentConfig, dtype: torch.dtype) -> dict:
    # A group per thread's share of a chunk (at most): its max is found in registers.
    group = min(_VALUES_PER_THREAD, cfg.block_v)
    return dict(BLOCK_V=cfg.block_v, GROUP=group, STAGES=cfg.num_stages, ACC=tl_acc(dtype),
                num_warps=cfg.num_warps)


def reduce_meta(m: int, dtype: torch.dtype, reduction: str) -> dict:
    block_m = capped_power_of_two(m, _REDUCE_BLOCK_M)
    return dict(MEAN=reduction == "mean", BLOCK_M=block_m, ACC=tl_acc(dtype), num_warps=max(1, min(16, block_m // 256)))


def backward(grad: torch.Tensor, x2d: torch.Tensor, t1d: torch.Tensor, lse: torch.Tensor,
             n_valid: torch.Tensor, ignore_index: int, reduction: str,
             config: XentConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """dlogits (M, V), contiguous, in the logits' dtype. ``out``: where to write it, which may be
    ``x2d`` itself (a program reads each chunk of its row before it writes that chunk, and
    nothing of the row after); the caller checks its shape, dtype and layout."""
    m, v = x2d.shape
    dx = torch.empty((m, v), dtype=x2d.dtype, device=x2d.device) if out is None else out
    if not m:
        return dx
    if reduction == "none":
        grad = grad.reshape(-1)
        g_stride = grad.stride(0)
    else:
        g_stride = 0
    cfg = config or bwd_config(v)
    mean = reduction == "mean"
    launch = _launcher(("bwd", m, v, x2d.dtype, x2d.device, mean, cfg), lambda: CachedLauncher(
        _xent_bwd_kernel, (m,), MEAN=mean, BLOCK_V=cfg.block_v, STAGES=cfg.num_stages, ACC=tl_acc(x2d.dtype),
        num_warps=cfg.num_warps))
    launch(grad, g_stride, x2d, x2d.stride(0), t1d, lse, n_valid if mean else lse, dx, dx.stride(0), v, ignore_index)
    return dx


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> None:
    """Raise a one-line error naming what is wrong with the inputs and what is accepted."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"cross_entropy: logits must be a tensor, got {type(logits).__name__}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"cross_entropy: targets must be a tensor, got {type(targets).__name__}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"cross_entropy: unsupported logits dtype {logits.dtype}; accepted: float32, bfloat16, "
                        "float16, float64")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits of shape {tuple(logits.shape)} have no classes; expected "
                         "(..., V) with V >= 1")
    if targets.dtype != torch.int64:
        raise TypeError(f"cross_entropy: targets must be int64 class indices, got dtype {targets.dtype}")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"cross_entropy: targets has shape {tuple(targets.shape)}, expected "
                         f"{tuple(logits.shape[:-1])} (the logits' shape {tuple(logits.shape)} without the last dim)")
    if targets.device != logits.device:
        raise ValueError(f"cross_entropy: targets are on {targets.device}, logits on {logits.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if type(ignore_index) is not int:
        raise TypeError(f"cross_entropy: ignore_index must be an int, got {type(ignore_index).__name__}")
