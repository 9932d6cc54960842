"""Pure-PyTorch fp32 reference of kernelbench's Adafactor (the algorithm ``Adafactor8bit`` runs).

Per parameter p with gradient g, at step t (t = 1 on the first step):

    rho    = min(lr, 1 / sqrt(t))            if relative_step, else lr
    alpha  = rho * max(eps2, RMS(p))         if scale_parameter, else rho      (RMS(p) before the step)
    beta2t = 1 - t ** decay_rate             (decay_rate = -0.8), or the fixed beta2 when given
    G      = g^2 + eps1
    factored (p.ndim >= 2, over the last two dims, rows r, columns c):
        r <- beta2t * r + (1 - beta2t) * mean_c(G)          shape p.shape[:-1]
        c <- beta2t * c + (1 - beta2t) * mean_r(G)          shape p.shape[:-2] + p.shape[-1:]
        u  = g * rsqrt(r / mean(r)) [..., :, None] * rsqrt(c) [..., None, :]
    otherwise:
        v <- beta2t * v + (1 - beta2t) * G
        u  = g * rsqrt(v)
    u  = u / max(1, RMS(u) / clip_threshold)                  update clipping
    m <- beta1 * m + (1 - beta1) * u;  u = m                  only when beta1 is set
    p <- p * (1 - rho * weight_decay) - alpha * u             decoupled weight decay

The state starts at zero, so with the default schedule (beta2_1 = 0) the first step uses G alone.
This is Hugging Face's Adafactor with two deliberate differences, both shared by the Triton
version: weight decay multiplies rho (the schedule), not alpha (rho times the parameter scale),
as AdamW's decoupled decay does; and the first moment averages the clipped, unscaled update u
(alpha is applied afterwards), so its stored values stay O(1) whatever the learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.norm(2) / math.sqrt(x.numel())


class AdafactorRef(torch.optim.Optimizer):
    """One PyTorch kernel sequence per tensor, fp32 state. The parity reference (``torch-ref``)."""

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
    ) -> None:
        defaults = dict(lr=lr, beta1=beta1, beta2=beta2, decay_rate=decay_rate, eps=eps,
                        clip_threshold=clip_threshold, weight_decay=weight_decay,
                        relative_step=relative_step, scale_parameter=scale_parameter)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                factored = p.ndim >= 2
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    if factored:
                        state["row"] = torch.zeros(p.shape[:-1], dtype=torch.float32, device=p.device)
                        state["col"] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=torch.float32, device=p.device)
                    else:
                        state["v"] = torch.zeros_like(p, dtype=torch.float32)
                    if group["beta1"] is not None:
                        state["m"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = float(state["step"])  # the reference may synchronise; it is not timed against ours
                rho = min(group["lr"], 1.0 / math.sqrt(t)) if group["relative_step"] else group["lr"]
                alpha = rho * max(eps2, float(_rms(p.float()))) if group["scale_parameter"] else rho
                beta2t = group["beta2"] if group["beta2"] is not None else 1.0 - t ** group["decay_rate"]
                sq = g * g + eps1
                if factored:
                    row, col = state["row"], state["col"]
                    row.mul_(beta2t).add_(sq.mean(dim=-1), alpha=1.0 - beta2t)
                    col.mul_(beta2t).add_(sq.mean(dim=-2), alpha=1.0 - beta2t)
                    row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt()
                    u = row_factor.unsqueeze(-1) * col.rsqrt().unsqueeze(-2) * g
                else:
                    v = state["v"]
                    v.mul_(beta2t).add_(sq, alpha=1.0 - beta2t)
                    u = g * v.rsqrt()
                u = u / (_rms(u) / group["clip_threshold"]).clamp(min=1.0)
                if group["beta1"] is not None:
                    state["m"].mul_(group["beta1"]).add_(u, alpha=1.0 - group["beta1"])
                    u = state["m"]
                p.mul_(1.0 - rho * group["weight_decay"]).add_(u, alpha=-alpha)
        return loss
