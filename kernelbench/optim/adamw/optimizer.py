"""TritonAdamW: the ``torch.optim.Optimizer`` face of the kernels (param groups, state, checkpoints,
the launch plans' cache, FSDP2 DTensor parameters). Kernels and math: ``kernels.py``; launch plans
and host functions: ``host.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...fast_launch import CachedLauncher
from .._sharding import check_kernel_tensor, check_like_param, is_dtensor, local_tensor, row_shard
from .._triton_utils import (
    SUPPORTED_DTYPES,
    TL_DTYPE,
    check_device_supported,
    check_param_and_grad,
    check_same_layout,
    on_device,
    one_device,
    param_label,
    refuse_rebuild_while_capturing,
)
from ..grad_norm import FusedClip, check_max_grad_norm, one_process_group
from ..sharded_adamw import TORCH_ADAMW_GROUP_EXTRAS
from .host import (
    _WHO,
    BLOCK,
    NUM_WARPS,
    StepIncrementer,
    _check_lr,
    _host_scalars,
    _LaunchPlan,
    reciprocal_in_fp64,
)
from .kernels import _adamw_group_kernel


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

    ``max_grad_norm``: clip the gradients to this total 2-norm inside ``step()``, as
    ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)`` before it would, with the
    norm computed on the device (one extra read of the gradients, no host sync; global over the mesh
    under FSDP2) and the scale folded into the update; ``p.grad`` is left unscaled. After each step
    ``last_grad_norm`` is the pre-clip norm (0-d fp32 on the device; one buffer, rewritten by every
    step: clone it to keep it). See ``kernelbench.optim.grad_norm``.
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
        max_grad_norm: float | None = None,
    ) -> None:
        lr = _check_lr(lr)
        self.max_grad_norm = check_max_grad_norm(max_grad_norm, _WHO)
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
        self._clip: FusedClip | None = None
        self.last_grad_norm: torch.Tensor | None = None  # pre-clip total norm of the last step (max_grad_norm)
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
            clip = None
            if self.max_grad_norm is not None:
                if self._clip is None or self._clip.norm.device != device:
                    self._clip = FusedClip(self.max_grad_norm, device)
                clip = self._clip.coefficient(
                    [plan.norm_source(dtype) for plan, _, dtype in launches],
                    process_group=one_process_group([plan.process_group for plan, _, _ in launches], _WHO))
                self.last_grad_norm = self._clip.norm
            if not fused_increment:
                self._increment_steps([plan for plan, _, _ in launches])
            for plan, group, dtype in launches:
                self._launch(plan, group, dtype, fused_increment, clip)
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

    def _launch(self, plan: _LaunchPlan, group: dict, dtype: torch.dtype, increment_steps: bool,
                clip: torch.Tensor | None) -> None:
        # Hyperparameters are read every step (LR schedulers), converted only when they change;
        # the launcher depends only on the compile-time flags, so a new lr keeps the fast launch.
        scalars_key = (group["lr"], group["betas"], group["eps"], group["weight_decay"], group["amsgrad"],
                       group["maximize"], increment_steps, clip is not None)
        if plan.scalars_key != scalars_key:
            lr = _check_lr(group["lr"])
            beta1, beta2 = group["betas"]
            plan.scalars = _host_scalars(lr, beta1, beta2, group["eps"], group["weight_decay"])
            flags = (bool(group["amsgrad"]), bool(group["maximize"]), increment_steps, clip is not None)
            plan.launch = plan.launchers.get(flags)
            if plan.launch is None:
                plan.launch = plan.launchers[flags] = CachedLauncher(
                    _adamw_group_kernel, plan.grid,
                    DTYPE=TL_DTYPE[dtype], AMSGRAD=flags[0], MAXIMIZE=flags[1], ALIGNED=plan.aligned,
                    INV_BC2_FP64=reciprocal_in_fp64(plan.table.device), BLOCK_SIZE=BLOCK, INCREMENT_STEPS=flags[2],
                    HAS_CLIP=flags[3], num_warps=NUM_WARPS, enable_fp_fusion=False)
            plan.scalars_key = scalars_key
        # Unclipped, the coefficient's slot takes the ticket: any pointer, never read.
        plan.launch(plan.table, plan.n_tensors, plan.ticket, plan.ticket if clip is None else clip, *plan.scalars)

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
        if not plan.plain:
            plan.process_group = one_process_group([shard.group if (shard := row_shard(p, self._labels[id(p)], _WHO))
                                                    else None for p in params], _WHO)
        return plan
