"""Adafactor with 8-bit state: the ``torch.optim.Optimizer`` face of the Triton kernels.

Math, state layout, quantisation errors and the kernels are described in
``kernelbench.optim.adafactor_kernels``; ``kernelbench.optim.adafactor_ref.AdafactorRef`` is the
pure-PyTorch fp32 reference. Here: param groups, hyperparameter checks, state initialisation, the
per-group launch plan's cache, and checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._triton_utils import (
    check_device_supported,
    check_param_and_grad,
    param_label,
    refuse_rebuild_while_capturing,
)
from .adafactor_kernels import (
    COL_BLOCK,
    DEFAULT_LAUNCH,
    FLAT_BLOCK,
    ROW_BLOCK,
    LaunchConfig,
    Plan,
    _cdiv,
    build_plan,
    dequantize_state,
    launch_step,
)

__all__ = ["Adafactor8bit", "LaunchConfig", "dequantize_state", "ROW_BLOCK", "COL_BLOCK", "FLAT_BLOCK"]


class Adafactor8bit(torch.optim.Optimizer):
    """Adafactor with 8-bit block-wise state (math, layout and errors: ``adafactor_kernels``).

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
            raise TypeError(f"Adafactor8bit: launch_config={launch_config!r}; accepted: a "
                            "kernelbench.optim.adafactor_kernels.LaunchConfig.")
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
    def _init_state(p: torch.Tensor, quant: bool, has_m: bool) -> dict[str, torch.Tensor]:
        dev = p.device
        state: dict[str, torch.Tensor] = {"step": torch.zeros((), dtype=torch.float32, device=dev)}
        if p.ndim >= 2:
            R, C = p.shape[-2], p.shape[-1]
            B = p.numel() // (R * C)
            row_shape, col_shape = p.shape[:-1], p.shape[:-2] + p.shape[-1:]
            if quant:
                state["row_q"] = torch.zeros(row_shape, dtype=torch.uint8, device=dev)
                state["row_range"] = torch.zeros(B * _cdiv(R, ROW_BLOCK), 2, dtype=torch.float32, device=dev)
                state["col_q"] = torch.zeros(col_shape, dtype=torch.uint8, device=dev)
                state["col_range"] = torch.zeros(B * _cdiv(C, COL_BLOCK), 2, dtype=torch.float32, device=dev)
            else:
                state["row"] = torch.zeros(row_shape, dtype=torch.float32, device=dev)
                state["col"] = torch.zeros(col_shape, dtype=torch.float32, device=dev)
            if has_m:
                if quant:
                    state["m_q"] = torch.zeros(p.shape, dtype=torch.uint8, device=dev)
                    state["m_scale"] = torch.zeros(B * R, _cdiv(C, COL_BLOCK), dtype=torch.float32, device=dev)
                else:
                    state["m"] = torch.zeros(p.shape, dtype=torch.float32, device=dev)
        else:
            nblocks = _cdiv(p.numel(), FLAT_BLOCK)
            if quant:
                state["v_q"] = torch.zeros(p.shape, dtype=torch.uint8, device=dev)
                state["v_range"] = torch.zeros(nblocks, 2, dtype=torch.float32, device=dev)
            else:
                state["v"] = torch.zeros(p.shape, dtype=torch.float32, device=dev)
            if has_m:
                if quant:
                    state["m_q"] = torch.zeros(p.shape, dtype=torch.uint8, device=dev)
                    state["m_scale"] = torch.zeros(nblocks, dtype=torch.float32, device=dev)
                else:
                    state["m"] = torch.zeros(p.shape, dtype=torch.float32, device=dev)
        return state

    # -- launch plan -------------------------------------------------------------------------
    def _plan(self, gi: int, group: dict, salt0: int) -> Plan | None:
        params = group["params"]
        names = group.get("param_names")
        entries = []  # (param, grad, label, salt)
        device = None
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            label = param_label(names[i] if names else None, i, p)
            device = device or p.device
            check_param_and_grad(label, p, p.grad, device, (torch.float32,), "Adafactor8bit")
            if not p.is_contiguous() or not p.grad.is_contiguous():
                raise RuntimeError(f"Adafactor8bit: {label} or its gradient is not contiguous; the factored "
                                   "kernels read rows and columns of the last two dims in row-major order.")
            if p.numel() == 0:
                continue
            entries.append((p, p.grad, label, salt0 + i))
        if not entries:
            return None
        check_device_supported(device, "Adafactor8bit")
        key = tuple((p.data_ptr(), g.data_ptr()) for p, g, _, _ in entries)
        plan = self._plans.get(gi)
        if plan is not None and plan.key == key:
            return plan
        refuse_rebuild_while_capturing("Adafactor8bit")

        has_m = group["beta1"] is not None
        for p, _, label, _ in entries:
            quant = group["quantize"] and p.numel() >= group["min_8bit_size"]
            state = self.state[p]
            if not state:
                state.update(self._init_state(p, quant, has_m))
            expected = self._expected_keys(p, quant, has_m)
            if set(state) != expected:
                raise RuntimeError(
                    f"Adafactor8bit: the state of {label} holds {sorted(state)} but this group's settings "
                    f"(quantize={group['quantize']}, min_8bit_size={group['min_8bit_size']}, beta1="
                    f"{group['beta1']}) need {sorted(expected)}; a state dict must be loaded into an "
                    "optimizer built with the settings it was saved with.")
            for key_name, value in state.items():
                if value.device != p.device:
                    raise RuntimeError(f"Adafactor8bit: state '{key_name}' of {label} is on {value.device}, "
                                       f"the parameter on {p.device}.")

        states = [self.state[p] for p, _, _, _ in entries]
        plan = build_plan([(p, g, salt, st) for (p, g, _, salt), st in zip(entries, states)], key, has_m,
                          device, self.launch_config)
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
