"""SwiGLU's host side: the launch configuration (``SiluMulConfig``, ``default_config``), input
checks, and ``forward`` / ``backward`` on gate and up (other layouts are copied first), launched
through a ``CachedLauncher`` per (numel, dtype, device, config).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...fast_launch import CachedLauncher, PlanCache
from .._triton_support import tl_acc, triton
from .kernels import _silu_mul_bwd_kernel, _silu_mul_fwd_kernel

# fp64 is computed in fp64 throughout (for gradcheck); the others in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DTYPE_NAMES = "float32, bfloat16, float16, float64"

# Each thread moves this many 16-byte vectors of every tensor per program: two loads of each
# input in flight per thread (LDG.128), so an SM full of programs keeps enough bytes in flight
# to cover HBM latency.
_VECTORS_PER_THREAD = 2
_NUM_WARPS = 8


@dataclass(frozen=True)
class SiluMulConfig:
    """Launch of the forward or backward kernel: ``block`` elements per program (a power of
    two) on ``num_warps`` warps."""

    block: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"swiglu SiluMulConfig: block must be a power of two, got {self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"swiglu SiluMulConfig: num_warps must be one of 1, 2, 4, 8, 16, 32, "
                             f"got {self.num_warps}")


@functools.cache
def default_config(element_size: int) -> SiluMulConfig:
    """The default launch for elements of ``element_size`` bytes (forward and backward)."""
    per_thread = _VECTORS_PER_THREAD * 16 // element_size
    return SiluMulConfig(per_thread * 32 * _NUM_WARPS, _NUM_WARPS)


# ------------------------------------------------------------------------------------------------
# Launches
# ------------------------------------------------------------------------------------------------
# Launchers by (numel, dtype, device, config): a repeated shape does no configuration work.
_fwd_plans: PlanCache = PlanCache()
_bwd_plans: PlanCache = PlanCache()


def _launcher(plans: PlanCache, kernel, numel: int, like: torch.Tensor, config: SiluMulConfig | None) -> CachedLauncher:
    key = (numel, like.dtype, like.get_device(), config)
    launch = plans.get(key)
    if launch is None:
        grid, meta = launch_spec(numel, like, config)
        launch = plans.remember(key, CachedLauncher(kernel, grid, **meta))
    return launch


def launch_spec(numel: int, like: torch.Tensor, config: SiluMulConfig | None) -> tuple[tuple, dict]:
    """(grid, compile-time arguments) of either kernel's launch over ``numel`` elements."""
    cfg = config or default_config(like.element_size())
    return (triton.cdiv(numel, cfg.block),), dict(BLOCK=cfg.block, EVEN=bool(numel % cfg.block == 0),
                                                   ACC=tl_acc(like.dtype), num_warps=cfg.num_warps)


def flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def forward(gate: torch.Tensor, up: torch.Tensor, *, config: SiluMulConfig | None = None) -> torch.Tensor:
    """silu(gate) * up, contiguous, shaped like gate; ``config`` None: ``default_config``."""
    gate, up = flat(gate), flat(up)
    out = torch.empty_like(gate)  # contiguous input: contiguous output
    numel = gate.numel()
    if numel:
        _launcher(_fwd_plans, _silu_mul_fwd_kernel, numel, gate, config)(gate, up, out, numel)
    return out


def backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, *,
             config: SiluMulConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous, shaped like gate."""
    dy, gate, up = flat(dy), flat(gate), flat(up)
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    numel = gate.numel()
    if numel:
        _launcher(_bwd_plans, _silu_mul_bwd_kernel, numel, gate, config)(dy, gate, up, dgate, dup, numel)
    return dgate, dup


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(gate: torch.Tensor, up: torch.Tensor) -> None:
    """Raise a one-line error naming what is wrong with (gate, up) and what is accepted."""
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"silu_mul: {name} must be a tensor, got {type(t).__name__}")
    if gate.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"silu_mul: unsupported dtype {gate.dtype}; accepted: {_DTYPE_NAMES}")
    if up.dtype != gate.dtype:
        raise TypeError(f"silu_mul: up has dtype {up.dtype}, gate {gate.dtype}; both must have the same dtype")
    if up.shape != gate.shape:
        raise ValueError(f"silu_mul: up has shape {tuple(up.shape)}, gate {tuple(gate.shape)}; "
                         "both must have the same shape (no broadcasting)")
    if up.device != gate.device:
        raise ValueError(f"silu_mul: up is on {up.device}, gate on {gate.device}; both must be on one device")


def check_backward_inputs(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
    """(gate, up) as ``check_inputs``, and dy of their shape, dtype and device: the backward
    kernels read (and the in-place one writes) numel elements of each."""
    check_inputs(gate, up)
    if not isinstance(dy, torch.Tensor):
        raise TypeError(f"silu_mul backward: dy must be a tensor, got {type(dy).__name__}")
    if (dy.shape, dy.dtype, dy.device) != (gate.shape, gate.dtype, gate.device):
        raise ValueError(f"silu_mul backward: dy is {tuple(dy.shape)} {dy.dtype} on {dy.device}, gate "
                         f"{tuple(gate.shape)} {gate.dtype} on {gate.device}; dy must match gate")
