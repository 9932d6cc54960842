"""Adam-mini (arXiv 2406.16793) with fused Triton kernels and fp32 / bf16 / fp8 first-moment state.

Math, for each *block* B of a parameter (a row, an attention head, or the whole tensor; see the
partition below) with |B| elements and step t:

    vmean_B = beta2 * vmean_B + (1 - beta2) * mean_{i in B}(g_i^2)      (one value per block)
    p       = p * (1 - lr * wd)
    m       = lerp(m, g, 1 - beta1)
    h_B     = sqrt(vmean_B) / sqrt(1 - beta2^t) + eps
    p       = p - lr * m * ((1 / (1 - beta1^t)) / h_B)

A block of one element is Adam (used for biases, state key ``v`` as in the official code).

Partition (``adam_mini_partition``): the official adam-mini 1.1.1's by default, for every name,
from the name sets the optimizer exposes as attributes (``optimizer.wqk_names.add("c_attn")``),
read at the first step: ``adam_block_names`` (bias) -> Adam; ``wqk_names`` -> one block per head
of ``dim * dim / n_heads`` elements; ``embd_names``, ``output_names``, ``wv_names``,
``attn_proj_names``, ``mlp_names`` -> one block per row; anything else (norms, and names the
official code does not know) -> one block per tensor, or with ``fallback="structure"`` 2-D one
block per row. User ``rules`` and ``preset`` rules ("gpt2": Conv1D weights one block per output
column, fused ``c_attn`` q/k per head and v per column, ``wpe`` per row; "fused-qkv": ``qkv_proj``,
``Wqkv`` [q; k; v] and GPT-NeoX's per-head ``query_key_value``, q/k per head and v per row) are
tested first. No weight decay on names containing ``norm``, ``ln`` or ``bias`` (as the official
code). A parameter under several names (tied embeddings) has one state. ``partition_report()``
lists every decision. A parameter is one or more *segments* (a fused q/k/v weight: q heads, k
heads, v rows), each a launch-table row of its own.

Kernels. Every block of a runs segment is a contiguous run of the flattened parameter, so a
launch takes all segments of a group that share a block length L (a compile-time constant, so loads vectorise):
* L <= 2048 (rows of 1024, norms, biases): ``_adam_mini_rows_kernel``, one pass. A program holds
  ROWS >= 2 whole blocks (ROWS * next_pow2(L) <= 4096 elements) in registers: it reads g, reduces
  mean(g^2) per block, updates vmean, then reads p and m and writes them. 20 bytes per parameter
  in fp32 (read p, g, m; write p, m).
* L > 2048: ``_adam_mini_block_kernel``, one program per block. L <= 4096 (MLP down-projection
  rows) is one pass as above; longer blocks (attention heads: 65536 elements in llama-468m) take
  two passes in 4096-element chunks (the first reads g for the mean, the second updates), so g is
  read twice: 24 bytes per parameter.
* Step counters: one tiny launch per step() increments every counter first; the update kernels
  only read them. No program writes anything another program reads.

State dtypes. ``fp32``: m in fp32. ``bf16``: m in bf16 (round to nearest). ``fp8``: m in
float8_e4m3fn with one fp32 scale per *scale block* = the Adam-mini block when it fits one
program (a row, a norm), or each 4096-element chunk of a longer block (a head); the scale is
amax(|m|) / 448 of that scale block at the step it is written, so the largest element maps to
e4m3's largest finite value; m is stored as e4m3(m * (1 / scale)) (one division per scale block,
not per element). On the GPU the cast itself rounds to nearest even and saturates
(cvt.rn.satfinite); in the Triton interpreter, whose fp32->fp8 cast mis-rounds across binade
boundaries, the rounding is done first in fp32 arithmetic (``_round_to_e4m3``), so both give the
same bits as torch's cast. Adam blocks
(biases) keep m in bf16 under ``fp8``: a per-element scale would cost more than it saves. vmean
is always fp32. The update of a step uses the unrounded new m; only the stored m is rounded.
fp8 needs sm_89+ on the GPU and torch.float8_e4m3fn; otherwise the optimizer falls back to bf16
with one warning naming the reason. In the interpreter (CPU) fp8 runs as described above.

Strided segments (Conv1D columns) are stepped
by PyTorch ops, the same math per segment, m in fp32 or bf16 (bf16 under fp8 too), not by the
kernels. Parameters under ``min_8bit_size`` elements (4096) keep fp32 m under bf16 / fp8 state,
as bitsandbytes' min_8bit_size does: a norm's whole-tensor block in e4m3 saves a few hundred
bytes for a visible error.

Telemetry. Each program writes max|update| and max|m| of its elements to a small device buffer
every step (no host sync); ``telemetry()`` reduces them per parameter on demand.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from ._triton_utils import (
    check_device_supported,
    check_param_and_grad,
    f64_bits,
    interpreting,
    log_or_neg_inf,
    refuse_rebuild_while_capturing,
    upload_int64,
)
from .adam_mini_partition import (
    _WEIGHT_KINDS as _WEIGHT_ONLY,
)
from .adam_mini_partition import (
    FALLBACKS,
    OFFICIAL_NAME_SETS,
    PRESETS,
    Partition,
    Rule,
    Segment,
    block_dims,
    describe,
    partition_param,
    region,
)
from .adamw import StepIncrementer, bias_corrections, reciprocal_in_fp64

STATE_DTYPES = ("fp32", "bf16", "fp8")
# Elements one program holds in registers: 16 per thread at 8 warps (four 16-byte fp32 vectors
# per stream per thread). Unlike TritonAdamW's kernel (174 registers at 4096 / 8, one program per
# SM, hence its smaller block), these kernels compile to 40-130 registers at 4096 / 8 (Triton 3.6,
# sm_90; 254 for the Adam blocks of biases, L = 1), so several programs share an SM.
# scripts/probe_adam.py sweeps (TILE, NUM_WARPS) on the GPU. TILE is also the fp8 scale block of
# blocks longer than one tile; an optimizer reads both when it is constructed.
TILE = 4096
NUM_WARPS = 8
# Diagnostic switch (scripts/probe_adam_mini_rows.py): True sends blocks of TILE / 2 < L <= TILE
# through the two-pass path in TILE / 2 chunks instead of one pass. Read when an optimizer is
# constructed; fp32 / bf16 state only (under fp8 the chunk is the scale block).
FORCE_TWO_PASS = False
E4M3_MAX = 448.0

_WHO = "AdamMini"
_LOG = logging.getLogger(__name__)
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
_M_FP32, _M_BF16, _M_FP8 = 0, 1, 2
E4M3_MAX_C = tl.constexpr(E4M3_MAX)
# Launch table row per tensor: param, grad, m, m scale, vmean, step, n_blocks, first program
# (8 int64 = one 64-byte line).
TABLE_STRIDE = 8
TABLE_STRIDE_C = tl.constexpr(TABLE_STRIDE)
_STEP_COLUMN = 5


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
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
    if M_KIND == 2:
        m = m * scale
    return m


@triton.jit
def _store_m(m_ptr, m, mask, M_KIND: tl.constexpr, REDUCE_AXIS: tl.constexpr, EMULATE_E4M3: tl.constexpr):
    """Stores m in its state dtype; for fp8 returns the scale(s) used (amax / 448 along
    REDUCE_AXIS), else 1.0. fp8: q = m * (1 / scale), one division per scale block."""
    if M_KIND == 2:
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
def _aligned(addr, ptr_ty: tl.constexpr, ALIGNED: tl.constexpr):
    """An int64 address as a pointer; with ALIGNED, marked 16-byte aligned *after* the cast (a
    hint on the int64 does not survive int-to-pointer), so loads can be 16-byte vectors."""
    ptr = addr.to(ptr_ty)
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _tensor_entry(table_ptr, n_tensors, ALIGNED: tl.constexpr, DTYPE: tl.constexpr, M_DTYPE: tl.constexpr):
    """This program's index within its tensor and the tensor's pointers, from the launch table
    (one 64-byte row per tensor: param, grad, m, m scale, vmean, step, n_blocks, first program)."""
    pid = tl.program_id(0)
    tensor = tl.load(table_ptr + TABLE_STRIDE_C * n_tensors + pid)
    row = table_ptr + tensor * TABLE_STRIDE_C
    p_ptr = _aligned(tl.load(row + 0), tl.pointer_type(DTYPE), ALIGNED)
    g_ptr = _aligned(tl.load(row + 1), tl.pointer_type(DTYPE), ALIGNED)
    m_ptr = _aligned(tl.load(row + 2), tl.pointer_type(M_DTYPE), ALIGNED)
    scale_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    vmean_ptr = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    step_ptr = tl.load(row + 5).to(tl.pointer_type(tl.float32))
    n_blocks = tl.load(row + 6)
    first_program = tl.load(row + 7)
    return pid - first_program, p_ptr, g_ptr, m_ptr, scale_ptr, vmean_ptr, step_ptr, n_blocks


@triton.jit
def _adam_mini_rows_kernel(
    table_ptr,  # int64 [TABLE_STRIDE per tensor | n_programs tensor ids]
    telemetry_ptr,  # fp32 [2, n_programs]: max|update|, max|m| of each program
    n_tensors, n_programs,
    lr, decay, lerp_weight, beta2, sq_weight, eps,  # fp32, rounded on the host as torch would
    log_beta1_bits, log_beta2_bits,  # int64: fp64 bit patterns
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr,
    BLOCK_LEN: tl.constexpr,  # elements per Adam-mini block (shared by every tensor of the launch)
    COLS: tl.constexpr,  # BLOCK_LEN rounded up to a power of two
    ROWS: tl.constexpr,  # blocks per program, >= 2 (one block per program goes to the block kernel)
    ALIGNED: tl.constexpr, INV_BC2_FP64: tl.constexpr, EMULATE_E4M3: tl.constexpr,
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
    mean_sq = tl.sum(g * g, axis=1) * (1.0 / BLOCK_LEN)
    vmean = tl.load(vmean_ptr + rows, mask=row_mask, other=0.0)
    vmean = tl.fma(sq_weight, mean_sq, vmean * beta2)
    tl.debug_barrier()  # every warp has read the old vmean before one replaces it: see _adam_mini_block_kernel
    tl.store(vmean_ptr + rows, vmean, mask=row_mask)
    h = tl.sqrt_rn(vmean) * inv_bc2_sqrt + eps
    step_size = tl.div_rn(inv_bc1, h)

    if M_KIND == 2:
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
    if M_KIND == 2:
        tl.debug_barrier()  # every warp has read the old scale before one replaces it
        tl.store(scale_ptr + rows, scale, mask=row_mask)

    pid = tl.program_id(0)
    tl.store(telemetry_ptr + pid, tl.max(tl.max(tl.where(mask, tl.abs(update), 0.0), axis=1), axis=0))
    tl.store(telemetry_ptr + n_programs + pid, tl.max(tl.max(tl.where(mask, tl.abs(m), 0.0), axis=1), axis=0))


@triton.jit
def _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, mask, step_size, lr, decay, lerp_weight,
                 DTYPE: tl.constexpr, M_KIND: tl.constexpr, EMULATE_E4M3: tl.constexpr):
    """The update of one chunk of one block, g already loaded; returns |update| and |m|."""
    if M_KIND == 2:
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
    if M_KIND == 2:
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
    table_ptr, telemetry_ptr,  # as in _adam_mini_rows_kernel
    n_tensors, n_programs,
    lr, decay, lerp_weight, beta2, sq_weight, eps,
    log_beta1_bits, log_beta2_bits,
    DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, M_KIND: tl.constexpr,
    BLOCK_LEN: tl.constexpr,  # elements per Adam-mini block, > CHUNK / 2
    CHUNK: tl.constexpr,  # elements per loop iteration; also the fp8 scale block of a longer block
    ALIGNED: tl.constexpr, INV_BC2_FP64: tl.constexpr, EMULATE_E4M3: tl.constexpr,
):
    """One program per block. A block of at most CHUNK elements is one pass (g stays in
    registers); a longer one takes two (mean of g^2, then the update, reading g again).

    The barrier before each vmean store: every warp loads the block's vmean itself, and a scalar
    store is made by one thread. Without a barrier a fast warp could store the new vmean before a
    slow warp had loaded the old one; the slow warp then applied beta2 twice and its share of the
    row (1 / num_warps of it) got a smaller update. Seen on an H200 at L = 4096 (one warp of one
    row in ~24k programs, a different row each run). The same holds for the fp8 scale slots."""
    block, p_ptr, g_ptr, m_ptr, scale_ptr, vmean_ptr, step_ptr, n_blocks = _tensor_entry(
        table_ptr, n_tensors, ALIGNED, DTYPE, M_DTYPE)
    inv_bc1, inv_bc2_sqrt = _mini_scalars(step_ptr, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
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
                abs_update, abs_m = _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, None, step_size, lr, decay,
                                                 lerp_weight, DTYPE, M_KIND, EMULATE_E4M3)
            else:
                mask = (c + lanes) < BLOCK_LEN
                g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                abs_update, abs_m = _block_chunk(p_ptr, g, m_ptr, scale_slot, offs, mask, step_size, lr, decay,
                                                 lerp_weight, DTYPE, M_KIND, EMULATE_E4M3)
            max_update = tl.maximum(max_update, abs_update)
            max_m = tl.maximum(max_m, abs_m)
        tl.store(telemetry_ptr + pid, tl.max(max_update, axis=0))
        tl.store(telemetry_ptr + n_programs + pid, tl.max(max_m, axis=0))


# ---------------------------------------------------------------------------------------------
# References (pure PyTorch)
# ---------------------------------------------------------------------------------------------
def round_to_e4m3_ref(x: torch.Tensor) -> torch.Tensor:
    """What the kernels store for fp8: x rounded to float8_e4m3fn (nearest, ties to even),
    clamped to +-448 (torch's cast, used as the reference for _round_to_e4m3)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def adam_mini_block_ref(p, g, m, vmean, step, *, block_len, lr, beta1, beta2, eps, weight_decay,
                        state_dtype="fp32", scale_block=None):
    """One Adam-mini step of one parameter in fp32 PyTorch, with the kernels' state rounding.
    p, g: flat fp32; m: flat fp32 (dequantised); vmean: [n_blocks]; step: the new step (int).
    Returns (p, m_stored, vmean, m_new_unrounded)."""
    gb = g.view(-1, block_len)
    vmean = vmean * beta2 + (1 - beta2) * (gb * gb).mean(dim=1)
    h = vmean.sqrt() / math.sqrt(1 - beta2**step) + eps
    step_size = (1 / (1 - beta1**step)) / h
    p = p * (1 - lr * weight_decay)
    m_new = torch.lerp(m, g, 1 - beta1)
    p = p - (m_new.view(-1, block_len) * step_size[:, None]).view(-1) * lr
    if state_dtype == "bf16":
        m_stored = m_new.to(torch.bfloat16).float()
    elif state_dtype == "fp8":
        blocks = m_new.view(-1, scale_block)
        amax = blocks.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        m_stored = (round_to_e4m3_ref(blocks * (1.0 / scale)).float() * scale).view(-1)
    else:
        m_stored = m_new
    return p, m_stored, vmean, m_new


# ---------------------------------------------------------------------------------------------
# Optimizer
# ---------------------------------------------------------------------------------------------
def _scale_blocks(seg: Segment, tile: int) -> int:
    """fp8 scale slots of a runs segment: one per block, or one per tile of a longer block."""
    return seg.n_blocks * (triton.cdiv(seg.block_len, tile) if seg.block_len > tile else 1)


def _state_shapes(part: Partition, p: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of m and of vmean (``v`` for Adam) as the official code keeps them, for a parameter
    of one segment; a parameter of several segments keeps m in its own shape and one flat vmean."""
    if len(part.segments) > 1 or part.strided:
        return tuple(p.shape), (part.n_blocks,)
    seg = part.segments[0]
    if seg.kind == "adam":
        return tuple(p.shape), tuple(p.shape)
    if seg.kind == "tensor":
        return tuple(p.shape), ()
    m_shape = (seg.n_blocks, seg.block_len) if seg.kind == "head" else tuple(p.shape)
    return m_shape, (seg.n_blocks, 1)


class AdamMiniReference(torch.optim.Optimizer):
    """Pure-PyTorch Adam-mini over the same partition as ``AdamMini`` (same constructor keywords;
    fp32 state): each segment's blocks are gathered into a (n_blocks, block_len) matrix and
    stepped by ``adam_mini_block_ref``. The reference for presets the official package cannot
    express."""

    def __init__(self, named_parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 dim=2048, n_heads=32, n_kv_heads=None, rules=None, preset=None, fallback="official", **_ignored):
        presets = (preset,) if isinstance(preset, str) else tuple(preset or ())
        rules = tuple(rules or ()) + tuple(r for name in presets for r in PRESETS[name])
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        self._parts = {}
        for n, p in named:
            self._parts.setdefault(id(p), partition_param(n, p, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                                          rules=rules, fallback=fallback))
        params = list({id(p): p for _, p in named}.values())
        groups = [{"params": [p], "weight_decay": weight_decay if _decay_of(self._parts[id(p)].name, p, rules) else 0.0}
                  for p in params]
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @staticmethod
    def _as_blocks(x: torch.Tensor, seg: Segment) -> torch.Tensor:
        r = region(x, seg)
        if not seg.strided:
            return r.reshape(seg.n_blocks, seg.block_len)
        kept = [d for d in range(r.dim()) if d not in seg.reduce]
        return r.permute(*kept, *seg.reduce).reshape(seg.n_blocks, seg.block_len)

    @staticmethod
    def _put_blocks(x: torch.Tensor, seg: Segment, blocks: torch.Tensor) -> None:
        r = region(x, seg)
        if not seg.strided:
            r.copy_(blocks.view(r.shape))
            return
        kept = [d for d in range(r.dim()) if d not in seg.reduce]
        order = kept + list(seg.reduce)
        r.permute(*order).copy_(blocks.view([r.shape[d] for d in order]))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            p = group["params"][0]
            if p.grad is None:
                continue
            part = self._parts[id(p)]
            state = self.state[p]
            if not state:
                m_shape, v_shape = _state_shapes(part, p)
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["m"] = torch.zeros(m_shape, dtype=torch.float32, device=p.device)
                state["v" if part.kind == "adam" else "vmean"] = torch.zeros(v_shape, dtype=torch.float32,
                                                                             device=p.device)
            state["step"] += 1
            step = int(state["step"].item())
            vmean_flat = (state["v"] if "v" in state else state["vmean"]).view(-1)
            m_full = state["m"].view(p.shape)
            beta1, beta2 = group["betas"]
            for seg in part.segments:
                vm = vmean_flat[seg.block_offset:seg.block_offset + seg.n_blocks]
                new_p, new_m, new_v, _ = adam_mini_block_ref(
                    self._as_blocks(p, seg).float().reshape(-1), self._as_blocks(p.grad, seg).float().reshape(-1),
                    self._as_blocks(m_full, seg).reshape(-1), vm, step, block_len=seg.block_len, lr=group["lr"],
                    beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
                self._put_blocks(p, seg, new_p.view(seg.n_blocks, seg.block_len).to(p.dtype))
                self._put_blocks(m_full, seg, new_m.view(seg.n_blocks, seg.block_len))
                vm.copy_(new_v)


class _LaunchPlan:
    """Table, telemetry buffer and launch arguments of one launch: segments of one group's
    parameters that share a dtype, a block length and a state dtype."""

    table_stride = TABLE_STRIDE
    step_column = _STEP_COLUMN

    def __init__(self, key: tuple, params: list[torch.Tensor], grads: list[torch.Tensor], states: list[dict],
                 segments: list[Segment], scale_offsets: list[int], m_kind: int, tile: int) -> None:
        device = params[0].device
        block_len = segments[0].block_len
        self.key = key
        self.block_len = block_len
        self.cols = triton.next_power_of_2(block_len)
        self.rows = max(1, tile // self.cols)
        self.per_block = self.rows == 1  # one program per block: _adam_mini_block_kernel
        self.m_kind = m_kind
        table: list[int] = []
        program_tensor: list[int] = []
        vector_addresses = []
        self.program_ranges = []
        for i, (p, g, s, seg, scale_offset) in enumerate(zip(params, grads, states, segments, scale_offsets)):
            m = s["m_fp8"] if m_kind == _M_FP8 else s["m"]
            vmean = s["v"] if "v" in s else s["vmean"]
            if m_kind == _M_FP8:
                scale_addr = s["m_scale"].data_ptr() + 4 * scale_offset
            else:
                scale_addr = s["step"].data_ptr()  # any valid address when unused
            programs = seg.n_blocks if self.per_block else triton.cdiv(seg.n_blocks, self.rows)
            p_addr = p.data_ptr() + seg.start * p.element_size()
            g_addr = g.data_ptr() + seg.start * g.element_size()
            m_addr = m.data_ptr() + seg.start * m.element_size()
            vector_addresses += [p_addr, g_addr, m_addr]
            table += [p_addr, g_addr, m_addr, scale_addr, vmean.data_ptr() + 4 * seg.block_offset,
                      s["step"].data_ptr(), seg.n_blocks, len(program_tensor)]
            self.program_ranges.append((len(program_tensor), len(program_tensor) + programs))
            program_tensor.extend([i] * programs)
        self.params = params
        self.n_tensors = len(params)
        self.n_programs = len(program_tensor)
        self.step_addresses = [s["step"].data_ptr() for s in states]
        self.aligned = all(a % 16 == 0 for a in vector_addresses)
        self.table = upload_int64(table + program_tensor, device)
        self.telemetry = torch.zeros(2, self.n_programs, dtype=torch.float32, device=device)
        self.grid = (self.n_programs,)
        self.scalars_key: tuple | None = None  # the group's hyperparameters that scalars were made from
        self.scalars: tuple = ()


class _StepTable:
    """Every step counter of one step's launches, each once (a parameter of several segments
    sits in several table rows but has one counter): what StepIncrementer takes for one plan."""

    table_stride = 1
    step_column = 0

    def __init__(self, plans: Sequence[_LaunchPlan]) -> None:
        addresses = list(dict.fromkeys(a for plan in plans for a in plan.step_addresses))
        self.plans = tuple(plans)
        self.step_addresses = addresses
        self.n_tensors = len(addresses)
        self.table = upload_int64(addresses, plans[0].table.device)


class _NameSet(set):
    """One of the official name sets: a plain set of substrings that refuses to change once the
    partition it was read into is in use (after the first step)."""

    def __init__(self, items: Iterable[str], owner: AdamMini, attr: str) -> None:
        super().__init__(items)
        self._owner, self._attr = owner, attr

    def __reduce__(self):
        return (set, (list(self),))


def _guarded(method_name: str):
    method = getattr(set, method_name)

    def wrapper(self, *args, **kwargs):
        self._owner._name_sets_changing(self._attr)
        return method(self, *args, **kwargs)

    wrapper.__name__ = method_name
    return wrapper


for _method in ("add", "discard", "remove", "pop", "clear", "update", "difference_update", "intersection_update",
                "symmetric_difference_update", "__ior__", "__iand__", "__isub__", "__ixor__"):
    setattr(_NameSet, _method, _guarded(_method))


def _name_set_property(attr: str) -> property:
    def get(self: AdamMini) -> set:
        return self._name_sets[attr]

    def set_(self: AdamMini, value: Iterable[str]) -> None:
        if isinstance(value, str):
            raise TypeError(f"{_WHO}: {attr} must be a set of name substrings, got the string {value!r}; "
                            f"use optimizer.{attr}.add({value!r}).")
        self._name_sets_changing(attr)
        self._name_sets[attr] = _NameSet(value, self, attr)

    return property(get, set_, doc=f"The official {attr}: substrings of lower-cased parameter names.")


class AdamMini(torch.optim.Optimizer):
    """Adam-mini with the official 1.1.1 constructor, name sets and partition, fused Triton
    kernels, and a choice of first-moment state dtype.

    ``named_parameters``: an iterable of (name, parameter), e.g. ``model.named_parameters()``.
    Parameters are put into two param groups, ``decay`` and ``no_decay`` (each with lr, betas,
    eps, weight_decay, so LR schedulers work). Parameters and gradients must be contiguous
    (blocks are runs of the flattened tensor); anything else is a clear error. One parameter
    object under several names (tied embeddings and output head) has one state; names that would
    give it different partitions are an error.

    The official name sets are attributes (``embd_names``, ``output_names``, ``wqk_names``,
    ``wv_names``, ``attn_proj_names``, ``mlp_names``, ``adam_block_names``), read when the
    partition is built at the first ``step()``; changing one afterwards raises. ``rules`` and
    ``preset`` ("gpt2", "fused-qkv", or several) add rules tested before the name sets;
    ``fallback`` decides names that match nothing ("official": one block per tensor;
    "structure": 2-D one block per row). Parameters under ``min_8bit_size`` elements keep fp32 m
    under bf16 / fp8 state. ``verbose``: a one-line summary through ``logging`` (logger
    ``kernelbench.optim.adam_mini``) and warnings about names that matched nothing.

    State per parameter: ``step`` (0-d fp32 on the device), ``vmean`` (``v`` for Adam blocks),
    and ``m`` (fp32 / bf16; the official shapes: (n_heads, head_numel) for q/k) or, for fp8,
    ``m_fp8`` plus ``m_scale`` (one fp32 per scale block).
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        model_sharding: bool | None = None,
        dim: int = 2048,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        verbose: bool = True,
        state_dtype: str = "fp32",
        rules: Sequence[Rule] | None = None,
        preset: str | Sequence[str] | None = None,
        fallback: str = "official",
        min_8bit_size: int = 4096,
    ) -> None:
        if isinstance(lr, torch.Tensor):
            raise TypeError(f"{_WHO}: lr must be a Python float, got a Tensor.")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid betas: {betas}; each must be in [0, 1).")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if n_kv_heads is not None and (n_kv_heads <= 0 or n_heads % n_kv_heads != 0):
            raise ValueError(f"{_WHO}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}).")
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"{_WHO}: state_dtype {state_dtype!r} is not one of {', '.join(STATE_DTYPES)}.")
        if fallback not in FALLBACKS:
            raise ValueError(f"{_WHO}: fallback {fallback!r} is not one of {', '.join(FALLBACKS)}.")
        if not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"{_WHO}: min_8bit_size must be an int >= 0, got {min_8bit_size!r}.")
        presets = (preset,) if isinstance(preset, str) else tuple(preset or ())
        for name in presets:
            if name not in PRESETS:
                raise ValueError(f"{_WHO}: preset {name!r} is not one of {', '.join(PRESETS)}.")
        if model_sharding is not None and verbose:
            warnings.warn(f"{_WHO}: model_sharding is deprecated in adam-mini (since 1.0.2) and ignored here.",
                          DeprecationWarning, stacklevel=2)
        self.dim, self.n_heads = dim, n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.verbose, self.fallback, self.min_8bit_size = verbose, fallback, min_8bit_size
        self.presets = presets
        self.rules = tuple(rules or ()) + tuple(r for name in presets for r in PRESETS[name])
        self._name_sets = {attr: _NameSet(items, self, attr) for attr, items in OFFICIAL_NAME_SETS.items()}
        self._frozen = False
        named = list(named_parameters)
        if not named or not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                                for item in named):
            raise TypeError(f"{_WHO}: named_parameters must be a non-empty iterable of (name, parameter) "
                            "pairs, e.g. model.named_parameters().")
        # one entry per parameter object, with every name it was given
        self._all_names: dict[int, list[str]] = {}
        unique: list[torch.Tensor] = []
        for n, p in named:
            if not p.requires_grad:
                continue
            if id(p) not in self._all_names:
                self._all_names[id(p)] = []
                unique.append(p)
            self._all_names[id(p)].append(n)
        if not unique:
            raise ValueError(f"{_WHO}: no parameter requires grad.")
        self._names = {id(p): names[0] for p in unique for names in [self._all_names[id(p)]]}
        decays = {}
        for p in unique:
            decays[id(p)] = {_decay_of(n, p, self.rules) for n in self._all_names[id(p)]}
            if len(decays[id(p)]) > 1:
                raise ValueError(f"{_WHO}: one parameter is named {' and '.join(map(repr, self._all_names[id(p)]))}, "
                                 "which get different weight decay; give the names one rule or pass it once.")
        groups = []
        for group_name, decayed in (("decay", True), ("no_decay", False)):
            params = [p for p in unique if decays[id(p)] == {decayed}]
            if params:
                groups.append({"params": params, "name": group_name,
                               "weight_decay": weight_decay if decayed else 0.0})
        super().__init__(groups, dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])), eps=eps,
                                      weight_decay=weight_decay))
        device = unique[0].device
        self.state_dtype = _resolve_state_dtype(state_dtype, device)
        self._plans: dict[tuple, _LaunchPlan] = {}
        self._step_table: _StepTable | None = None
        self._tile, self._num_warps = TILE, NUM_WARPS  # fixed for this optimizer's life (fp8 scale blocks)
        if FORCE_TWO_PASS and self.state_dtype == "fp8":
            raise ValueError(f"{_WHO}: FORCE_TWO_PASS is for fp32 / bf16 state only (fp8 scale blocks are TILE long).")
        self._force_two_pass = FORCE_TWO_PASS
        self._increment_steps = StepIncrementer()
        self._parts: dict[int, Partition] | None = None

    embd_names = _name_set_property("embd_names")
    output_names = _name_set_property("output_names")
    wqk_names = _name_set_property("wqk_names")
    wv_names = _name_set_property("wv_names")
    attn_proj_names = _name_set_property("attn_proj_names")
    mlp_names = _name_set_property("mlp_names")
    adam_block_names = _name_set_property("adam_block_names")

    # -- partition ------------------------------------------------------------------------------
    def _name_sets_changing(self, attr: str) -> None:
        if self._frozen:
            raise RuntimeError(f"{_WHO}: {attr} changed after the first step(); the partition was built from the "
                               "name sets then and the state has its shapes. Change name sets before the first "
                               "step, or build a new optimizer.")
        self._parts = None

    def _partition(self) -> dict[int, Partition]:
        """Every parameter's partition from the current name sets and rules (cached until a set
        changes)."""
        if self._parts is not None:
            return self._parts
        parts = {}
        for group in self.param_groups:
            for p in group["params"]:
                names = self._all_names[id(p)]
                candidates = [partition_param(n, p, dim=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                                              rules=self.rules, name_sets=self._name_sets, fallback=self.fallback)
                              for n in names]
                for other in candidates[1:]:
                    if not candidates[0].same_layout(other):
                        raise ValueError(
                            f"{_WHO}: one parameter is named {candidates[0].name!r} ({describe(candidates[0])}) "
                            f"and {other.name!r} ({describe(other)}); a shared parameter has one state, so both "
                            "names must give the same partition (add a rule for one of them, or pass it once).")
                part = candidates[0]
                parts[id(p)] = Partition(part.name, part.kind, part.segments, part.weight_decay, part.reason,
                                         tuple(names))
        self._parts = parts
        return parts

    def _m_dtype_name(self, part: Partition, p: torch.Tensor) -> str:
        if self.state_dtype == "fp32" or p.numel() < self.min_8bit_size:
            return "fp32"
        if self.state_dtype == "fp8" and (part.kind == "adam" or part.strided):
            return "bf16"
        return self.state_dtype

    def _build_partition(self) -> None:
        """At the first step: fixes the partition, the launch keys and says what was found."""
        parts = self._partition()
        self._frozen = True
        self._entries: dict[int, list[tuple[tuple, int]] | None] = {}
        for group in self.param_groups:
            for p in group["params"]:
                part = parts[id(p)]
                m_dtype = self._m_dtype_name(part, p)
                self._entries[id(p)] = None if part.strided else [
                    ((seg.block_len, m_dtype), i) for i, seg in enumerate(part.segments)]
        if self.verbose:
            self._say_what_was_found(parts)

    def _say_what_was_found(self, parts: dict[int, Partition]) -> None:
        counts = {attr: 0 for attr in ("embd_names", "output_names", "wqk_names", "wv_names", "attn_proj_names",
                                       "mlp_names")}
        for part in parts.values():
            lname = part.name.lower()
            if "bias" in lname:
                continue
            for attr in counts:
                counts[attr] += any(n in lname for n in self._name_sets[attr])
        labels = {"embd_names": "embedding layers", "output_names": "output layers", "wqk_names": "queries and keys",
                  "wv_names": "values", "attn_proj_names": "attn_proj", "mlp_names": "MLPs"}
        _LOG.info("%s found %s; state %s", _WHO, ", ".join(f"{counts[a]} {labels[a]}" for a in counts),
                  self.state_dtype)
        missing = [a for a, c in counts.items() if c == 0]
        if missing:
            _LOG.warning("%s: no parameter name matched %s; if this is a Transformer, add the names of those layers "
                         "before the first step, e.g. optimizer.%s.add('<part of their name>').", _WHO, ", ".join(missing),
                         missing[0])
        ranks = {id(p): p.dim() for group in self.param_groups for p in group["params"]}
        unmatched = [part.name for p_id, part in parts.items()
                     if part.reason.startswith("unrecognised name") and part.kind == "tensor" and ranks[p_id] == 2]
        if unmatched and self.fallback == "official":
            shown = ", ".join(unmatched[:8]) + (f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else "")
            warnings.warn(f"{_WHO}: {len(unmatched)} 2-D parameters matched no name set and got one block per "
                          f"tensor, as official adam-mini does: {shown}. To change that, add their names to a name "
                          "set (optimizer.mlp_names.add('c_fc')) before the first step, pass rules=[Rule(...)] or "
                          "preset='gpt2', or fallback='structure' (2-D: one block per row).", UserWarning, stacklevel=4)

    # -- reports --------------------------------------------------------------------------------
    def partition_report(self) -> list[dict[str, Any]]:
        """One row per parameter: name (and every other name it was given), shape, kind, block
        length (0 when segments differ), number of blocks, the blocks in words, weight decay, m
        dtype (fp32 under ``min_8bit_size`` elements), whether a PyTorch path steps it (strided
        blocks), and the reason for the partition."""
        parts = self._partition()
        rows = []
        for group in self.param_groups:
            for p in group["params"]:
                part = parts[id(p)]
                m_dtype = self._m_dtype_name(part, p)
                reason = part.reason
                if m_dtype == "fp32" and self.state_dtype != "fp32":
                    reason += f"; {p.numel()} < min_8bit_size {self.min_8bit_size} elements: fp32 m"
                rows.append(dict(name=part.name, names=part.names, shape=tuple(p.shape), kind=part.kind,
                                 block_len=part.block_len, n_blocks=part.n_blocks, blocks=describe(part),
                                 weight_decay=group["weight_decay"], m_dtype=m_dtype,
                                 path="pytorch" if part.strided else "triton", reason=reason))
        return rows

    def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per parameter stepped by the kernels, from the last step: max |update| and max |m|
        (0-d device tensors, no sync here), the m state dtype, and for fp8 the largest and
        smallest scale."""
        report: dict[str, dict[str, Any]] = {}
        parts = self._partition()
        for plan in self._plans.values():
            for p, (start, end) in zip(plan.params, plan.program_ranges):
                part = parts[id(p)]
                max_update = plan.telemetry[0, start:end].amax()
                max_m = plan.telemetry[1, start:end].amax()
                entry = report.get(part.name)
                if entry is not None:  # another segment of the same parameter
                    entry["max_update"] = torch.maximum(entry["max_update"], max_update)
                    entry["max_m"] = torch.maximum(entry["max_m"], max_m)
                    continue
                entry = {"max_update": max_update, "max_m": max_m, "state_dtype": self._m_dtype_name(part, p)}
                if "m_scale" in self.state[p]:
                    entry["scale_max"] = self.state[p]["m_scale"].amax()
                    entry["scale_min"] = self.state[p]["m_scale"].amin()
                report[part.name] = entry
        return report

    # -- state ----------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        """The base class casts every floating state tensor to its parameter's dtype; Adam-mini's
        state keeps its own dtypes (fp8 / bf16 m, fp32 vmean), so they are restored here."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            for key, value in saved.items():
                if isinstance(value, torch.Tensor):
                    self.state[p][key] = value.to(device=p.device, copy=True)
            self.state[p]["step"] = torch.as_tensor(saved["step"], dtype=torch.float32).reshape(()).to(p.device).clone()
        self._plans.clear()
        self._step_table = None

    def _init_state(self, p: torch.Tensor, part: Partition) -> dict:
        state = self.state[p]
        if state:
            return state
        device = p.device
        state["step"] = torch.zeros((), dtype=torch.float32, device=device)
        m_shape, v_shape = _state_shapes(part, p)
        m_dtype = self._m_dtype_name(part, p)
        if m_dtype == "fp8":
            scale_blocks = sum(_scale_blocks(seg, self._tile) for seg in part.segments)
            state["m_fp8"] = torch.zeros(m_shape, dtype=torch.float8_e4m3fn, device=device)
            state["m_scale"] = torch.ones(scale_blocks, dtype=torch.float32, device=device)
        else:
            state["m"] = torch.zeros(m_shape, dtype=torch.float32 if m_dtype == "fp32" else torch.bfloat16,
                                     device=device)
        state["v" if part.kind == "adam" else "vmean"] = torch.zeros(v_shape, dtype=torch.float32, device=device)
        return state

    # -- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._frozen:
            self._build_partition()
        launches, by_torch = [], []
        entries_of = self._entries
        for index, group in enumerate(self.param_groups):
            by_launch: dict[tuple, tuple[list[torch.Tensor], list[int]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                entries = entries_of[id(p)]
                if entries is None:
                    by_torch.append((p, group))
                    continue
                for key, segment in entries:
                    members = by_launch.get((p.dtype, key))
                    if members is None:
                        members = by_launch[(p.dtype, key)] = ([], [])
                    members[0].append(p)
                    members[1].append(segment)
            for (dtype, (block_len, m_dtype)), (params, segments) in by_launch.items():
                launches.append((self._plan(index, dtype, block_len, m_dtype, params, segments), group, dtype))
        if launches:
            plans = [plan for plan, _, _ in launches]
            table = self._step_table
            if table is None or len(table.plans) != len(plans) or any(a is not b for a, b in zip(table.plans, plans)):
                refuse_rebuild_while_capturing(_WHO)
                table = self._step_table = _StepTable(plans)
            self._increment_steps([table])
        for plan, group, dtype in launches:
            self._launch(plan, group, dtype)
        for p, group in by_torch:
            self._torch_step(p, group)
        return loss

    def _plan(self, index: int, dtype: torch.dtype, block_len: int, m_dtype: str, params: list[torch.Tensor],
              segments: list[int]) -> _LaunchPlan:
        grads = [p.grad for p in params]
        try:
            key = tuple(map(torch.Tensor.data_ptr, params)) + tuple(map(torch.Tensor.data_ptr, grads))
        except (RuntimeError, NotImplementedError):  # sparse grads have no data_ptr: say which one
            for p, g in zip(params, grads):
                check_param_and_grad(self._label(p), p, g, p.device, _SUPPORTED_DTYPES, _WHO)
            raise
        plan_key = (index, dtype, block_len, m_dtype)
        plan = self._plans.get(plan_key)
        if plan is None or plan.key != key:
            plan = self._plans[plan_key] = self._build_plan(key, list(zip(params, segments)), grads, m_dtype)
        return plan

    def _launch(self, plan: _LaunchPlan, group: dict, dtype: torch.dtype) -> None:
        # Hyperparameters are read every step (LR schedulers), converted only when they change.
        scalars_key = (group["lr"], group["betas"], group["eps"], group["weight_decay"])
        if plan.scalars_key != scalars_key:
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            plan.scalars = (plan.table, plan.telemetry, plan.n_tensors, plan.n_programs,
                            lr, 1.0 - lr * group["weight_decay"], 1.0 - beta1, beta2, 1.0 - beta2, group["eps"],
                            f64_bits(log_or_neg_inf(beta1)), f64_bits(log_or_neg_inf(beta2)))
            plan.constexprs = dict(
                DTYPE=_TL_DTYPE[dtype], M_DTYPE=_M_TL_DTYPE[plan.m_kind], M_KIND=plan.m_kind,
                BLOCK_LEN=plan.block_len, ALIGNED=plan.aligned, INV_BC2_FP64=reciprocal_in_fp64(plan.table.device),
                EMULATE_E4M3=interpreting(), num_warps=self._num_warps, enable_fp_fusion=False)
            if plan.per_block:
                one_pass = plan.block_len <= self._tile
                plan.constexprs["CHUNK"] = self._tile // 2 if (one_pass and self._force_two_pass) else self._tile
            else:
                plan.constexprs.update(COLS=plan.cols, ROWS=plan.rows)
            plan.scalars_key = scalars_key
        kernel = _adam_mini_block_kernel if plan.per_block else _adam_mini_rows_kernel
        kernel[plan.grid](*plan.scalars, **plan.constexprs)

    def _torch_step(self, p: torch.Tensor, group: dict) -> None:
        """Parameters with strided blocks (Conv1D columns): the same math in PyTorch ops, per
        segment, m in fp32 or bf16."""
        part = self._parts[id(p)]
        g = p.grad
        check_param_and_grad(self._label(p), p, g, p.device, _SUPPORTED_DTYPES, _WHO)
        state = self._init_state(p, part)
        state["step"].add_(1)
        beta1, beta2 = group["betas"]
        t = state["step"].double()
        inv_bc1 = (1.0 / (1.0 - torch.pow(beta1, t))).float()
        inv_bc2_sqrt = torch.rsqrt(1.0 - torch.pow(beta2, t)).float()
        lr, eps = float(group["lr"]), group["eps"]
        decay = 1.0 - lr * group["weight_decay"]
        m_full = state["m"]
        vmean_flat = state["vmean"].view(-1)
        for seg in part.segments:
            gr = region(g, seg).float()
            dims = block_dims(seg)
            mean_sq = (gr * gr).mean(dim=dims, keepdim=True)
            vmean = vmean_flat[seg.block_offset:seg.block_offset + seg.n_blocks].view(mean_sq.shape)
            vmean.mul_(beta2).add_(mean_sq, alpha=1.0 - beta2)
            step_size = inv_bc1 / (vmean.sqrt() * inv_bc2_sqrt + eps)
            pr, mr = region(p, seg), region(m_full, seg)
            m_new = torch.lerp(mr.float(), gr, 1.0 - beta1)
            pr.copy_(pr.float() * decay - (m_new * step_size) * lr)
            mr.copy_(m_new)

    def _label(self, p: torch.Tensor) -> str:
        return f"parameter '{self._names[id(p)]}' ({'x'.join(map(str, p.shape)) or 'scalar'})"

    def _build_plan(self, key: tuple, members: list[tuple[torch.Tensor, int]], grads: list[torch.Tensor],
                    m_dtype: str) -> _LaunchPlan:
        refuse_rebuild_while_capturing(_WHO)
        params = [p for p, _ in members]
        device = params[0].device
        check_device_supported(device, _WHO)
        states, segments, scale_offsets = [], [], []
        for (p, index), g in zip(members, grads):
            label = self._label(p)
            check_param_and_grad(label, p, g, device, _SUPPORTED_DTYPES, _WHO)
            if not p.is_contiguous() or not g.is_contiguous():
                raise RuntimeError(f"{_WHO}: {label} or its gradient is not contiguous; Adam-mini's blocks are runs "
                                   "of the flattened tensor, so both must be contiguous (call .contiguous()).")
            part = self._parts[id(p)]
            states.append(self._init_state(p, part))
            segments.append(part.segments[index])
            scale_offsets.append(sum(_scale_blocks(s, self._tile) for s in part.segments[:index]))
        m_kind = {"fp32": _M_FP32, "bf16": _M_BF16, "fp8": _M_FP8}[m_dtype]
        return _LaunchPlan(key, params, grads, states, segments, scale_offsets, m_kind, self._tile)


_M_TL_DTYPE = {_M_FP32: tl.float32, _M_BF16: tl.bfloat16, _M_FP8: tl.float8e4nv}


def _decay_of(name: str, param: torch.Tensor, rules: Sequence[Rule]) -> bool:
    """Weight decay by name (none on norm / ln / bias), unless the first matching rule forces it."""
    lname = name.lower()
    for rule in rules:
        if rule.contains.lower() in lname and (rule.kind not in _WEIGHT_ONLY or param.dim() == 2):
            if rule.weight_decay is not None:
                return rule.weight_decay
            break
    return not ("norm" in lname or "ln" in lname or "bias" in lname)


def _resolve_state_dtype(state_dtype: str, device: torch.device) -> str:
    """fp8 falls back to bf16, with one warning naming why, where it cannot run."""
    if state_dtype != "fp8":
        return state_dtype
    reason = None
    if not hasattr(torch, "float8_e4m3fn"):
        reason = f"this torch ({torch.__version__}) has no torch.float8_e4m3fn"
    elif device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        reason = f"the GPU is sm_{major}{minor}; fp8 (e4m3) needs sm_89 or newer"
    if reason is None:
        return "fp8"
    warnings.warn(f"{_WHO}: state_dtype='fp8' falls back to 'bf16' because {reason}.", RuntimeWarning, stacklevel=3)
    return "bf16"
