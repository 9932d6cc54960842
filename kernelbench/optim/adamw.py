"""AdamW in one Triton launch per parameter group, bitwise-equal to ``torch.optim.AdamW(foreach=False)``.

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

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from ..fast_launch import CachedLauncher
from ._sharding import check_kernel_tensor, check_like_param, is_dtensor, local_tensor, row_shard
from ._triton_utils import (
    SUPPORTED_DTYPES,
    TABLE_STRIDE,
    TABLE_STRIDE_C,
    TL_DTYPE,
    _aligned,
    check_device_supported,
    check_param_and_grad,
    check_same_layout,
    f64_bits,
    log_or_neg_inf,
    on_device,
    one_device,
    param_label,
    refuse_rebuild_while_capturing,
    upload_int64,
)
from .sharded_adamw import TORCH_ADAMW_GROUP_EXTRAS

# 1024 elements per program with 4 warps: 8 per thread, two 16-byte fp32 vectors per stream per
# thread (one for bf16); larger blocks (4096 / 8 warps) spilled to one program per SM and were
# slower on both model-370m and single-4096x1024 (results/2026-11-22-h200-ci-suite for the
# figures of the default). adamw_step_flat uses the same block.
BLOCK = 1024
NUM_WARPS = 4

# Columns of a tensor's row in the launch table (TABLE_STRIDE int64).
_P, _G, _M, _V, _VMAX, _STEP, _NUMEL, _FIRST = (tl.constexpr(i) for i in range(TABLE_STRIDE))
# Step counters one program of the increment kernel handles.
STEP_BLOCK = 1024
# Up to this many programs (8M params at BLOCK 1024) a step's single launch advances the step
# counters itself, behind one atomic ticket per program: a second launch costs as much host time
# as the whole update of a 4M-param tensor takes on the GPU, while 8192 atomics on one counter
# are spread over the kernel. Larger launches keep the separate increment launch, where
# model-370m's 362K tickets on one counter would cost more than the launch they save.
FUSED_INCREMENT_MAX_PROGRAMS = 8192

_WHO = "TritonAdamW"



# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
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
    AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
):
    p = tl.load(p_ptr, mask=mask).to(tl.float32)
    g = tl.load(g_ptr, mask=mask).to(tl.float32)
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
    lr_bits, log_beta1_bits, log_beta2_bits,  # int64: fp64 bit patterns
    decay, lerp_weight, beta2, sq_weight, eps,  # fp32
    DTYPE: tl.constexpr,  # element type of params and state
    AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
    ALIGNED: tl.constexpr,  # every address is 16-byte aligned: lets Triton emit 16-byte vector accesses
    INV_BC2_FP64: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    INCREMENT_STEPS: tl.constexpr,  # advance every step counter here (see the module docstring)
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

    start = (pid - first_program) * BLOCK_SIZE
    offs = start + tl.arange(0, BLOCK_SIZE)
    if start + BLOCK_SIZE <= numel:
        _adamw_block(p_base + offs, g_base + offs, m_base + offs, v_base + offs, vmax_base + offs, None,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, AMSGRAD, MAXIMIZE)
    else:
        _adamw_block(p_base + offs, g_base + offs, m_base + offs, v_base + offs, vmax_base + offs, offs < numel,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, AMSGRAD, MAXIMIZE)
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
    numel,
    lr_bits, log_beta1_bits, log_beta2_bits,
    decay, lerp_weight, beta2, sq_weight, eps,
    MAXIMIZE: tl.constexpr, INV_BC2_FP64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    neg_step_size, inv_bc2_sqrt = _adamw_scalars(step_ptr, lr_bits, log_beta1_bits, log_beta2_bits, INV_BC2_FP64)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if (pid + 1).to(tl.int64) * BLOCK_SIZE <= numel:
        _adamw_block(p_ptr + offs, g_ptr + offs, m_ptr + offs, v_ptr + offs, v_ptr + offs, None,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, False, MAXIMIZE)
    else:
        _adamw_block(p_ptr + offs, g_ptr + offs, m_ptr + offs, v_ptr + offs, v_ptr + offs, offs < numel,
                     decay, lerp_weight, beta2, sq_weight, eps, neg_step_size, inv_bc2_sqrt, False, MAXIMIZE)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------
_RECIPROCAL_IN_FP64: dict[str, bool] = {}


def reciprocal_in_fp64(device: torch.device) -> bool:
    """Whether torch, dividing an fp32 tensor by a Python float on ``device``, multiplies by the
    reciprocal taken in fp64 (newer ATen) rather than in fp32 (older ATen). Probed once per device
    type with a divisor for which the two differ; this is a host sync, done at construction only."""
    key = device.type
    if key not in _RECIPROCAL_IN_FP64:
        divisor = _divisor_where_reciprocals_differ()
        via_fp64 = np.float32(1.0 / divisor)
        got = (torch.ones(1, dtype=torch.float32, device=device) / divisor).cpu().numpy()[0]
        _RECIPROCAL_IN_FP64[key] = bool(got == via_fp64)
    return _RECIPROCAL_IN_FP64[key]


def _divisor_where_reciprocals_differ() -> float:
    for step in range(1, 10_000):
        x = math.sqrt(1.0 - 0.999**step)
        if np.float32(1.0 / x) != np.float32(1.0) / np.float32(x):
            return x
    raise AssertionError("no divisor found")  # unreachable: about one divisor in six differs


def _host_scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> tuple:
    """Kernel arguments in torch's precision: fp64 ones as bit patterns, fp32 ones as Python
    floats (Triton and its interpreter round them to fp32, as ATen casts scalars to opmath)."""
    return (
        f64_bits(lr), f64_bits(log_or_neg_inf(beta1)), f64_bits(log_or_neg_inf(beta2)),
        1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2, eps,
    )


def _check_lr(lr: Any) -> float:
    if isinstance(lr, torch.Tensor):
        raise TypeError(f"{_WHO}: lr must be a Python float, got a Tensor; pass float(lr) (a tensor lr would "
                        "need a host sync per step to read).")
    return float(lr)


def adamw_step_flat(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    maximize: bool = False,
) -> None:
    """One AdamW step on contiguous 1-D fp32 tensors, in place.

    ``step`` is a 0-d fp32 tensor on the same device; it is incremented first and the update uses
    the incremented value, as torch's AdamW does. Same math and rounding as TritonAdamW, so a
    sharded optimizer built on this matches torch.optim.AdamW(foreach=False) on the full tensor.
    No host synchronisation: capturable in a CUDA graph once called once outside it.
    """
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    for name, t in tensors.items():
        if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"adamw_step_flat: {name} must be a contiguous 1-D fp32 tensor, got "
                             f"{t.dtype} of shape {tuple(t.shape)} (contiguous={t.is_contiguous()}).")
        if t.device != param.device or t.numel() != param.numel():
            raise ValueError(f"adamw_step_flat: {name} has {t.numel()} elements on {t.device}; expected "
                             f"{param.numel()} on {param.device} like param.")
        check_kernel_tensor(t, name, param.device, "adamw_step_flat")
    if step.dim() != 0 or step.dtype != torch.float32 or step.device != param.device:
        raise ValueError(f"adamw_step_flat: step must be a 0-d fp32 tensor on {param.device}, got "
                         f"{step.dtype} of shape {tuple(step.shape)} on {step.device}.")
    check_device_supported(param.device, "adamw_step_flat")
    check_kernel_tensor(step, "step", param.device, "adamw_step_flat")
    if param.numel() == 0:
        return
    step.add_(1.0)
    grid = (triton.cdiv(param.numel(), BLOCK),)
    key = (grid, bool(maximize), reciprocal_in_fp64(param.device))
    launch = _FLAT_LAUNCHERS.get(key)
    if launch is None:
        launch = _FLAT_LAUNCHERS[key] = CachedLauncher(
            _adamw_flat_kernel, grid, MAXIMIZE=key[1], INV_BC2_FP64=key[2], BLOCK_SIZE=BLOCK,
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    with on_device(param.device):
        launch(param, grad, exp_avg, exp_avg_sq, step, param.numel(),
               *_host_scalars(_check_lr(lr), beta1, beta2, eps, weight_decay))


# adamw_step_flat's launchers, by (grid, maximize, reciprocal in fp64): a sharded optimizer calls
# it with the same few bucket sizes every step.
_FLAT_LAUNCHERS: dict[tuple, CachedLauncher] = {}


class StepIncrementer:
    """Increments the step counters of every launch of one optimizer step in one tiny launch.

    Each launch plan offers ``table`` (int64, one row of ``table_stride`` values per tensor, the
    step address in column ``step_column``), ``n_tensors`` and ``step_addresses``. With one plan
    its table is used as is; with several, a table of all their step addresses is built once and
    reused while the same plan objects come back."""

    def __init__(self) -> None:
        self._plans: tuple = ()
        self._table: torch.Tensor | None = None
        self._launchers: dict[int, CachedLauncher] = {}  # by number of programs

    def __call__(self, plans: list) -> None:
        if not plans:
            return
        if len(plans) == 1:
            plan = plans[0]
            table, n, stride, column = plan.table, plan.n_tensors, plan.table_stride, plan.step_column
        else:
            if len(self._plans) != len(plans) or any(a is not b for a, b in zip(self._plans, plans)):
                refuse_rebuild_while_capturing(_WHO)
                self._plans = tuple(plans)
                self._table = upload_int64([a for plan in plans for a in plan.step_addresses], plans[0].table.device)
            table, n, stride, column = self._table, self._table.numel(), 1, 0
        programs = triton.cdiv(n, STEP_BLOCK)
        launch = self._launchers.get(programs)
        if launch is None:
            launch = self._launchers[programs] = CachedLauncher(increment_steps_kernel, (programs,),
                                                                BLOCK_SIZE=STEP_BLOCK, num_warps=4)
        launch(table, n, stride, column)


class _LaunchPlan:
    """The device table of one (group, dtype) launch, and its launch arguments."""

    table_stride = TABLE_STRIDE
    step_column = _STEP.value

    def __init__(self, key: tuple, params: list[torch.Tensor], grads: list[torch.Tensor],
                 states: list[dict], amsgrad: bool) -> None:
        device = self.device = params[0].device
        self.plain = True  # every parameter a plain tensor (set by the optimizer)
        rows: list[int] = []
        program_tensor: list[int] = []
        addresses = []
        for i, (p, g, s) in enumerate(zip(params, grads, states)):
            vmax = s["max_exp_avg_sq"] if amsgrad else s["exp_avg_sq"]
            row = [t.data_ptr() for t in (p, g, s["exp_avg"], s["exp_avg_sq"], vmax, s["step"])]
            addresses += row[:_STEP]
            rows += row + [p.numel(), len(program_tensor)]
            program_tensor.extend([i] * triton.cdiv(p.numel(), BLOCK))
        self.key = key
        self.grad_ptrs = tuple(g.data_ptr() for g in grads)
        self.n_tensors = len(params)
        self.n_programs = len(program_tensor)
        self.step_addresses = [s["step"].data_ptr() for s in states]
        self.aligned = all(a % 16 == 0 for a in addresses)
        self.table = upload_int64(rows + program_tensor, device)
        self.grid = (self.n_programs,)
        # Small launches advance their own step counters (one launch per step instead of two).
        self.increments_steps = self.n_programs <= FUSED_INCREMENT_MAX_PROGRAMS
        self.ticket = torch.zeros(1, dtype=torch.int32, device=device)
        self.scalars_key: tuple | None = None  # the group's hyperparameters that scalars were made from
        self.scalars: tuple = ()
        self.launch: CachedLauncher | None = None  # for the group's current compile-time flags
        self.launchers: dict[tuple[bool, bool, bool], CachedLauncher] = {}  # by (amsgrad, maximize, increment)


    def repoint_grads(self, grad_ptrs: tuple, params: list[torch.Tensor], grads: list[torch.Tensor],
                      label: Callable[[int], str]) -> bool:
        """Point the table at new gradient tensors (a backward after ``zero_grad(set_to_none=True)``,
        torch's default, allocates them anew): only the gradient column is rewritten, not the
        table's per-program map, whose size grows with the parameter count. False when the plan
        must be rebuilt instead (a gradient that breaks the alignment the kernel was built for)."""
        if grad_ptrs == self.grad_ptrs:
            return True
        if self.aligned and any(a % 16 for a in grad_ptrs):
            return False
        refuse_rebuild_while_capturing(_WHO)
        device = params[0].device
        for i, (p, g, old, new) in enumerate(zip(params, grads, self.grad_ptrs, grad_ptrs)):
            if old != new:
                check_param_and_grad(label(i), p, g, device, SUPPORTED_DTYPES, _WHO)
        column = self.table[_G.value: self.n_tensors * TABLE_STRIDE: TABLE_STRIDE]
        column.copy_(upload_int64(grad_ptrs, device))
        self.grad_ptrs = grad_ptrs
        return True


class TritonAdamW(torch.optim.Optimizer):
    """AdamW with torch.optim.AdamW's constructor, state keys and checkpoint format.

    One Triton launch updates every parameter of a group (one per dtype when a group mixes fp32
    and bf16). fp32 results equal ``torch.optim.AdamW(foreach=False)`` bit for bit on CUDA (see
    the module docstring for the one rare exception); bf16 parameters keep bf16 state, with the
    update computed in fp32 as torch's fused AdamW does.

    DTensor parameters of ``fully_shard`` (FSDP2, sharded on dim 0) are stepped through their local
    shards, with state of the same layout (``get_optimizer_state_dict`` and DCP work as for torch's
    AdamW); the update is elementwise, so each rank's shard steps exactly as on one GPU.

    Differences from torch: ``lr`` must be a Python float (read each step, so LR schedulers
    work; it is a kernel argument, so a captured CUDA graph keeps the lr it was captured with);
    ``state['step']`` lives on the parameter's device. Parameters and gradients must be dense
    (contiguous or permuted, with equal strides); other layouts are a clear error.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        lr = _check_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # torch.optim.AdamW's group keys too, so that a checkpoint of either loads into the other
        # (DCP's loader wants every key of the destination's groups in the checkpoint).
        defaults = dict(TORCH_ADAMW_GROUP_EXTRAS, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)
        self._plans: dict[tuple[int, torch.dtype], _LaunchPlan] = {}
        self._increment_steps = StepIncrementer()
        self._labels = {id(p): param_label(None, i, p)
                        for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_labels"):
            start = len(self._labels)
            for i, p in enumerate(self.param_groups[-1]["params"]):
                self._labels.setdefault(id(p), param_label(None, start + i, p))

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads torch.optim.AdamW checkpoints too: a CPU ``step`` moves to the parameter's device."""
        super().load_state_dict(state_dict)
        for p, s in self.state.items():
            if "step" in s:
                s["step"] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(()).to(p.device).clone()
        self._plans.clear()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        launches = []
        for index, group in enumerate(self.param_groups):
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, params in by_dtype.items():
                launches.append((self._plan(index, group, dtype, params), group, dtype))
        # One small launch advances its own counters; otherwise one tiny launch advances them all.
        fused_increment = len(launches) == 1 and launches[0][0].increments_steps
        if not launches:
            return loss
        device = launches[0][0].device if len(launches) == 1 else one_device((p.device for p, _, _ in launches), _WHO)
        with on_device(device):
            if not fused_increment:
                self._increment_steps([plan for plan, _, _ in launches])
            for plan, group, dtype in launches:
                self._launch(plan, group, dtype, fused_increment)
        return loss

    def _plan(self, index: int, group: dict, dtype: torch.dtype, params: list[torch.Tensor]) -> _LaunchPlan:
        plan = self._plans.get((index, dtype))
        if plan is not None and plan.plain:  # plain tensors: their own addresses (host time of small steps)
            grads = [p.grad for p in params]
            try:
                key = tuple(map(torch.Tensor.data_ptr, params)) + (group["amsgrad"],)
                grad_ptrs = tuple(map(torch.Tensor.data_ptr, grads))
            except (RuntimeError, NotImplementedError):
                key = None
            if key == plan.key and plan.repoint_grads(grad_ptrs, params, grads, lambda i: self._labels[id(params[i])]):
                return plan
        # The kernels read local tensors: a DTensor's own data_ptr() is not its data.
        local_params = [local_tensor(p) for p in params]
        local_grads = [local_tensor(p.grad) for p in params]
        try:
            key = tuple(map(torch.Tensor.data_ptr, local_params)) + (group["amsgrad"],)
            grad_ptrs = tuple(map(torch.Tensor.data_ptr, local_grads))
        except (RuntimeError, NotImplementedError):  # sparse grads have no data_ptr: say which one
            for p, lp, g in zip(params, local_params, local_grads):
                check_param_and_grad(self._labels[id(p)], lp, g, lp.device, SUPPORTED_DTYPES, _WHO)
            raise
        if plan is not None and plan.key == key and grad_ptrs != plan.grad_ptrs:
            for p in params:
                check_like_param(self._labels[id(p)], p, p.grad, _WHO)
        if (plan is None or plan.key != key
                or not plan.repoint_grads(grad_ptrs, local_params, local_grads, lambda i: self._labels[id(params[i])])):
            plan = self._plans[(index, dtype)] = self._build_plan(key, group, params)
        return plan

    def _launch(self, plan: _LaunchPlan, group: dict, dtype: torch.dtype, increment_steps: bool) -> None:
        # Hyperparameters are read every step (LR schedulers), converted only when they change;
        # the launcher depends only on the compile-time flags, so a new lr keeps the fast launch.
        scalars_key = (group["lr"], group["betas"], group["eps"], group["weight_decay"], group["amsgrad"],
                       group["maximize"], increment_steps)
        if plan.scalars_key != scalars_key:
            lr = _check_lr(group["lr"])
            beta1, beta2 = group["betas"]
            plan.scalars = _host_scalars(lr, beta1, beta2, group["eps"], group["weight_decay"])
            flags = (bool(group["amsgrad"]), bool(group["maximize"]), increment_steps)
            plan.launch = plan.launchers.get(flags)
            if plan.launch is None:
                plan.launch = plan.launchers[flags] = CachedLauncher(
                    _adamw_group_kernel, plan.grid,
                    DTYPE=TL_DTYPE[dtype], AMSGRAD=flags[0], MAXIMIZE=flags[1], ALIGNED=plan.aligned,
                    INV_BC2_FP64=reciprocal_in_fp64(plan.table.device), BLOCK_SIZE=BLOCK, INCREMENT_STEPS=flags[2],
                    num_warps=NUM_WARPS, enable_fp_fusion=False)
            plan.scalars_key = scalars_key
        plan.launch(plan.table, plan.n_tensors, plan.ticket, *plan.scalars)

    def _build_plan(self, key: tuple, group: dict, params: list[torch.Tensor]) -> _LaunchPlan:
        refuse_rebuild_while_capturing(_WHO)
        device = params[0].device
        check_device_supported(device, _WHO)
        local_params, local_grads, states = [], [], []
        for p in params:
            label = self._labels[id(p)]
            row_shard(p, label, _WHO)  # a layout the kernels cannot step is an error here, before any launch
            check_like_param(label, p, p.grad, _WHO)
            lp, g = local_tensor(p), local_tensor(p.grad)
            check_param_and_grad(label, lp, g, device, SUPPORTED_DTYPES, _WHO)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"] and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
            local_state = {}
            for k in keys:
                check_like_param(label, p, state[k], _WHO, f"state '{k}'")
                local_state[k] = local_tensor(state[k])
                check_same_layout(label, lp, local_state[k], k, _WHO)
                if state[k].dtype != p.dtype:
                    raise RuntimeError(f"{_WHO}: state '{k}' of {label} is {state[k].dtype}, expected {p.dtype}.")
            if state["step"].device != device or state["step"].dtype != torch.float32:
                state["step"] = state["step"].to(device=device, dtype=torch.float32).reshape(())
            local_state["step"] = state["step"]
            check_kernel_tensor(state["step"], f"state 'step' of {label}", device, _WHO)
            local_params.append(lp)
            local_grads.append(g)
            states.append(local_state)
        plan = _LaunchPlan(key, local_params, local_grads, states, bool(group["amsgrad"]))
        plan.plain = not any(map(is_dtensor, params))
        return plan
