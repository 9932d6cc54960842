"""Adafactor with 8-bit state: the ``torch.optim.Optimizer`` face of the Triton kernels.

Math, state layout, quantisation errors and the kernels are described in ``kernels.py``; launch
plans and launches are ``host.py``'s; ``reference.AdafactorRef`` is the pure-PyTorch fp32
reference. Here: param groups, hyperparameter checks, state initialisation, the
per-group launch plan's cache, and checkpoints.

Sharded parameters (FSDP2). DTensor parameters of ``fully_shard`` (1-D and 2-D, sharded on dim 0)
are stepped through their local rows with the same kernels; the global sums Adafactor needs (the
column statistics, mean(r), RMS(p), RMS(u)) are reduced across the ranks of the sharding mesh
dimension, one all-reduce per phase and reduction for the whole group. The state keeps the
single-device format (same keys, shapes of the whole tensor, same codes), laid out so that
``get_optimizer_state_dict`` / DCP can reshard it:

    per row / element of the parameter   DTensor of the parameter's layout:  row_q / row, m_q / m,
                                          m_scale (factored: one absmax per row and column block),
                                          v_q / v
    shared by all rows                    plain tensor, identical on every rank: step, col_q / col,
                                          col_range, row_range, v_range, m_scale (full tensors)

Code blocks that span rows (ROW_BLOCK rows share a row_range entry, FLAT_BLOCK elements of a 1-D
tensor a v_range / m_scale entry) may be cut by a shard boundary, so their ranges are those of the
whole block, reduced across the ranks (max of hi and of -lo, max of absmax), and the stochastic
rounding is seeded by global indices: a sharded step writes the codes a single device writes from
the same statistics. The cost is one MAX all-reduce (ranges) beside the second SUM, and for an
8-bit first moment of a 1-D tensor a third exchange and one more small kernel (its absmax is known
only after RMS(u)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from .._sharding import check_kernel_tensor, check_like_param, is_dtensor, like_param, local_tensor, row_shard
from .._triton_utils import (
    check_device_supported,
    check_param_and_grad,
    on_device,
    param_label,
    refuse_rebuild_while_capturing,
)
from .host import (
    COL_BLOCK,
    DEFAULT_LAUNCH,
    FLAT_BLOCK,
    ROW_BLOCK,
    LaunchConfig,
    Plan,
    ShardInfo,
    _cdiv,
    build_plan,
    launch_step,
)

_WHO = "Adafactor8bit"


class Adafactor8bit(torch.optim.Optimizer):
    """Adafactor with 8-bit block-wise state (math, layout and errors: ``kernels.py``).

    DTensor parameters of ``fully_shard`` (FSDP2; 1-D and 2-D, sharded on dim 0) step their local
    rows and reduce the global statistics across the ranks; the state is then laid out for
    ``torch.distributed.checkpoint`` (module docstring). Every rank must step the same parameters.

    Args:
        params: parameters, named parameters (names appear in errors) or param groups.
        lr: step-size cap; with ``relative_step`` the step size is min(lr, 1/sqrt(t)).
        beta1: first-moment decay; None keeps no first moment (Adafactor's default).
        beta2: a fixed second-moment decay; None uses 1 - t^decay_rate.
        decay_rate: exponent of the beta2 schedule (-0.8).
        eps: (eps1 added to g^2, eps2 the floor of the parameter scale).
        clip_threshold: d in u / max(1, RMS(u) / d).
        weight_decay: decoupled, p <- p * (1 - rho * weight_decay).
        relative_step, scale_parameter: Adafactor's step-size rules (both on by default).
        quantize: 8-bit state for this group; False keeps fp32 state (the ``triton-fp32`` variant).
        min_8bit_size: tensors with fewer elements keep fp32 state.
        launch_config: how the kernels are launched: tuning only; the state_dict format does not
            depend on it, the last bits of the reductions do (order of the partial sums).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        *,
        beta1: float | None = None,
        beta2: float | None = None,
        decay_rate: float = -0.8,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        weight_decay: float = 0.0,
        relative_step: bool = True,
        scale_parameter: bool = True,
        quantize: bool = True,
        min_8bit_size: int = 4096,
        launch_config: LaunchConfig = DEFAULT_LAUNCH,
    ) -> None:
        if not isinstance(launch_config, LaunchConfig):
            raise TypeError(f"{_WHO}: launch_config={launch_config!r}; accepted: a "
                            "kernelbench.optim.adafactor.LaunchConfig.")
        defaults = dict(lr=lr, beta1=beta1, beta2=beta2, decay_rate=decay_rate, eps=eps,
                        clip_threshold=clip_threshold, weight_decay=weight_decay,
                        relative_step=relative_step, scale_parameter=scale_parameter,
                        quantize=quantize, min_8bit_size=min_8bit_size)
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_hyperparams(group)
        self._plans: dict[int, Plan] = {}
        self.launch_config = launch_config

    # -- state layout ------------------------------------------------------------------------
    @staticmethod
    def _expected_keys(p: torch.Tensor, quant: bool, has_m: bool) -> set[str]:
        if p.ndim >= 2:
            keys = {"row_q", "row_range", "col_q", "col_range"} if quant else {"row", "col"}
        else:
            keys = {"v_q", "v_range"} if quant else {"v"}
        if has_m:
            keys |= {"m_q", "m_scale"} if quant else {"m"}
        return keys | {"step"}

    @staticmethod
    def _state_layout(p: torch.Tensor, quant: bool, has_m: bool) -> dict[str, tuple[torch.dtype, tuple, bool]]:
        """key -> (dtype, shape the kernels read, per row of the parameter). Per-row state of a
        DTensor parameter is a DTensor of its layout (the shape is the local one); the rest is a
        plain tensor of the whole tensor's shape (module docstring)."""
        whole, local = tuple(p.shape), tuple(local_tensor(p).shape)
        f32, u8 = torch.float32, torch.uint8
        layout: dict[str, tuple[torch.dtype, tuple, bool]] = {"step": (f32, (), False)}
        if p.ndim >= 2:
            R, C = whole[-2], whole[-1]
            B = math.prod(whole[:-2])
            if quant:
                layout["row_q"] = (u8, local[:-1], True)
                layout["row_range"] = (f32, (B * _cdiv(R, ROW_BLOCK), 2), False)
                layout["col_q"] = (u8, whole[:-2] + whole[-1:], False)
                layout["col_range"] = (f32, (B * _cdiv(C, COL_BLOCK), 2), False)
            else:
                layout["row"] = (f32, local[:-1], True)
                layout["col"] = (f32, whole[:-2] + whole[-1:], False)
            if has_m:
                if quant:
                    layout["m_q"] = (u8, local, True)
                    layout["m_scale"] = (f32, (math.prod(local[:-1]), _cdiv(C, COL_BLOCK)), True)
                else:
                    layout["m"] = (f32, local, True)
        else:
            nblocks = _cdiv(p.numel(), FLAT_BLOCK)
            if quant:
                layout["v_q"] = (u8, local, True)
                layout["v_range"] = (f32, (nblocks, 2), False)
            else:
                layout["v"] = (f32, local, True)
            if has_m:
                if quant:
                    layout["m_q"] = (u8, local, True)
                    layout["m_scale"] = (f32, (nblocks,), False)
                else:
                    layout["m"] = (f32, local, True)
        return layout

    @classmethod
    def _init_state(cls, p: torch.Tensor, quant: bool, has_m: bool) -> dict[str, torch.Tensor]:
        dev = local_tensor(p).device
        return {key: like_param(p, torch.zeros(shape, dtype=dtype, device=dev)) if per_row
                else torch.zeros(shape, dtype=dtype, device=dev)
                for key, (dtype, shape, per_row) in cls._state_layout(p, quant, has_m).items()}

    def _kernel_state(self, p: torch.Tensor, label: str, state: dict, quant: bool, has_m: bool,
                      device: torch.device) -> dict[str, torch.Tensor]:
        """The tensors whose addresses go into the launch tables, each checked (layout, dtype,
        shape, storage) before any launch: a state dict of another shape or setting never reaches
        a kernel."""
        kernel_state = {}
        for key, (dtype, shape, per_row) in self._state_layout(p, quant, has_m).items():
            value, what = state[key], f"state '{key}' of {label}"
            if per_row:
                check_like_param(label, p, value, _WHO, f"state '{key}'")
            elif is_dtensor(value):
                raise TypeError(f"{_WHO}: {what} is a DTensor; it is the same on every rank and is kept as a "
                                "plain tensor of the whole tensor's shape.")
            local = local_tensor(value)
            check_kernel_tensor(local, what, device, _WHO)
            if local.dtype != dtype or tuple(local.shape) != shape or not local.is_contiguous():
                raise RuntimeError(
                    f"{_WHO}: {what} is {local.dtype} of shape {tuple(local.shape)}"
                    f"{'' if local.is_contiguous() else ', not contiguous'}; the kernels need contiguous {dtype} of "
                    f"shape {shape} (was the state dict saved for this parameter and these settings?).")
            kernel_state[key] = local
        return kernel_state

    # -- launch plan -------------------------------------------------------------------------
    def _plan(self, gi: int, group: dict, salt0: int) -> Plan | None:
        params = group["params"]
        names = group.get("param_names")
        entries = []  # (param, local param, local grad, label, salt)
        device = None
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            label = param_label(names[i] if names else None, i, p)
            # The kernels read local tensors: a DTensor's own data_ptr() is not its data.
            lp, lg = local_tensor(p), local_tensor(p.grad)
            if lp is not p or lg is not p.grad:
                check_like_param(label, p, p.grad, _WHO)
            device = device or lp.device
            check_param_and_grad(label, lp, lg, device, (torch.float32,), _WHO)
            if not lp.is_contiguous() or not lg.is_contiguous():
                raise RuntimeError(f"{_WHO}: {label} or its gradient is not contiguous; the factored "
                                   "kernels read rows and columns of the last two dims in row-major order.")
            if p.numel() == 0:
                continue
            entries.append((p, lp, lg, label, salt0 + i))
        if not entries:
            return None
        check_device_supported(device, _WHO)
        key = tuple((lp.data_ptr(), lg.data_ptr()) for _, lp, lg, _, _ in entries)
        plan = self._plans.get(gi)
        if plan is not None and plan.key == key:
            return plan
        refuse_rebuild_while_capturing(_WHO)

        has_m = group["beta1"] is not None
        kernel_states, shards = [], []
        for p, _, _, label, _ in entries:
            shard = row_shard(p, label, _WHO)  # None for plain tensors; unsupported layouts raise here
            if is_dtensor(p) and p.ndim > 2:
                raise ValueError(f"{_WHO}: {label} is a {p.ndim}-dim DTensor; sharded parameters must have 1 or 2 "
                                 "dims (stacked matrices under fully_shard are not supported; keep them as "
                                 "plain tensors or split them into 2-dim parameters).")
            quant = group["quantize"] and p.numel() >= group["min_8bit_size"]
            state = self.state[p]
            if not state:
                state.update(self._init_state(p, quant, has_m))
            expected = self._expected_keys(p, quant, has_m)
            if set(state) != expected:
                raise RuntimeError(
                    f"{_WHO}: the state of {label} holds {sorted(state)} but this group's settings "
                    f"(quantize={group['quantize']}, min_8bit_size={group['min_8bit_size']}, beta1="
                    f"{group['beta1']}) need {sorted(expected)}; a state dict must be loaded into an "
                    "optimizer built with the settings it was saved with.")
            kernel_states.append(self._kernel_state(p, label, state, quant, has_m, device))
            rows = p.shape[-2] if p.ndim >= 2 else p.numel()
            shards.append(ShardInfo(shard.row_start, rows, shard.group) if shard is not None
                          else ShardInfo(0, rows, None))
        sharded = any(is_dtensor(p) for p, *_ in entries)
        plan = build_plan([(lp, lg, salt, st) for (_, lp, lg, _, salt), st in zip(entries, kernel_states)], key,
                          has_m, device, self.launch_config, shards if sharded else None)
        self._plans[gi] = plan
        return plan

    # -- step --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        salt0 = 0
        for gi, group in enumerate(self.param_groups):
            plan = self._plan(gi, group, salt0)
            salt0 += len(group["params"])
            if plan is not None:
                with on_device(plan.meta.device):
                    launch_step(plan, group)
        return loss

    # -- checkpoints -------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader, then every state tensor on its parameter's device with its saved dtype
        (torch leaves ``step`` where it was saved; the kernels need it on the device)."""
        saved = {idx: {k: v for k, v in st.items() if torch.is_tensor(v)}
                 for idx, st in state_dict.get("state", {}).items()}
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for idx, p in zip(ids, params):
            if idx in saved and p in self.state:
                for key, value in saved[idx].items():
                    self.state[p][key] = value.detach().to(device=p.device, dtype=value.dtype, copy=True)
        for group in self.param_groups:
            _check_hyperparams(group)
        self._plans.clear()


def _check_hyperparams(group: dict) -> None:
    def bad(what: str, accepted: str) -> ValueError:
        return ValueError(f"Adafactor8bit: {what}; accepted: {accepted}.")

    if not group["lr"] > 0:
        raise bad(f"lr={group['lr']}", "lr > 0")
    if group["beta1"] is not None and not 0.0 <= group["beta1"] < 1.0:
        raise bad(f"beta1={group['beta1']}", "None or 0 <= beta1 < 1")
    if group["beta2"] is not None and not 0.0 <= group["beta2"] < 1.0:
        raise bad(f"beta2={group['beta2']}", "None (the t^decay_rate schedule) or 0 <= beta2 < 1")
    if group["beta2"] is None and not group["decay_rate"] < 0.0:
        raise bad(f"decay_rate={group['decay_rate']}", "decay_rate < 0 (beta2_t = 1 - t^decay_rate)")
    eps = group["eps"]
    if not (isinstance(eps, (tuple, list)) and len(eps) == 2 and eps[0] >= 0 and eps[1] >= 0):
        raise bad(f"eps={eps}", "a pair (eps1 >= 0, eps2 >= 0)")
    if not group["clip_threshold"] > 0:
        raise bad(f"clip_threshold={group['clip_threshold']}", "clip_threshold > 0 (inf disables clipping)")
    if not group["weight_decay"] >= 0:
        raise bad(f"weight_decay={group['weight_decay']}", "weight_decay >= 0")
    if not (isinstance(group["min_8bit_size"], int) and group["min_8bit_size"] >= 0):
        raise bad(f"min_8bit_size={group['min_8bit_size']}", "an int >= 0")
