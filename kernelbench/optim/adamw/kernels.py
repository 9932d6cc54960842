"""TritonAdamW's Triton kernels: AdamW in one launch per parameter group, bitwise-equal to
``torch.optim.AdamW(foreach=False)``. Launch plans, the step-counter launch and ``adamw_step_flat``:
``host.py``.

Math (decoupled weight decay, Loshchilov & Hutter), per element, step t = state step + 1:

    g      = -grad if maximize else grad
    p      = p * (1 - lr * wd)
    m      = lerp(m, g, 1 - beta1)
    v      = v * beta2 + (1 - beta2) * g * g
    vhat   = max(vmax, v) (amsgrad, stored back in vmax) else v
    denom  = sqrt(vhat) / sqrt(1 - beta2**t) + eps
    p      = p - lr / (1 - beta1**t) * m / denom

Exactness. The kernel repeats torch's single-tensor CUDA path rounding by rounding:
``param.mul_(1-lr*wd)`` (scalar rounded to fp32), ``exp_avg.lerp_`` (weight < 0.5 ?
fma(w, g-m, m) : fma(-(g-m), 1-w, g), as nvcc contracts ATen's lerp), ``exp_avg_sq.mul_(beta2)``
then ``addcmul_`` (fma(1-beta2, g*g, v)), ``sqrt`` (IEEE), ``/ bias_correction2_sqrt`` (ATen turns
division by a CPU scalar into multiplication by its reciprocal; which precision it takes the
reciprocal in changed across torch versions, so it is probed once per device),
``.add_(eps)`` and ``addcdiv_`` (fma(-step_size, m / denom, p), IEEE division). The kernel is
compiled with ``enable_fp_fusion=False`` so that no other multiply-add is contracted, and uses
``tl.fma`` exactly where torch's kernels do.

torch computes ``beta**step`` on the host in fp64 (``pow``); here it is exp(step * log(beta)) in
fp64 on the device (log(beta) from the host). The two fp64 values differ by a few fp64 ulps at
most (relative error below 2^-42 after ``1 - beta**t`` even for beta2 = 0.999 at t = 1), and both
are rounded to fp32 before use, so the fp32 scalars agree unless an fp64 value lies within
~2^-42 of an fp32 rounding boundary (a chance of about 2^-17 per step); then ``step_size`` or
``1/bias_correction2_sqrt`` differs by one fp32 ulp for that step. That is the only place where
exact equality is not guaranteed.

Layout of a launch. For each (group, dtype) a table of int64 lives on the device: one row of
TABLE_STRIDE values per tensor (addresses of param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq and
step, its numel and first program: one 64-byte line, so a program's lookups cost one miss), then
per program its tensor. One grid covers every block of every tensor. The table is rebuilt only
when the set of tensors changes (new grads at new addresses, load_state_dict). The addresses are
cast to pointers and *then* marked 16-byte aligned (``tl.multiple_of`` on the int64 before the
cast is lost through the cast), so full blocks load and store 16-byte vectors.

Step counter. Each tensor's ``step`` is a 0-d fp32 tensor on the device (as torch's fused and
capturable AdamW keep it). A step() with one launch of at most FUSED_INCREMENT_MAX_PROGRAMS
programs advances the counters in that launch: every program reads its step and uses step + 1,
then takes a ticket from an int32 counter with an acq_rel atomic; the program that takes the
last ticket has run after every read, so it writes step + 1 for each tensor and re-arms the
ticket to 0 for the next launch. Larger or several launches make one tiny launch first that
increments every step counter (``increment_steps``), and the update kernels only read them
(hundreds of thousands of tickets on one counter cost more than the launch they save). No host
synchronisation either way, so step() can be captured in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_utils import TABLE_STRIDE, TABLE_STRIDE_C, _aligned

# Columns of a tensor's row in the launch table (TABLE_STRIDE int64).
_P, _G, _M, _V, _VMAX, _STEP, _NUMEL, _FIRST = (tl.constexpr(i) for i in range(TABLE_STRIDE))


@triton.jit
def bias_corrections(t, log_beta1_bits, log_beta2_bits, INV_BC2_FP64: tl.constexpr):
    """For step t (fp64): 1 - beta1^t in fp64, and 1/sqrt(1 - beta2^t) as fp32, computed as
    torch / the official Adam-mini do on the host (fp64, then one rounding). beta**t is
    exp(t * log(beta)) from log(beta)'s fp64 bit pattern; the final reciprocal is taken in fp64
    or fp32 as the device's ATen does (``reciprocal_in_fp64``)."""
    log_beta1 = log_beta1_bits.to(tl.int64).to(tl.float64, bitcast=True)
    log_beta2 = log_beta2_bits.to(tl.int64).to(tl.float64, bitcast=True)
    bias_correction1 = 1.0 - tl.exp(t * log_beta1)
    bias_correction2_sqrt = tl.sqrt(1.0 - tl.exp(t * log_beta2))
    if INV_BC2_FP64:
        inv_bc2_sqrt = (1.0 / bias_correction2_sqrt).to(tl.float32)
    else:
        inv_bc2_sqrt = tl.div_rn(1.0, bias_correction2_sqrt.to(tl.float32))
    return bias_correction1, inv_bc2_sqrt


@triton.jit
def _adamw_scalars(step_ptr, lr_bits, log_beta1_bits, log_beta2_bits, INV_BC2_FP64: tl.constexpr,
                   STEP_NOT_YET_INCREMENTED: tl.constexpr = False):
    """From this step's t (fp32 on the device; step + 1 when the counter is advanced after the
    update): -lr/(1-beta1^t) and 1/sqrt(1-beta2^t) as fp32, computed in fp64 as torch does on
    the host."""
    t = tl.load(step_ptr)
    if STEP_NOT_YET_INCREMENTED:
        t = t + 1.0  # in fp32, as the increment kernel would have stored it
    lr = lr_bits.to(tl.int64).to(tl.float64, bitcast=True)
    bias_correction1, inv_bc2_sqrt = bias_corrections(t.to(tl.float64), log_beta1_bits, log_beta2_bits,
                                                      INV_BC2_FP64)
    neg_step_size = (-(lr / bias_correction1)).to(tl.float32)
    return neg_step_size, inv_bc2_sqrt


@triton.jit
def increment_steps_kernel(
    table_ptr,  # int64: one row of `stride` values per tensor
    n_tensors,
    stride, column,  # where in a row the address of the tensor's 0-d fp32 step lives
    BLOCK_SIZE: tl.constexpr,
):
    """step += 1 for every tensor of the table (one launch per optimizer step, before the updates)."""
    i = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = i < n_tensors
    addrs = tl.load(table_ptr + i * stride + column, mask=mask, other=0)
    step_ptrs = addrs.to(tl.pointer_type(tl.float32))
    tl.store(step_ptrs, tl.load(step_ptrs, mask=mask) + 1.0, mask=mask)


@triton.jit
def _adamw_block(
    p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr,  # element pointers (param dtype) of this block
    mask,  # None for a full block
    decay, lerp_weight, beta2, sq_weight, eps,  # fp32 scalars rounded on the host like torch's
    neg_step_size, inv_bc2_sqrt,  # fp32 scalars of this tensor's step
    clip_coef,  # fp32 gradient scale of a fused clip (read with HAS_CLIP only)
    AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, HAS_CLIP: tl.constexpr,
):
    p = tl.load(p_ptr, mask=mask).to(tl.float32)
    g = tl.load(g_ptr, mask=mask).to(tl.float32)
    if HAS_CLIP:
        g = g * clip_coef
    m = tl.load(m_ptr, mask=mask).to(tl.float32)
    v = tl.load(v_ptr, mask=mask).to(tl.float32)
    if MAXIMIZE:
        g = -g
    p = p * decay
    diff = g - m
    m = tl.where(lerp_weight < 0.5, tl.fma(lerp_weight, diff, m), tl.fma(-diff, 1.0 - lerp_weight, g))
    v = v * beta2
    # ATen's addcmul uses fma(g, g, v) when its value is exactly 1, fma(value, g*g, v) otherwise.
    v = tl.where(sq_weight == 1.0, tl.fma(g, g, v), tl.fma(sq_weight, g * g, v))
    if AMSGRAD:
        vmax = tl.maximum(tl.load(vmax_ptr, mask=mask).to(tl.float32), v, propagate_nan=tl.PropagateNan.ALL)
        tl.store(vmax_ptr, vmax.to(vmax_ptr.dtype.element_ty), mask=mask)
        denom = tl.sqrt_rn(vmax) * inv_bc2_sqrt + eps
    else:
        denom = tl.sqrt_rn(v) * inv_bc2_sqrt + eps
    p = tl.fma(neg_step_size, tl.div_rn(m, denom), p)
    tl.store(p_ptr, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr, v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adamw_group_kernel(
    table_ptr,  # int64: [TABLE_STRIDE values per tensor | n_programs tensor ids]
    n_tensors,
    ticket_ptr,  # int32 counter, zero between launches (used with INCREMENT_STEPS)
    clip_ptr,  # fp32 0-d clip coefficient (grad_norm.py), read with HAS_CLIP only
    lr_bits, log_beta1_bits, log_beta2_bits,  # int64: fp64 bit patterns
    decay, lerp_weight, beta2, sq_weight, eps,  # fp32
    DTYPE: tl.constexpr,  # element type of params and state
    AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
    ALIGNED: tl.constexpr,  # every address is 16-byte aligned: lets Triton emit 16-byte vector accesses
    INV_BC2_FP64: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    INCREMENT_STEPS: tl.constexpr,  # advance every step counter here (see the module docstring)
    HAS_CLIP: tl.constexpr = False,  # a compile-time flag, so the unclipped kernel is unchanged
):
    pid = tl.program_id(0)
    tensor = tl.load(table_ptr + TABLE_STRIDE_C * n_tensors + pid)
    row = table_ptr + tensor * TABLE_STRIDE_C
    ptr_ty: tl.constexpr = tl.pointer_type(DTYPE)
    p_base = _aligned(tl.load(row + _P), ptr_ty, ALIGNED)
    g_base = _aligned(tl.load(row + _G), ptr_ty, ALIGNED)
    m_base = _aligned(tl.load(row + _M), ptr_ty, ALIGNED)
    v_base = _aligned(tl.load(row + _V), ptr_ty, ALIGNED)
    vmax_base = _aligned(tl.load(row + _VMAX), ptr_ty, ALIGNED)
    step_ptr = tl.load(row + _STEP).to(tl.pointer_type(tl.float32))
    numel = tl.load(row + _NUMEL)
    first_program = tl.load(row + _FIRST)

    neg_step_size, inv_bc2_sqrt = _adamw_scalars(step_ptr, lr_bits, log_beta1_bits, log_beta2_bits, INV_BC2_FP64,
                                                 INCREMENT_STEPS)

    clip_coef = tl.load(clip_ptr) if HAS_CLIP else 1.0
    start = (pid - first_program) * BLOCK_SIZE
    offs = start + tl.arange(0, BLOCK_SIZE)
    if start + BLOCK_SIZE <= numel:
        _adamw_block(p_base + offs, g_base + offs, m_base + offs, v_base + offs, vmax_base + offs, None,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, clip_coef,
                     AMSGRAD, MAXIMIZE, HAS_CLIP)
    else:
        _adamw_block(p_base + offs, g_base + offs, m_base + offs, v_base + offs, vmax_base + offs, offs < numel,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, clip_coef,
                     AMSGRAD, MAXIMIZE, HAS_CLIP)
    if INCREMENT_STEPS:
        # Every program read its step above, before this acq_rel atomic; the one that arrives last
        # therefore runs after every read and may advance all the counters, then re-arms the ticket.
        arrived = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            for i in range(n_tensors):
                counter = tl.load(table_ptr + i * TABLE_STRIDE_C + _STEP).to(tl.pointer_type(tl.float32))
                tl.store(counter, tl.load(counter) + 1.0)
            tl.atomic_xchg(ticket_ptr, 0, sem="release")


@triton.jit
def _adamw_flat_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr,  # fp32, contiguous, numel elements each
    step_ptr,  # fp32 0-d: this step's t (incremented before the launch)
    clip_ptr,  # fp32 0-d clip coefficient, read with HAS_CLIP only
    numel,
    lr_bits, log_beta1_bits, log_beta2_bits,
    decay, lerp_weight, beta2, sq_weight, eps,
    MAXIMIZE: tl.constexpr, INV_BC2_FP64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HAS_CLIP: tl.constexpr = False,
):
    pid = tl.program_id(0)
    neg_step_size, inv_bc2_sqrt = _adamw_scalars(step_ptr, lr_bits, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
    clip_coef = tl.load(clip_ptr) if HAS_CLIP else 1.0
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if (pid + 1).to(tl.int64) * BLOCK_SIZE <= numel:
        _adamw_block(p_ptr + offs, g_ptr + offs, m_ptr + offs, v_ptr + offs, v_ptr + offs, None,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, clip_coef,
                     False, MAXIMIZE, HAS_CLIP)
    else:
        _adamw_block(p_ptr + offs, g_ptr + offs, m_ptr + offs, v_ptr + offs, v_ptr + offs, offs < numel,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, clip_coef,
                     False, MAXIMIZE, HAS_CLIP)
