"""TritonAdamW's host side: launch constants, the launch plan of a (group, dtype), the step-counter
launch (``StepIncrementer``), scalar packing in torch's precision, the probe of how ATen takes
a reciprocal, and ``adamw_step_flat`` (one step of flat fp32 tensors, for sharded optimizers).
Math, exactness and the launch layout: ``kernels.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton

from ...fast_launch import CachedLauncher
from .._sharding import check_kernel_tensor
from .._triton_utils import (
    SUPPORTED_DTYPES,
    TABLE_STRIDE,
    check_device_supported,
    check_param_and_grad,
    f64_bits,
    log_or_neg_inf,
    on_device,
    refuse_rebuild_while_capturing,
    upload_int64,
)
from ..grad_norm import NormSource
from .kernels import _G, _STEP, _adamw_flat_kernel, increment_steps_kernel

# 1024 elements per program with 4 warps: 8 per thread, two 16-byte fp32 vectors per stream per
# thread (one for bf16); larger blocks (4096 / 8 warps) spilled to one program per SM and were
# slower on both model-370m and single-4096x1024 (results/2026-11-22-h200-ci-suite for the
# figures of the default). adamw_step_flat uses the same block.
BLOCK = 1024
NUM_WARPS = 4

# Step counters one program of the increment kernel handles.
STEP_BLOCK = 1024
# Up to this many programs (8M params at BLOCK 1024) a step's single launch advances the step
# counters itself, behind one atomic ticket per program: a second launch costs as much host time
# as the whole update of a 4M-param tensor takes on the GPU, while 8192 atomics on one counter
# are spread over the kernel. Larger launches keep the separate increment launch, where
# model-370m's 362K tickets on one counter would cost more than the launch they save.
FUSED_INCREMENT_MAX_PROGRAMS = 8192

_WHO = "TritonAdamW"

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
    clip_coef: torch.Tensor | None = None,
) -> None:
    """One AdamW step on contiguous 1-D fp32 tensors, in place.

    ``clip_coef``: a 0-d fp32 tensor on the same device by which the update scales ``grad`` as it
    reads it (a fused gradient clip, ``kernelbench.optim.grad_norm``); ``grad`` itself is not written.

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
    if clip_coef is not None:
        if clip_coef.dim() != 0 or clip_coef.dtype != torch.float32 or clip_coef.device != param.device:
            raise ValueError(f"adamw_step_flat: clip_coef must be a 0-d fp32 tensor on {param.device}, got "
                             f"{clip_coef.dtype} of shape {tuple(clip_coef.shape)} on {clip_coef.device}.")
        check_kernel_tensor(clip_coef, "clip_coef", param.device, "adamw_step_flat")
    if param.numel() == 0:
        return
    step.add_(1.0)
    grid = (triton.cdiv(param.numel(), BLOCK),)
    key = (grid, bool(maximize), reciprocal_in_fp64(param.device), clip_coef is not None)
    launch = _FLAT_LAUNCHERS.get(key)
    if launch is None:
        launch = _FLAT_LAUNCHERS[key] = CachedLauncher(
            _adamw_flat_kernel, grid, MAXIMIZE=key[1], INV_BC2_FP64=key[2], BLOCK_SIZE=BLOCK, HAS_CLIP=key[3],
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    with on_device(param.device):
        launch(param, grad, exp_avg, exp_avg_sq, step, step if clip_coef is None else clip_coef, param.numel(),
               *_host_scalars(_check_lr(lr), beta1, beta2, eps, weight_decay))


# adamw_step_flat's launchers, by (grid, maximize, reciprocal in fp64, clip): a sharded optimizer calls
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
        self.process_group = None  # the group a fused clip all-reduces this plan's sum of squares over
        self.scalars_key: tuple | None = None  # the group's hyperparameters that scalars were made from
        self.scalars: tuple = ()
        self.launch: CachedLauncher | None = None  # for the group's current compile-time flags
        self.launchers: dict[tuple[bool, bool, bool, bool], CachedLauncher] = {}  # by (amsgrad, maximize,
        # increment, clip)

    def norm_source(self, dtype: torch.dtype) -> NormSource:
        """The sum of squares of this plan's gradients, read through its table."""
        return NormSource(self.table, self.n_tensors, self.n_programs, dtype, BLOCK, aligned=self.aligned)


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
