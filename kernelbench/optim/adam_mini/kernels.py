"""AdamMini's Triton kernels. Launch configurations, plans and launches: ``host.py``.

Every block of a runs segment is a contiguous run of the flattened parameter, so a launch takes
all segments of a group that share a parameter dtype, a block length L (a compile-time constant,
so loads vectorise) and a state dtype:

* L <= tile / 2 (rows of 1024, norms, biases): ``_adam_mini_rows_kernel``, one pass. A program
  holds ROWS >= 2 whole blocks (ROWS * next_pow2(L) <= tile elements) in registers: it reads g,
  reduces mean(g^2) per block, updates vmean, then reads p and m and writes them. 20 bytes per
  parameter in fp32 (read p, g, m; write p, m).
* L > tile / 2: ``_adam_mini_block_kernel``, one program per block. L <= tile (MLP
  down-projection rows) is one pass as above; longer blocks (attention heads) take two passes in
  tile-element chunks (the first reads g for the mean, the second updates), so g is read twice:
  24 bytes per parameter.
* Step counters: one tiny launch per step() increments every counter first; the update kernels
  only read them. No program writes anything another program reads.

State dtypes. ``fp32``: m in fp32. ``bf16``: m in bf16 (round to nearest). ``fp8``: m in
float8_e4m3fn with one fp32 scale per *scale block* = the Adam-mini block when it fits one
program (a row, a norm), or each FP8_SCALE_BLOCK-element chunk of a longer block (a head); the
scale is amax(|m|) / 448 of that scale block at the step it is written, so the largest element
maps to e4m3's largest finite value; m is stored as e4m3(m * (1 / scale)) (one division per scale
block, not per element). On the GPU the cast itself rounds to nearest even and saturates
(cvt.rn.satfinite); in the Triton interpreter, whose fp32->fp8 cast mis-rounds across binade
boundaries, the rounding is done first in fp32 arithmetic (``_round_to_e4m3``), so both give the
same bits as torch's cast. vmean is always fp32. The update of a step uses the unrounded new m;
only the stored m is rounded.

Telemetry. Each program writes max|update| and max|m| of its elements to a small device buffer
every step (no host sync); ``AdamMini.telemetry()`` reduces them per parameter on demand.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_utils import TABLE_STRIDE, TABLE_STRIDE_C, _aligned
from ..adamw.kernels import bias_corrections
from .reference import E4M3_MAX

# How m is stored (a kernel's M_KIND).
M_FP32, M_BF16, M_FP8 = 0, 1, 2
# Globals read inside @triton.jit functions must be tl.constexpr objects (compiled Triton refuses others).
_M_FP8_C = tl.constexpr(M_FP8)
E4M3_MAX_C = tl.constexpr(E4M3_MAX)
# Columns of a launch-table row (one per tensor, TABLE_STRIDE int64 = one 64-byte line).
_P, _G, _M, _SCALE, _VMEAN, _STEP, _NBLOCKS, _FIRST = (tl.constexpr(i) for i in range(TABLE_STRIDE))


@triton.jit
def _mini_scalars(step_ptr, log_beta1_bits, log_beta2_bits, INV_BC2_FP64: tl.constexpr):
    """From this step's t (already incremented on the device): 1/(1-beta1^t) and
    1/sqrt(1-beta2^t) as fp32, computed in fp64 as the official code does on the host."""
    t = tl.load(step_ptr).to(tl.float64)
    bias_correction1, inv_bc2_sqrt = bias_corrections(t, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
    return (1.0 / bias_correction1).to(tl.float32), inv_bc2_sqrt


@triton.jit
def _round_to_e4m3(x):
    """Round fp32 to the nearest float8_e4m3fn value (ties to even), kept in fp32, clamped to
    +-448. Exponent from the bits; the quotient by the grid spacing has magnitude < 16, so adding
    and subtracting 1.5 * 2^23 rounds it to an integer in round-to-nearest-even arithmetic.
    Used in the interpreter only, whose own fp32->fp8 cast mis-rounds across binade boundaries;
    the GPU's cast (cvt.rn.satfinite) rounds the same way in one instruction per two values."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)  # e4m3 subnormals share the spacing of the lowest binade
    spacing = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_spacing = ((127 - (exponent - 3)) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23
    rounded = ((x * inv_spacing + magic) - magic) * spacing  # both scalings are exact powers of two
    # keep the sign of values that round to zero (-0.0), as a cast would
    rounded = (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)
    rounded = tl.maximum(rounded, -E4M3_MAX_C, propagate_nan=tl.PropagateNan.ALL)
    return tl.minimum(rounded, E4M3_MAX_C, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _load_f32(ptr, mask):
    """Load as fp32; ``mask`` None (a full block) keeps the access unpredicated.
    if / else rather than an early return: the compiler (unlike the interpreter) still generates
    the statements after a return inside a compile-time ``if``, and ``other`` without a mask is
    an error there."""
    if mask is None:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=mask, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _load_m(m_ptr, scale, mask, M_KIND: tl.constexpr):
    m = _load_f32(m_ptr, mask)
    if M_KIND == _M_FP8_C:
        m = m * scale
    return m


@triton.jit
def _store_m(m_ptr, m, mask, M_KIND: tl.constexpr, REDUCE_AXIS: tl.constexpr, EMULATE_E4M3: tl.constexpr):
    """Stores m in its state dtype; for fp8 returns the scale(s) used (amax / 448 along
    REDUCE_AXIS), else 1.0. fp8: q = m * (1 / scale), one division per scale block."""
    if M_KIND == _M_FP8_C:
        if mask is None:
            amax = tl.max(tl.abs(m), axis=REDUCE_AXIS)
        else:
            amax = tl.max(tl.where(mask, tl.abs(m), 0.0), axis=REDUCE_AXIS)
        scale = tl.where(amax > 0.0, amax / E4M3_MAX_C, 1.0)
        inv_scale = tl.div_rn(1.0, scale)
        if REDUCE_AXIS == 1:
            q = m * inv_scale[:, None]
        else:
            q = m * inv_scale
        if EMULATE_E4M3:
            q = _round_to_e4m3(q)
        tl.store(m_ptr, q.to(tl.float8e4nv), mask=mask)
    else:
        scale = 1.0
        tl.store(m_ptr, m.to(m_ptr.dtype.element_ty), mask=mask)
    return scale


@triton.jit
def _tensor_entry(table_ptr, n_tensors, ALIGNED: tl.constexpr, DTYPE: tl.constexpr, M_DTYPE: tl.constexpr):
    """This program's index within its tensor and the tensor's pointers, from the launch table
    (one 64-byte row per tensor: param, grad, m, m scale, vmean, step, n_blocks, first program)."""
    pid = tl.program_id(0)
    tensor = tl.load(table_ptr + TABLE_STRIDE_C * n_tensors + pid)
    row = table_ptr + tensor * TABLE_STRIDE_C
    p_ptr = _aligned(tl.load(row + _P), tl.pointer_type(DTYPE), ALIGNED)
    g_ptr = _aligned(tl.load(row + _G), tl.pointer_type(DTYPE), ALIGNED)
    m_ptr = _aligned(tl.load(row + _M), tl.pointer_type(M_DTYPE), ALIGNED)
    scale_ptr = tl.load(row + _SCALE).to(tl.pointer_type(tl.float32))
    vmean_ptr = tl.load(row + _VMEAN).to(tl.pointer_type(tl.float32))
    step_ptr = tl.load(row + _STEP).to(tl.pointer_type(tl.float32))
    n_blocks = tl.load(row + _NBLOCKS)
    first_program = tl.load(row + _FIRST)
    return pid - first_program, p_ptr, g_ptr, m_ptr, scale_ptr, vmean_ptr, step_ptr, n_blocks


@triton.jit
def _adam_mini_rows_kernel(
    table_ptr,  # int64 [TABLE_STRIDE per tensor | n_programs tensor ids]
    telemetry_ptr,  # fp32 [2, n_programs]: max|update|, max|m| of each program
    clip_ptr,  # fp32 0-d gradient scale of a fused clip (kernelbench.optim.grad_norm), read with HAS_CLIP
    n_tensors, n_programs,
    lr, decay, lerp_weight, beta2, sq_weight, eps,  # fp32, rounded on the host as torch would
    log_beta1_bits, log_beta2_bits,  # int64: fp64 bit patterns
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr,
    BLOCK_LEN: tl.constexpr,  # elements per Adam-mini block (shared by every tensor of the launch)
    COLS: tl.constexpr,  # BLOCK_LEN rounded up to a power of two
    ROWS: tl.constexpr,  # blocks per program, >= 2 (one block per program goes to the block kernel)
    ALIGNED: tl.constexpr, INV_BC2_FP64: tl.constexpr, EMULATE_E4M3: tl.constexpr,
    HAS_CLIP: tl.constexpr = False,  # compile-time, so the unclipped kernel is unchanged
):
    local, p_ptr, g_ptr, m_ptr, scale_ptr, vmean_ptr, step_ptr, n_blocks = _tensor_entry(
        table_ptr, n_tensors, ALIGNED, DTYPE, M_DTYPE)
    inv_bc1, inv_bc2_sqrt = _mini_scalars(step_ptr, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)

    rows = local * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_blocks
    cols = tl.arange(0, COLS)
    offs = rows[:, None] * BLOCK_LEN + cols[None, :]
    if COLS == BLOCK_LEN:
        mask = row_mask[:, None]  # constant along a row, so loads stay vectorised
    else:
        mask = row_mask[:, None] & (cols < BLOCK_LEN)[None, :]

    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_CLIP:
        g = g * tl.load(clip_ptr)
    mean_sq = tl.sum(g * g, axis=1) * (1.0 / BLOCK_LEN)
    vmean = tl.load(vmean_ptr + rows, mask=row_mask, other=0.0)
    vmean = tl.fma(sq_weight, mean_sq, vmean * beta2)
    tl.debug_barrier()  # every warp has read the old vmean before one replaces it: see _adam_mini_block_kernel
    tl.store(vmean_ptr + rows, vmean, mask=row_mask)
    h = tl.sqrt_rn(vmean) * inv_bc2_sqrt + eps
    step_size = tl.div_rn(inv_bc1, h)

    if M_KIND == _M_FP8_C:
        old_scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)[:, None]
    else:
        old_scale = 1.0
    m = _load_m(m_ptr + offs, old_scale, mask, M_KIND)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p = p * decay
    diff = g - m
    m = tl.where(lerp_weight < 0.5, tl.fma(lerp_weight, diff, m), tl.fma(-diff, 1.0 - lerp_weight, g))
    update = (m * step_size[:, None]) * lr
    p = p - update
    tl.store(p_ptr + offs, p.to(DTYPE), mask=mask)
    scale = _store_m(m_ptr + offs, m, mask, M_KIND, 1, EMULATE_E4M3)
    if M_KIND == _M_FP8_C:
        tl.debug_barrier()  # every warp has read the old scale before one replaces it
        tl.store(scale_ptr + rows, scale, mask=row_mask)

    pid = tl.program_id(0)
    tl.store(telemetry_ptr + pid, tl.max(tl.max(tl.where(mask, tl.abs(update), 0.0), axis=1), axis=0))
    tl.store(telemetry_ptr + n_programs + pid, tl.max(tl.max(tl.where(mask, tl.abs(m), 0.0), axis=1), axis=0))


@triton.jit
def _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, mask, step_size, lr, decay, lerp_weight,
                 DTYPE: tl.constexpr, M_KIND: tl.constexpr, EMULATE_E4M3: tl.constexpr):
    """The update of one chunk of one block, g already loaded; returns |update| and |m|."""
    if M_KIND == _M_FP8_C:
        old_scale = tl.load(scale_slot)
    else:
        old_scale = 1.0
    m = _load_m(m_ptr + offs, old_scale, mask, M_KIND)
    p = _load_f32(p_ptr + offs, mask)
    p = p * decay
    diff = g - m
    m = tl.where(lerp_weight < 0.5, tl.fma(lerp_weight, diff, m), tl.fma(-diff, 1.0 - lerp_weight, g))
    update = (m * step_size) * lr
    p = p - update
    tl.store(p_ptr + offs, p.to(DTYPE), mask=mask)
    scale = _store_m(m_ptr + offs, m, mask, M_KIND, 0, EMULATE_E4M3)
    if M_KIND == _M_FP8_C:
        tl.debug_barrier()  # every warp has read the old scale before one replaces it
        tl.store(scale_slot, scale)
    abs_update = tl.abs(update)
    abs_m = tl.abs(m)
    if mask is not None:  # no early return in a compile-time if: see _load_f32
        abs_update = tl.where(mask, abs_update, 0.0)
        abs_m = tl.where(mask, abs_m, 0.0)
    return abs_update, abs_m


@triton.jit
def _adam_mini_block_kernel(
    table_ptr, telemetry_ptr, clip_ptr,  # as in _adam_mini_rows_kernel
    n_tensors, n_programs,
    lr, decay, lerp_weight, beta2, sq_weight, eps,
    log_beta1_bits, log_beta2_bits,
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr,
    BLOCK_LEN: tl.constexpr,  # elements per Adam-mini block, > CHUNK / 2
    CHUNK: tl.constexpr,  # elements per loop iteration; also the fp8 scale block of a longer block
    ALIGNED: tl.constexpr, INV_BC2_FP64: tl.constexpr, EMULATE_E4M3: tl.constexpr,
    HAS_CLIP: tl.constexpr = False,
):
    """One program per block. A block of at most CHUNK elements is one pass (g stays in
    registers); a longer one takes two (mean of g^2, then the update, reading g again).

    The barrier before each vmean store: every warp loads the block's vmean itself, and a scalar
    store is made by one thread. Without a barrier a fast warp could store the new vmean before a
    slow warp had loaded the old one; the slow warp would then apply beta2 twice and its share of
    the row (1 / num_warps of it) get a smaller update: rare (a few rows in a large launch, a
    different one each run) but real on the GPU at L = 4096, which
    tests/gpu/test_optim_adam_gpu.py::test_adam_mini_one_pass_rows_match_two_pass_on_gpu checks.
    The same holds for the fp8 scale slots."""
    block, p_ptr, g_ptr, m_ptr, scale_ptr, vmean_ptr, step_ptr, n_blocks = _tensor_entry(
        table_ptr, n_tensors, ALIGNED, DTYPE, M_DTYPE)
    inv_bc1, inv_bc2_sqrt = _mini_scalars(step_ptr, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
    clip_coef = tl.load(clip_ptr) if HAS_CLIP else 1.0
    n_chunks: tl.constexpr = (BLOCK_LEN + CHUNK - 1) // CHUNK
    base = block * BLOCK_LEN
    lanes = tl.arange(0, CHUNK)
    pid = tl.program_id(0)

    if n_chunks == 1:
        offs = base + lanes
        if BLOCK_LEN == CHUNK:
            mask = None
        else:
            mask = lanes < BLOCK_LEN
        g = _load_f32(g_ptr + offs, mask)
        if HAS_CLIP:
            g = g * clip_coef
        mean_sq = tl.sum(g * g, axis=0) * (1.0 / BLOCK_LEN)
        vmean = tl.fma(sq_weight, mean_sq, tl.load(vmean_ptr + block) * beta2)
        tl.debug_barrier()  # every warp has read the old vmean before one replaces it (see above)
        tl.store(vmean_ptr + block, vmean)
        step_size = tl.div_rn(inv_bc1, tl.sqrt_rn(vmean) * inv_bc2_sqrt + eps)
        abs_update, abs_m = _block_chunk(p_ptr, g, m_ptr, scale_ptr + block, offs, mask, step_size, lr, decay,
                                         lerp_weight, DTYPE, M_KIND, EMULATE_E4M3)
        tl.store(telemetry_ptr + pid, tl.max(abs_update, axis=0))
        tl.store(telemetry_ptr + n_programs + pid, tl.max(abs_m, axis=0))
    else:
        # Pass 1: mean of g^2 over the block.
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        for c in range(0, BLOCK_LEN, CHUNK):
            if BLOCK_LEN % CHUNK == 0:
                g = tl.load(g_ptr + base + c + lanes).to(tl.float32)
            else:
                g = tl.load(g_ptr + base + c + lanes, mask=(c + lanes) < BLOCK_LEN, other=0.0).to(tl.float32)
            if HAS_CLIP:
                g = g * clip_coef
            acc += g * g
        mean_sq = tl.sum(acc, axis=0) * (1.0 / BLOCK_LEN)
        vmean = tl.fma(sq_weight, mean_sq, tl.load(vmean_ptr + block) * beta2)
        tl.debug_barrier()  # every warp has read the old vmean before one replaces it (see above)
        tl.store(vmean_ptr + block, vmean)
        step_size = tl.div_rn(inv_bc1, tl.sqrt_rn(vmean) * inv_bc2_sqrt + eps)

        # Pass 2: the update, chunk by chunk.
        max_update = tl.zeros([CHUNK], dtype=tl.float32)
        max_m = tl.zeros([CHUNK], dtype=tl.float32)
        for c in range(0, BLOCK_LEN, CHUNK):
            offs = base + c + lanes
            scale_slot = scale_ptr + block * n_chunks + c // CHUNK
            if BLOCK_LEN % CHUNK == 0:
                g = tl.load(g_ptr + offs).to(tl.float32)
                if HAS_CLIP:
                    g = g * clip_coef
                abs_update, abs_m = _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, None, step_size, lr, decay,
                                                 lerp_weight, DTYPE, M_KIND, EMULATE_E4M3)
            else:
                mask = (c + lanes) < BLOCK_LEN
                g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                if HAS_CLIP:
                    g = g * clip_coef
                abs_update, abs_m = _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, mask, step_size, lr, decay,
                                                 lerp_weight, DTYPE, M_KIND, EMULATE_E4M3)
            max_update = tl.maximum(max_update, abs_update)
            max_m = tl.maximum(max_m, abs_m)
        tl.store(telemetry_ptr + pid, tl.max(max_update, axis=0))
        tl.store(telemetry_ptr + n_programs + pid, tl.max(max_m, axis=0))


# ---------------------------------------------------------------------------------------------
# Blocks whose statistics are reduced across ranks (FSDP2: heads and whole tensors a shard
# boundary may cut)
# ---------------------------------------------------------------------------------------------
# Under fully_shard a rank holds a run of rows of each parameter. Row and Adam blocks never cross a
# shard boundary and take the launches above on the local rows. Heads and whole-tensor blocks
# (and every block of a parameter of several segments) may: each rank holds a *piece* of such a
# block (the block's intersection with its rows, possibly empty), and the step is
#
#   partial  per piece: sum of g^2 into the block's slot; for fp8, max |m_new| per scale block
#   all-reduce the slots (sum) and the maxima (max) over the ranks holding the parameter
#   apply    per piece: vmean_new from the reduced sum, then the update of the piece; fp8 m is
#            quantised with the scale of the reduced max, so every rank uses the scale the whole
#            block would have had on one GPU
#   commit   per block, on every rank: store vmean_new and the new scales, zero the slots
#
# vmean and the fp8 scales of these blocks are replicated (every rank updates every block the same
# way), in the single-GPU layout; m is sharded like the parameter.
PIECE_STRIDE = 16
PIECE_STRIDE_C = tl.constexpr(PIECE_STRIDE)
# Columns of a piece row.
(_PC_P, _PC_G, _PC_M, _PC_SCALE, _PC_AMAX, _PC_VMEAN, _PC_SUM, _PC_STEP, _PC_OFFSET, _PC_LENGTH,
 _PC_INV_LEN) = (tl.constexpr(i) for i in range(11))
# Columns of a commit row (one per segment): vmean of its first block, its first slot, blocks,
# 1/block_len's fp32 bits, its first scale in the state, its first max slot, scales.
(_CM_VMEAN, _CM_SUM, _CM_BLOCKS, _CM_INV_LEN, _CM_SCALE, _CM_AMAX, _CM_SCALES) = (tl.constexpr(i) for i in range(7))


@triton.jit
def _piece(pieces_ptr, DTYPE: tl.constexpr, M_DTYPE: tl.constexpr):
    row = pieces_ptr + tl.program_id(0) * PIECE_STRIDE_C
    p_ptr = tl.load(row + _PC_P).to(tl.pointer_type(DTYPE))
    g_ptr = tl.load(row + _PC_G).to(tl.pointer_type(DTYPE))
    m_ptr = tl.load(row + _PC_M).to(tl.pointer_type(M_DTYPE))
    scale_ptr = tl.load(row + _PC_SCALE).to(tl.pointer_type(tl.float32))
    amax_ptr = tl.load(row + _PC_AMAX).to(tl.pointer_type(tl.float32))
    vmean_ptr = tl.load(row + _PC_VMEAN).to(tl.pointer_type(tl.float32))
    sum_ptr = tl.load(row + _PC_SUM).to(tl.pointer_type(tl.float32))
    step_ptr = tl.load(row + _PC_STEP).to(tl.pointer_type(tl.float32))
    offset = tl.load(row + _PC_OFFSET)
    length = tl.load(row + _PC_LENGTH)
    inv_len = tl.load(row + _PC_INV_LEN).to(tl.int32).to(tl.float32, bitcast=True)
    return p_ptr, g_ptr, m_ptr, scale_ptr, amax_ptr, vmean_ptr, sum_ptr, step_ptr, offset, length, inv_len


@triton.jit
def _lerp(m, g, lerp_weight):
    diff = g - m
    return tl.where(lerp_weight < 0.5, tl.fma(lerp_weight, diff, m), tl.fma(-diff, 1.0 - lerp_weight, g))


@triton.jit
def _adam_mini_partial_kernel(
    pieces_ptr,  # int64 [PIECE_STRIDE per piece]
    clip_ptr,  # fp32 0-d gradient scale of a fused clip, read with HAS_CLIP
    lerp_weight,  # fp32, 1 - beta1
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr,
    TILE: tl.constexpr,  # elements per window; the fp8 scale block of a block longer than TILE
    HAS_CLIP: tl.constexpr = False,
):
    """One program per piece: the sum of g^2 over the piece into its block's slot and, for fp8,
    max |m_new| of each scale block the piece touches into its max slot. Windows are aligned to
    the block's start, so window w is scale block w of a long block (or the only one of a short one)."""
    (p_ptr, g_ptr, m_ptr, scale_ptr, amax_ptr, vmean_ptr, sum_ptr, step_ptr, offset, length,
     inv_len) = _piece(pieces_ptr, DTYPE, M_DTYPE)
    lanes = tl.arange(0, TILE)
    acc = tl.zeros([TILE], dtype=tl.float32)
    clip_coef = tl.load(clip_ptr) if HAS_CLIP else 1.0
    for w in range(offset // TILE, (offset + length - 1) // TILE + 1):
        in_block = w * TILE + lanes
        mask = (in_block >= offset) & (in_block < offset + length)
        local = in_block - offset
        g = tl.load(g_ptr + local, mask=mask, other=0.0).to(tl.float32)
        if HAS_CLIP:
            g = g * clip_coef
        acc += g * g
        if M_KIND == _M_FP8_C:
            m = tl.load(m_ptr + local, mask=mask, other=0.0).to(tl.float32) * tl.load(scale_ptr + w)
            m = _lerp(m, g, lerp_weight)
            tl.store(amax_ptr + w, tl.max(tl.where(mask, tl.abs(m), 0.0), axis=0))
    tl.store(sum_ptr, tl.sum(acc, axis=0))


@triton.jit
def _reduced_vmean(vmean_ptr, sum_ptr, inv_len, beta2, sq_weight):
    """vmean after this step from the block's reduced sum of g^2 (the same arithmetic in apply and
    commit, so the value used is the value stored)."""
    return tl.fma(sq_weight, tl.load(sum_ptr) * inv_len, tl.load(vmean_ptr) * beta2)


@triton.jit
def _adam_mini_apply_kernel(
    pieces_ptr, telemetry_ptr,  # fp32 [2, n_pieces]: max|update|, max|m| of each piece
    clip_ptr,  # as in _adam_mini_partial_kernel
    n_pieces,
    lr, decay, lerp_weight, beta2, sq_weight, eps,  # fp32, as in _adam_mini_rows_kernel
    log_beta1_bits, log_beta2_bits,
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr, TILE: tl.constexpr,
    INV_BC2_FP64: tl.constexpr, EMULATE_E4M3: tl.constexpr,
    HAS_CLIP: tl.constexpr = False,
):
    """One program per piece: the update with the block's reduced statistics. Reads vmean and the
    old scales, writes neither (commit does, after every piece has read them)."""
    (p_ptr, g_ptr, m_ptr, scale_ptr, amax_ptr, vmean_ptr, sum_ptr, step_ptr, offset, length,
     inv_len) = _piece(pieces_ptr, DTYPE, M_DTYPE)
    inv_bc1, inv_bc2_sqrt = _mini_scalars(step_ptr, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
    vmean = _reduced_vmean(vmean_ptr, sum_ptr, inv_len, beta2, sq_weight)
    step_size = tl.div_rn(inv_bc1, tl.sqrt_rn(vmean) * inv_bc2_sqrt + eps)
    lanes = tl.arange(0, TILE)
    max_update = tl.zeros([TILE], dtype=tl.float32)
    max_m = tl.zeros([TILE], dtype=tl.float32)
    clip_coef = tl.load(clip_ptr) if HAS_CLIP else 1.0
    for w in range(offset // TILE, (offset + length - 1) // TILE + 1):
        in_block = w * TILE + lanes
        mask = (in_block >= offset) & (in_block < offset + length)
        local = in_block - offset
        g = tl.load(g_ptr + local, mask=mask, other=0.0).to(tl.float32)
        if HAS_CLIP:
            g = g * clip_coef
        m = tl.load(m_ptr + local, mask=mask, other=0.0).to(tl.float32)
        if M_KIND == _M_FP8_C:
            m = m * tl.load(scale_ptr + w)
        p = tl.load(p_ptr + local, mask=mask, other=0.0).to(tl.float32)
        p = p * decay
        m = _lerp(m, g, lerp_weight)
        update = (m * step_size) * lr
        p = p - update
        tl.store(p_ptr + local, p.to(DTYPE), mask=mask)
        if M_KIND == _M_FP8_C:
            amax = tl.load(amax_ptr + w)
            scale = tl.where(amax > 0.0, amax / E4M3_MAX_C, 1.0)
            q = m * tl.div_rn(1.0, scale)
            if EMULATE_E4M3:
                q = _round_to_e4m3(q)
            tl.store(m_ptr + local, q.to(tl.float8e4nv), mask=mask)
        else:
            tl.store(m_ptr + local, m.to(M_DTYPE), mask=mask)
        max_update = tl.maximum(max_update, tl.where(mask, tl.abs(update), 0.0))
        max_m = tl.maximum(max_m, tl.where(mask, tl.abs(m), 0.0))
    pid = tl.program_id(0)
    tl.store(telemetry_ptr + pid, tl.max(max_update, axis=0))
    tl.store(telemetry_ptr + n_pieces + pid, tl.max(max_m, axis=0))


@triton.jit
def _adam_mini_commit_kernel(
    commits_ptr,  # int64 [PIECE_STRIDE per segment]
    beta2, sq_weight,
    M_KIND: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per segment, on every rank: the new vmean of each of its blocks and the new
    scale of each of its fp8 scale blocks, from the reduced slots, which are zeroed for the next step."""
    row = commits_ptr + tl.program_id(0) * PIECE_STRIDE_C
    vmean_ptr = tl.load(row + _CM_VMEAN).to(tl.pointer_type(tl.float32))
    sum_ptr = tl.load(row + _CM_SUM).to(tl.pointer_type(tl.float32))
    n_blocks = tl.load(row + _CM_BLOCKS)
    inv_len = tl.load(row + _CM_INV_LEN).to(tl.int32).to(tl.float32, bitcast=True)
    lanes = tl.arange(0, BLOCK)
    for start in range(0, n_blocks, BLOCK):
        idx = start + lanes
        mask = idx < n_blocks
        s = tl.load(sum_ptr + idx, mask=mask, other=0.0)
        vmean = tl.fma(sq_weight, s * inv_len, tl.load(vmean_ptr + idx, mask=mask, other=0.0) * beta2)
        tl.store(vmean_ptr + idx, vmean, mask=mask)
        tl.store(sum_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=mask)
    if M_KIND == _M_FP8_C:
        scale_ptr = tl.load(row + _CM_SCALE).to(tl.pointer_type(tl.float32))
        amax_ptr = tl.load(row + _CM_AMAX).to(tl.pointer_type(tl.float32))
        n_scales = tl.load(row + _CM_SCALES)
        for start in range(0, n_scales, BLOCK):
            idx = start + lanes
            mask = idx < n_scales
            amax = tl.load(amax_ptr + idx, mask=mask, other=0.0)
            tl.store(scale_ptr + idx, tl.where(amax > 0.0, amax / E4M3_MAX_C, 1.0), mask=mask)
            tl.store(amax_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=mask)
