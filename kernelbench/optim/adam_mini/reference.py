"""Adam-mini in pure PyTorch, fp32: the reference the Triton optimizer (``AdamMini``) is checked against.

``adam_mini_block_ref`` steps the blocks of one segment, with the state rounding the kernels
apply under bf16 / fp8 state; ``AdamMiniReference`` steps whole parameters over the same
partition as ``AdamMini``, for presets the official package cannot express.
"""

from __future__ import annotations

import math

import torch

from .partition import (
    PRESETS,
    Segment,
    decay_of,
    partition_param,
    region,
    state_shapes,
)

# e4m3's largest finite value: an fp8 scale block's amax maps to it.
E4M3_MAX = 448.0


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
        groups = [{"params": [p], "weight_decay": weight_decay if decay_of(self._parts[id(p)].name, p, rules) else 0.0}
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
                m_shape, v_shape = state_shapes(part, p)
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
