"""The rotary Triton kernel. Host code and launch configuration: ``host.py``.

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
non-contiguous views need no copy; q_out / k_out may alias q / k (in place).
"""

from __future__ import annotations

from .._triton_support import tl, triton


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
