"""Rotary kernel, its launch configuration, the autograd Function and the custom ops.

For each head vector x of length D, the first ``rotary_dim`` (= cos.shape[-1]) entries are split
into pairs (x1, x2) and rotated; the rest pass through unchanged:

    style "half" (Hugging Face rotate_half):  x1 = x[j],    x2 = x[j + rotary_dim/2]
    style "interleaved" (GPT-J):              x1 = x[2j],   x2 = x[2j + 1]

    out1 = x1 * cos1 - x2 * sin1            cos1, sin1 = cos[p, index of x1], sin[p, index of x1]
    out2 = x2 * cos2 + x1 * sin2            cos2, sin2 = cos[p, index of x2], sin[p, index of x2]

that is, ``out = x * cos + rotate(x) * sin`` with cos / sin of shape (positions, rotary_dim) in
the "full" layout both styles' reference code builds (so cos1 == cos2 for the usual tables, but
the kernel does not assume it). p = position_offset (+ per-batch offset) + s, for KV-cache decoding.

Backward is the transposed rotation: dx1 = dy1 * cos1 + dy2 * sin2, dx2 = dy2 * cos2 - dy1 * sin1,
the forward kernel with (sin1, sin2) replaced by (-sin2, -sin1).

One launch covers q and k: the grid's second axis runs over (batch, head block) of q, then of k;
a program rotates BLOCK_H heads x BLOCK_S positions and loads the cos / sin tile once for all of
its heads. Inputs are read through their strides, so (B, H, S, D) and (B, S, H, D) layouts and
non-contiguous views need no copy. Not in place by default; ``apply_rotary_`` is the in-place
variant, a ``torch.library`` custom op declaring that it mutates q and k.

The public functions (``apply_rotary``, ``apply_rotary_``) and the PyTorch reference are in
``kernelbench.nn.rotary``.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: impl="auto" resolves to "torch" (autoselect logs it)
    from ._no_triton import tl, triton

from ..fast_launch import CachedLauncher, PlanCache
from . import _inductor_fallbacks
from ._triton_support import capped_power_of_two, compiled_op, static_int, wrap_triton

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
# Kernel
# ------------------------------------------------------------------------------------------------
@triton.jit
def _rotate_heads(
    x_ptr, x_sb, x_sh, x_ss, x_sd,  # input (B, H, S, D) through its strides
    o_ptr, o_sb, o_sh, o_ss, o_sd,  # output, same logical shape
    b, h0, H, s_idx, s_mask,
    c1, c2, s1, s2,  # (1, BLOCK_S, BLOCK_HALF) cos / sin tiles, in ACC
    D,
    EVEN: tl.constexpr,  # no partial tile (heads, positions, half): loads and stores unmasked
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    COPY_PASS: tl.constexpr,  # copy dims rotary_dim..D to the output (out of place only)
    ACC: tl.constexpr,
):
    heads = h0 + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    if INTERLEAVED:
        d1 = 2 * j
        d2 = 2 * j + 1
    else:
        d1 = j
        d2 = j + HALF
    mask = (heads < H)[:, None, None] & s_mask[None, :, None] & (j < HALF)[None, None, :]
    heads = heads.to(tl.int64)
    s64 = s_idx.to(tl.int64)
    x_row = x_ptr + b * x_sb + heads[:, None, None] * x_sh + s64[None, :, None] * x_ss
    o_row = o_ptr + b * o_sb + heads[:, None, None] * o_sh + s64[None, :, None] * o_ss
    if EVEN:
        x1 = tl.load(x_row + d1[None, None, :] * x_sd).to(ACC)
        x2 = tl.load(x_row + d2[None, None, :] * x_sd).to(ACC)
    else:
        x1 = tl.load(x_row + d1[None, None, :] * x_sd, mask=mask, other=0.0).to(ACC)
        x2 = tl.load(x_row + d2[None, None, :] * x_sd, mask=mask, other=0.0).to(ACC)
    out1 = (x1 * c1 - x2 * s1).to(o_ptr.dtype.element_ty)
    out2 = (x2 * c2 + x1 * s2).to(o_ptr.dtype.element_ty)
    if EVEN:
        tl.store(o_row + d1[None, None, :] * o_sd, out1)
        tl.store(o_row + d2[None, None, :] * o_sd, out2)
    else:
        tl.store(o_row + d1[None, None, :] * o_sd, out1, mask=mask)
        tl.store(o_row + d2[None, None, :] * o_sd, out2, mask=mask)
    if COPY_PASS:
        dp = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = (heads < H)[:, None, None] & s_mask[None, :, None] & (dp < D)[None, None, :]
        xp = tl.load(x_row + dp[None, None, :] * x_sd, mask=pmask, other=0.0)
        tl.store(o_row + dp[None, None, :] * o_sd, xp, mask=pmask)


@triton.jit
def _rotary_kernel(
    q_ptr, q_sb, q_sh, q_ss, q_sd,  # q as (B, Hq, S, D), any strides
    k_ptr, k_sb, k_sh, k_ss, k_sd,  # k as (B, Hk, S, D)
    qo_ptr, qo_sb, qo_sh, qo_ss, qo_sd,  # rotated q (may alias q: in place)
    ko_ptr, ko_sb, ko_sh, ko_ss, ko_sd,  # rotated k
    cos_ptr, cos_stride,  # (positions, rotary_dim), unit column stride
    sin_ptr, sin_stride,
    offsets_ptr,  # (B,) int: per-batch position offsets (HAS_OFFSETS)
    position_offset,  # int: the offset when there are no per-batch offsets
    Hq, Hk, S, D,
    HALF: tl.constexpr,  # rotary_dim / 2
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,  # rotate by the transposed matrix (gradients)
    HAS_OFFSETS: tl.constexpr,
    COPY_PASS: tl.constexpr,
    EVEN: tl.constexpr,  # BLOCK_H divides Hq and Hk, BLOCK_S divides S, BLOCK_HALF == HALF
    ACC: tl.constexpr,  # fp32; fp64 for fp64 inputs (gradcheck)
):
    s_block = tl.program_id(0)
    bh = tl.program_id(1)
    q_blocks = tl.cdiv(Hq, BLOCK_H)
    head_blocks = q_blocks + tl.cdiv(Hk, BLOCK_H)
    b = bh // head_blocks
    hb = bh % head_blocks

    s_idx = s_block * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s_idx < S
    if HAS_OFFSETS:
        pos = s_idx + tl.load(offsets_ptr + b)
    else:
        pos = s_idx + position_offset
    pos = pos.to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    if INTERLEAVED:
        d1 = 2 * j
        d2 = 2 * j + 1
    else:
        d1 = j
        d2 = j + HALF
    # Tiles of shape (1, BLOCK_S, BLOCK_HALF): loaded directly in the rank of x's tile, so the
    # broadcast over heads needs no layout conversion. evict_last: every program reads the
    # tables, and without the hint the streamed q / k push them out of L2.
    tmask = s_mask[None, :, None] & (j < HALF)[None, None, :]
    t_row = pos[None, :, None]
    if EVEN:
        c1 = tl.load(cos_ptr + t_row * cos_stride + d1[None, None, :], eviction_policy="evict_last").to(ACC)
        c2 = tl.load(cos_ptr + t_row * cos_stride + d2[None, None, :], eviction_policy="evict_last").to(ACC)
        s1 = tl.load(sin_ptr + t_row * sin_stride + d1[None, None, :], eviction_policy="evict_last").to(ACC)
        s2 = tl.load(sin_ptr + t_row * sin_stride + d2[None, None, :], eviction_policy="evict_last").to(ACC)
    else:
        c1 = tl.load(cos_ptr + t_row * cos_stride + d1[None, None, :], mask=tmask, other=0.0,
                     eviction_policy="evict_last").to(ACC)
        c2 = tl.load(cos_ptr + t_row * cos_stride + d2[None, None, :], mask=tmask, other=0.0,
                     eviction_policy="evict_last").to(ACC)
        s1 = tl.load(sin_ptr + t_row * sin_stride + d1[None, None, :], mask=tmask, other=0.0,
                     eviction_policy="evict_last").to(ACC)
        s2 = tl.load(sin_ptr + t_row * sin_stride + d2[None, None, :], mask=tmask, other=0.0,
                     eviction_policy="evict_last").to(ACC)
    if BACKWARD:
        s1, s2 = -s2, -s1

    b = b.to(tl.int64)
    if hb < q_blocks:
        _rotate_heads(q_ptr, q_sb, q_sh, q_ss, q_sd, qo_ptr, qo_sb, qo_sh, qo_ss, qo_sd,
                      b, hb * BLOCK_H, Hq, s_idx, s_mask, c1, c2, s1, s2, D,
                      EVEN, HALF, BLOCK_H, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, COPY_PASS, ACC)
    else:
        _rotate_heads(k_ptr, k_sb, k_sh, k_ss, k_sd, ko_ptr, ko_sb, ko_sh, ko_ss, ko_sd,
                      b, (hb - q_blocks) * BLOCK_H, Hk, s_idx, s_mask, c1, c2, s1, s2, D,
                      EVEN, HALF, BLOCK_H, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, COPY_PASS, ACC)


# ------------------------------------------------------------------------------------------------
# Launch
# ------------------------------------------------------------------------------------------------
def _table_2d(t: torch.Tensor) -> torch.Tensor:
    """cos / sin as (positions, rotary_dim): leading singleton dims (HF's (1, S, D)) dropped."""
    while t.dim() > 2 and t.shape[0] == 1:
        t = t[0]
    return t


def _bhsd_shape(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """t's (B, H, S, D) sizes, without making a transposed view."""
    b, d1, d2, d = t.shape
    return (b, d1, d2, d) if layout == "bhsd" else (b, d2, d1, d)


def _bhsd_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    sb, s1, s2, sd = t.stride()
    return (sb, s1, s2, sd) if layout == "bhsd" else (sb, s2, s1, sd)


# Launchers by everything that decides the grid and the compile-time arguments, so a call with a
# shape seen before does no configuration work and skips Triton's per-launch argument binding.
_launchers: PlanCache = PlanCache()


def _launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, *, interleaved, backward, copy_pass,
            layout="bhsd", config: RotaryConfig | None = None):
    """q, k, q_out, k_out in ``layout``; cos / sin (positions, rotary_dim); ``config`` None: the
    default launch (``rotary_config``)."""
    batch, hq, seq, dim = _bhsd_shape(q, layout)
    hk = _bhsd_shape(k, layout)[1]
    key = (batch, hq, hk, seq, dim, cos.shape[-1], q.dtype, q.get_device(), interleaved, backward, copy_pass,
           offsets is not None, config)
    launch = _launchers.get(key)
    if launch is None:
        grid, meta = _launch_spec(*key)
        launch = _launchers.remember(key, CachedLauncher(_rotary_kernel, grid, **meta))
    launch(*_launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, (hq, hk, seq, dim)))


def _traced_launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, *, interleaved, backward, copy_pass,
                   layout):
    """``_launch``'s default launch as a traceable ``wrap_triton`` call (the ops' bodies)."""
    batch, hq, seq, dim = _bhsd_shape(q, layout)
    hk = _bhsd_shape(k, layout)[1]
    # Heads and dims are the model's (specialized under dynamic shapes); batch and seq may vary.
    grid, meta = _launch_spec(batch, static_int(hq), static_int(hk), seq, static_int(dim),
                              static_int(cos.shape[-1]), q.dtype, None, interleaved, backward, copy_pass,
                              offsets is not None, None)
    wrap_triton(_rotary_kernel)[grid](
        *_launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, (hq, hk, seq, dim)), **meta)


def _launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, sizes: tuple) -> list:
    """The rotary kernel's runtime arguments; ``sizes``: (q heads, k heads, seq, head dim)."""
    return [
        q, *_bhsd_strides(q, layout), k, *_bhsd_strides(k, layout),
        q_out, *_bhsd_strides(q_out, layout), k_out, *_bhsd_strides(k_out, layout),
        cos, cos.stride(0), sin, sin.stride(0),
        offsets if offsets is not None else cos, position_offset,
        *sizes,
    ]


def _launch_spec(batch, hq, hk, seq, dim, rot, dtype, device_index, interleaved, backward, copy_pass, has_offsets,
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


def _forward(q, k, cos, sin, offsets, position_offset, interleaved, layout):
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, interleaved=interleaved, backward=False,
            copy_pass=True, layout=layout)
    return q_out, k_out


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, offsets, position_offset, style, layout):
        interleaved = style == "interleaved"
        ctx.save_for_backward(cos, sin, offsets)
        ctx.position_offset, ctx.interleaved, ctx.layout = position_offset, interleaved, layout
        return _forward(q, k, cos, sin, offsets, position_offset, interleaved, layout)

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        cos, sin, offsets = ctx.saved_tensors
        dq, dk = torch.empty_like(dq_out), torch.empty_like(dk_out)
        _launch(dq_out, dk_out, dq, dk, cos, sin, offsets, ctx.position_offset, interleaved=ctx.interleaved,
                backward=True, copy_pass=True, layout=ctx.layout)
        return dq, dk, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees (``compiled_op``: triton_ops, so Inductor launches the kernel from
# its generated code), fake and autograd formula registered; the bodies make eager's launch
# traceably
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::rotary", mutates_args=())
def _rotary_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offsets: torch.Tensor | None,
    position_offset: int, interleaved: bool, bshd: bool, backward: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k), new tensors; ``backward`` rotates by the transposed matrix (gradients)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _traced_launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, interleaved=interleaved,
                   backward=backward, copy_pass=True, layout="bshd" if bshd else "bhsd")
    return q_out, k_out


@_rotary_op.register_fake
def _(q, k, cos, sin, offsets, position_offset, interleaved, bshd, backward):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text (a
    # per-batch offsets tensor is checked for its shape; its values are unknown while tracing).
    _check(q, k, cos, sin, "interleaved" if interleaved else "half", "bshd" if bshd else "bhsd",
           offsets if offsets is not None else position_offset)
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_op_setup_context(ctx, inputs, output):
    _, _, cos, sin, offsets, position_offset, interleaved, bshd, _ = inputs
    ctx.save_for_backward(cos, sin, offsets)
    ctx.args = (position_offset, interleaved, bshd)


def _rotary_op_backward(ctx, dq_out, dk_out):
    cos, sin, offsets = ctx.saved_tensors
    dq, dk = torch.ops.kernelbench.rotary(dq_out, dk_out, cos, sin, offsets, *ctx.args, True)
    return dq, dk, None, None, None, None, None, None, None


_rotary_op.register_autograd(_rotary_op_backward, setup_context=_rotary_op_setup_context)


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------
def _check(q, k, cos, sin, style, layout, position_offset) -> tuple[torch.Tensor, torch.Tensor]:
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
    qb, kb = _bhsd_shape(q, layout), _bhsd_shape(k, layout)
    if (qb[0], qb[2], qb[3]) != (kb[0], kb[2], kb[3]):
        raise ValueError(
            f"apply_rotary: q {tuple(q.shape)} and k {tuple(k.shape)} ({layout}) must share batch, "
            "sequence and head dimension"
        )
    cos, sin = _table_2d(cos), _table_2d(sin)
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


def _table_for_kernel(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _offsets_for_kernel(position_offset, device) -> tuple[torch.Tensor | None, int]:
    if isinstance(position_offset, torch.Tensor):
        return position_offset.to(device=device, dtype=torch.int64).contiguous(), 0
    return None, int(position_offset)


@compiled_op("kernelbench::rotary_", mutates_args=("q", "k"))
def _rotary_inplace_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    offsets: torch.Tensor | None, position_offset: int, interleaved: bool, bshd: bool,
) -> None:
    # In place: each program loads its x1 / x2 before storing them; pass-through dims stay as they are.
    _traced_launch(q, k, q, k, cos, sin, offsets, position_offset, interleaved=interleaved, backward=False,
                   copy_pass=False, layout="bshd" if bshd else "bhsd")


@_rotary_inplace_op.register_fake
def _(q, k, cos, sin, offsets, position_offset, interleaved, bshd) -> None:
    _check(q, k, cos, sin, "interleaved" if interleaved else "half", "bshd" if bshd else "bhsd",
           offsets if offsets is not None else position_offset)
    return None


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.rotary.default,
)
