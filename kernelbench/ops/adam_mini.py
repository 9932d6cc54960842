"""Adam-mini step (arXiv 2406.16793) on Llama-shaped fp32 params with Hugging Face names.

Candidates: the official adam-mini 1.1.1 package (the reference), torch fused AdamW as the speed
and memory anchor (it computes AdamW, so it takes no part in parity), and kernelbench's Triton
AdamMini with fp32 / bf16 / fp8 first-moment state (``--state``).

Bytes model per parameter: read p, g, m and write p, m; m is 4 / 2 / 1 bytes by state dtype:
20 / 16 / 14 bytes (the per-block second moment is negligible). AdamW moves 28.
"""

from __future__ import annotations

import torch

from .base import Requires
from .optim_workloads import LLAMA_468M, LLAMA_TINY
from .optimizer_op import OptimizerOp

STATE_DTYPES = ("fp32", "bf16", "fp8")
_BYTES_PER_PARAM = {"fp32": 20, "bf16": 16, "fp8": 14}

adam_mini = OptimizerOp(
    "adam-mini",
    doc="Adam-mini step, fp32 params; --state picks the first-moment dtype",
    workloads=[LLAMA_TINY, LLAMA_468M],
    speed_anchor="torch-adamw-fused",
    reference="official",
    hyperparams={"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1},
    bytes_per_param=lambda c: 28 if c.tags.get("algo") == "adamw" else _BYTES_PER_PARAM[c.tags.get("state", "fp32")],
    tag_values={"state": STATE_DTYPES, "algo": ("adam-mini", "adamw")},
)


@adam_mini.candidate("official", requires=Requires(packages=("adam_mini",)), baseline=True, tags={"state": "fp32"})
def official(named_params, *, lr, betas, eps, weight_decay, dim, n_heads, n_kv_heads):
    """The official adam-mini 1.1.1 package (one PyTorch kernel sequence per tensor)."""
    from adam_mini import Adam_mini

    return Adam_mini(named_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                     dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, verbose=False)


@adam_mini.candidate("torch-adamw-fused", requires=Requires(cuda=True), baseline=True, parity=False,
                     tags={"algo": "adamw"})
def torch_adamw_fused(named_params, *, lr, betas, eps, weight_decay, **_model_shape):
    """torch.optim.AdamW(fused=True): the speed and state-memory anchor (not Adam-mini)."""
    return torch.optim.AdamW([p for _, p in named_params], lr=lr, betas=betas, eps=eps,
                             weight_decay=weight_decay, fused=True)
