"""AdamW step on fp32 parameters: torch's three implementations, and kernelbench's Triton one.

Bytes model: read p, g, m, v and write p, m, v, 4 bytes each: 28 bytes per parameter; mode
``clipped-step`` (clip to a total norm of 1.0, then step) adds the norm's read of g: 32. Its anchor
is ``clip_grad_norm_(foreach=True)`` + AdamW(fused=True) (torch-fused); TritonAdamW clips inside
its step (``max_grad_norm``), the torch candidates through ``clip_grad_norm_`` first.
"""

from __future__ import annotations

from .base import Requires
from .optim_workloads import MODEL_370M, MODEL_TINY, TINY, SINGLE_4096x1024
from .optimizer_op import OptimizerOp

adamw = OptimizerOp(
    "adamw",
    doc="AdamW step, fp32 params and state",
    workloads=[TINY, MODEL_TINY, SINGLE_4096x1024, MODEL_370M],
    speed_anchor="torch-fused",
    reference="torch-forloop",
    hyperparams={"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    bytes_per_param=lambda candidate: 28,
    clip_max_norm=1.0,
)


def _torch_adamw(named_params, **kwargs):
    import torch

    return torch.optim.AdamW([p for _, p in named_params], **kwargs)


@adamw.candidate("torch-forloop", baseline=True)
def torch_forloop(named_params, **hp):
    """torch.optim.AdamW(foreach=False): one kernel sequence per tensor."""
    return _torch_adamw(named_params, foreach=False, **hp)


@adamw.candidate("torch-foreach", baseline=True)
def torch_foreach(named_params, **hp):
    """torch.optim.AdamW(foreach=True): torch's default on CUDA."""
    return _torch_adamw(named_params, foreach=True, **hp)


@adamw.candidate("torch-fused", baseline=True)
def torch_fused(named_params, **hp):
    """torch.optim.AdamW(fused=True): one fused kernel over all tensors."""
    return _torch_adamw(named_params, fused=True, **hp)


@adamw.candidate("torch-fused-capturable", baseline=True)
def torch_fused_capturable(named_params, **hp):
    """torch.optim.AdamW(fused=True, capturable=True): step counter on the device, so it can be
    captured in a CUDA graph (the anchor under --cuda-graph, where the others cannot run)."""
    return _torch_adamw(named_params, fused=True, capturable=True, **hp)


@adamw.candidate("triton", requires=Requires(triton=True))
def triton_adamw(named_params, *, max_grad_norm=None, **hp):
    """kernelbench TritonAdamW: one Triton launch per param group, torch forloop's rounding."""
    from kernelbench.optim.adamw import TritonAdamW

    return TritonAdamW([p for _, p in named_params], max_grad_norm=max_grad_norm, **hp)
