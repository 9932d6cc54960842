"""Rotary's host side: the launch configuration (``RotaryConfig``, chosen by
``rotary_config``), input checks, and ``forward`` / ``backward`` that launch the kernel of
``kernels.py`` through a ``CachedLauncher`` per (shape, dtype, device, config).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch

from ...fast_launch import CachedLauncher, PlanCache
from .._triton_support import capped_power_of_two, tl, triton
from .kernels import _rotary_kernel

STYLES = ("half", "interleaved")
LAYOUTS = ("bhsd", "bshd")
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

# Default tile: 2 heads x 8 positions x 128 dims (2048 elements) per program at 4 warps, each
# program loading its cos / sin tile once for its heads (results/2026-11-22-h200-norm/README.md).
# Odd head counts take one head per program (no masked tiles).
_ELEMENTS_PER_PROGRAM = 2048
_DEFAULT_BLOCK_H = 2
_DEFAULT_NUM_WARPS = 4


@dataclass(frozen=True)
class RotaryConfig:
    """Launch of ``_rotary_kernel``: ``block_h`` heads x ``block_s`` positions per program."""

    block_h: int
    block_s: int
    num_warps: int

    def __post_init__(self) -> None:
        for name in ("block_h", "block_s"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"rotary RotaryConfig: {name} must be a power of two, got {value}")


def rotary_config(hq: int, hk: int, seq: int, half: int) -> RotaryConfig:
    """The default launch for q / k with hq / hk heads, seq positions (symbolic in a body traced
    with dynamic shapes), rotary_dim = 2 * half."""
    block_h = _DEFAULT_BLOCK_H if hq % _DEFAULT_BLOCK_H == 0 and hk % _DEFAULT_BLOCK_H == 0 else 1
    block_half = triton.next_power_of_2(half)
    block_s = capped_power_of_two(seq, max(1, _ELEMENTS_PER_PROGRAM // (2 * block_h * block_half)))
    return RotaryConfig(block_h, block_s, _DEFAULT_NUM_WARPS)


# ------------------------------------------------------------------------------------------------
# Launches
# ------------------------------------------------------------------------------------------------
def table_2d(t: torch.Tensor) -> torch.Tensor:
    """cos / sin as (positions, rotary_dim): leading singleton dims (HF's (1, S, D)) dropped."""
    while t.dim() > 2 and t.shape[0] == 1:
        t = t[0]
    return t


def bhsd_shape(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """t's (B, H, S, D) sizes, without making a transposed view."""
    b, d1, d2, d = t.shape
    return (b, d1, d2, d) if layout == "bhsd" else (b, d2, d1, d)


def bhsd_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    sb, s1, s2, sd = t.stride()
    return (sb, s1, s2, sd) if layout == "bhsd" else (sb, s2, s1, sd)


# Launchers by everything that decides the grid and the compile-time arguments, so a call with a
# shape seen before does no configuration work and skips Triton's per-launch argument binding.
_launchers: PlanCache = PlanCache()


def launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, *, interleaved, backward, copy_pass,
           layout="bhsd", config: RotaryConfig | None = None):
    """q, k, q_out, k_out in ``layout``; cos / sin (positions, rotary_dim); ``config`` None: the
    default launch (``rotary_config``)."""
    batch, hq, seq, dim = bhsd_shape(q, layout)
    hk = bhsd_shape(k, layout)[1]
    key = (batch, hq, hk, seq, dim, cos.shape[-1], q.dtype, q.get_device(), interleaved, backward, copy_pass,
           offsets is not None, config)
    launcher = _launchers.get(key)
    if launcher is None:
        grid, meta = launch_spec(*key)
        launcher = _launchers.remember(key, CachedLauncher(_rotary_kernel, grid, **meta))
    launcher(*launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, (hq, hk, seq, dim)))


def launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, sizes: tuple) -> list:
    """The rotary kernel's runtime arguments; ``sizes``: (q heads, k heads, seq, head dim)."""
    return [
        q, *bhsd_strides(q, layout), k, *bhsd_strides(k, layout),
        q_out, *bhsd_strides(q_out, layout), k_out, *bhsd_strides(k_out, layout),
        cos, cos.stride(0), sin, sin.stride(0),
        offsets if offsets is not None else cos, position_offset,
        *sizes,
    ]


def launch_spec(batch, hq, hk, seq, dim, rot, dtype, device_index, interleaved, backward, copy_pass, has_offsets,
                config) -> tuple[tuple, dict]:
    """(grid, compile-time arguments) of the rotary kernel's launch."""
    half = rot // 2
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    block_half = triton.next_power_of_2(half)
    block_h, block_s, num_warps = astuple(config or rotary_config(hq, hk, seq, half))
    even = bool(seq % block_s == 0) and hq % block_h == 0 and hk % block_h == 0 and block_half == half
    block_pass = triton.next_power_of_2(max(1, dim - 2 * half))
    head_blocks = triton.cdiv(hq, block_h) + triton.cdiv(hk, block_h)
    grid = (triton.cdiv(seq, block_s), batch * head_blocks)
    return grid, dict(
        HALF=half, BLOCK_H=block_h, BLOCK_S=block_s, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
        INTERLEAVED=interleaved, BACKWARD=backward, HAS_OFFSETS=has_offsets,
        COPY_PASS=copy_pass and dim > 2 * half, EVEN=even, ACC=acc, num_warps=num_warps,
    )


def forward(q, k, cos, sin, offsets, position_offset, interleaved: bool, layout: str):
    """Rotated (q, k), new tensors; cos / sin as ``table_for_kernel`` gives them, offsets /
    position_offset as ``offsets_for_kernel`` does."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, interleaved=interleaved, backward=False,
           copy_pass=True, layout=layout)
    return q_out, k_out


def backward(dq_out, dk_out, cos, sin, offsets, position_offset, interleaved: bool, layout: str):
    """(dq, dk): the gradients rotated by the transposed matrix."""
    dq, dk = torch.empty_like(dq_out), torch.empty_like(dk_out)
    launch(dq_out, dk_out, dq, dk, cos, sin, offsets, position_offset, interleaved=interleaved, backward=True,
           copy_pass=True, layout=layout)
    return dq, dk


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(q, k, cos, sin, style, layout, position_offset) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate; return cos / sin as 2-D tables."""
    if style not in STYLES:
        raise ValueError(f"apply_rotary: style must be one of {', '.join(STYLES)}, got {style!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"apply_rotary: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"apply_rotary: {name} must be 4-D ({layout.upper()}), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"apply_rotary: unsupported dtype {t.dtype} for {name}; accepted: float32, bfloat16, float16, float64")
    if q.dtype != k.dtype or q.device != k.device:
        raise ValueError(f"apply_rotary: q ({q.dtype}, {q.device}) and k ({k.dtype}, {k.device}) must match")
    qb, kb = bhsd_shape(q, layout), bhsd_shape(k, layout)
    if (qb[0], qb[2], qb[3]) != (kb[0], kb[2], kb[3]):
        raise ValueError(
            f"apply_rotary: q {tuple(q.shape)} and k {tuple(k.shape)} ({layout}) must share batch, "
            "sequence and head dimension"
        )
    cos, sin = table_2d(cos), table_2d(sin)
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(
            f"apply_rotary: cos and sin must both be (positions, rotary_dim) (leading 1s allowed), got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if not cos.is_floating_point() or not sin.is_floating_point():
        raise TypeError(f"apply_rotary: cos / sin must be floating point, got {cos.dtype} / {sin.dtype}")
    if cos.device != q.device or sin.device != q.device:
        raise ValueError(f"apply_rotary: cos / sin are on {cos.device}, q on {q.device}")
    rot, head_dim, seq = cos.shape[-1], qb[3], qb[2]
    if rot > head_dim:
        raise ValueError(
            f"apply_rotary: rotary dimension {rot} (cos.shape[-1]) is larger than the head dimension {head_dim}")
    if rot % 2 or rot == 0:
        raise ValueError(f"apply_rotary: rotary dimension {rot} (cos.shape[-1]) must be even and positive")
    if isinstance(position_offset, torch.Tensor):
        if position_offset.shape != (qb[0],) or position_offset.is_floating_point():
            raise ValueError(
                f"apply_rotary: position_offset tensor must be integer of shape ({qb[0]},), got "
                f"{position_offset.dtype} {tuple(position_offset.shape)}"
            )
        if isinstance(position_offset, torch._subclasses.FakeTensor) or torch.compiler.is_compiling():
            # A traced tensor's values are unknown: only the sequence itself is checked.
            lo, hi = 0, 0
        else:
            # One host sync: an out-of-range offset would otherwise read past cos / sin.
            lo, hi = int(position_offset.min()), int(position_offset.max())
    else:
        lo = hi = int(position_offset)
    if lo < 0:
        raise ValueError(f"apply_rotary: position offsets must be >= 0, got {lo}")
    if hi + seq > cos.shape[0]:
        raise ValueError(
            f"apply_rotary: cos / sin have {cos.shape[0]} positions, shorter than the {hi + seq} needed "
            f"(offset {hi} + sequence length {seq})"
        )
    return cos, sin


def table_for_kernel(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def offsets_for_kernel(position_offset, device) -> tuple[torch.Tensor | None, int]:
    if isinstance(position_offset, torch.Tensor):
        return position_offset.to(device=device, dtype=torch.int64).contiguous(), 0
    return None, int(position_offset)
