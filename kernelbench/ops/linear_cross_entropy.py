"""A language model's head and loss: logits = hidden @ weight.T over a vocabulary of V, then
``F.cross_entropy(logits.float(), targets)``, forward and backward (gradients for hidden and
weight). At vocabularies of 128k-152k this is the largest single cost of a small model's step and
its memory peak: the plain expression holds the logits, their fp32 copy and its gradient.

FLOP model: the logits GEMM, 2 * N * H * V; forward+backward adds the two gradient GEMMs, so
6 * N * H * V (the softmax's element-wise work is left out).
Bytes model (element size s): what any implementation must move, which a chunked one comes close
to: the forward reads hidden and weight, (N + V) * H * s; forward+backward also writes their
gradients, 2 * (N + V) * H * s. The plain expression moves the N x V logits several times on top.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .base import Requires, Tolerance, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch


def linear_cross_entropy_plain(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               ignore_index: int, reduction: str) -> torch.Tensor:
    """What Hugging Face models compute: lm_head in the input dtype, the loss on fp32 logits."""
    from kernelbench.nn.linear_crossentropy import linear_cross_entropy_ref

    return linear_cross_entropy_ref(hidden, weight, targets, ignore_index, reduction)


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    import torch

    spec = workload.spec
    (n, h, v), dtype = spec["shape"], torch_dtype(spec["dtype"])
    hidden = torch.randn((n, h), generator=gen, device=device, dtype=torch.float32).to(dtype)
    # Weight of std 2 / sqrt(H): logits of std 2, the spread a trained model's have.
    weight = (torch.randn((v, h), generator=gen, device=device, dtype=torch.float32) * (2 / math.sqrt(h))).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen, device=device)
    ignored = spec.get("ignored", 0)
    if ignored:  # padding: the last rows carry no label
        targets[n - ignored:] = -100
    return {"hidden": hidden, "weight": weight, "targets": targets, "ignore_index": -100,
            "reduction": spec.get("reduction", "mean")}


def _flops(workload: Workload, mode: str) -> int:
    return math.prod(workload.spec["shape"]) * (2 if mode == "fwd" else 6)


def _bytes(workload: Workload, mode: str) -> int:
    import torch

    n, h, v = workload.spec["shape"]
    size = torch.empty((), dtype=torch_dtype(workload.spec["dtype"])).element_size()
    return (n + v) * h * size * (1 if mode == "fwd" else 2)


def _workload(name: str, tier: str, shape: tuple[int, int, int], dtype: str, seed: int = 0, **spec) -> Workload:
    return Workload(name, tier, {"shape": shape, "dtype": dtype, **spec}, seed=seed)


# Gradients are GEMM outputs whose elements cross zero: judged by the norm of the error. Each is
# one rounding of an fp32 GEMM's result to the input dtype, plus dlogits' own rounding to it.
_GRAD_TOLERANCE = {
    "fp32": Tolerance(0, 0, fro=1e-5, reason="GEMM outputs crossing zero: relative Frobenius error"),
    "bf16": Tolerance(0, 0, fro=1.5e-2, reason="dlogits and the GEMM outputs each rounded to bf16"),
    "fp16": Tolerance(0, 0, fro=3e-3, reason="dlogits and the GEMM outputs each rounded to fp16"),
}

linear_cross_entropy = FunctionOp(
    "linear-cross-entropy",
    doc="lm_head GEMM then cross-entropy on fp32 logits, gradients for hidden and weight",
    workloads=[
        _workload("24x16x100-fp32", "cpu", (24, 16, 100), "fp32", seed=1, ignored=3),
        _workload("12x16x300-fp16-sum", "cpu", (12, 16, 300), "fp16", seed=2, ignored=2, reduction="sum"),
        # Tokens x hidden x vocabulary of the model grid's heads, a step of 8192 tokens.
        _workload("llama3.2-1b", "gpu", (8192, 2048, 128256), "bf16"),
        _workload("qwen2.5-0.5b", "gpu", (8192, 896, 151936), "bf16"),
        _workload("llama3-8b", "gpu", (4096, 4096, 128256), "bf16"),
        _workload("smollm", "gpu", (16384, 576, 49152), "bf16"),
    ],
    speed_anchor="torch-eager",
    make_inputs=_inputs,
    reference=linear_cross_entropy_plain,
    outputs=("loss",),
    grad_inputs=("hidden", "weight"),
    modes=("fwd", "fwd+bwd"),
    bytes_moved=_bytes,
    flops=_flops,
    dims=Dims(("N", "H", "V"), "N tokens' hidden states of width H against a vocabulary of V",
              example="8192x2048x128256:bf16", small="24x16x100:fp32"),
    tensor_tolerances={
        "grad_hidden": _GRAD_TOLERANCE, "grad_weight": _GRAD_TOLERANCE,
        # The loss is fp32 for every input dtype, so its tolerance is looked up as fp32's, yet
        # bf16 / fp16 inputs round the logits once before it (the plain loss's error too).
        "loss": {"fp32": Tolerance(0, 0, fro=2e-4, reason="logits rounded to the input dtype before the fp32 loss")},
    },
)


@linear_cross_entropy.candidate("torch-eager", baseline=True)
def torch_eager():
    """hidden @ weight.T, then F.cross_entropy(logits.float(), targets): the Hugging Face loss."""
    return linear_cross_entropy_plain


@linear_cross_entropy.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch.compile of the plain loss."""
    return compile_anchor(linear_cross_entropy_plain)


@linear_cross_entropy.candidate("triton", requires=Requires(triton=True))
def triton_linear_cross_entropy():
    """kernelbench.nn.linear_cross_entropy: cuBLAS GEMMs and the cross-entropy kernels chunk by
    chunk, gradients made in the forward."""
    from kernelbench.nn.linear_crossentropy import linear_cross_entropy as lce

    return lambda hidden, weight, targets, ignore_index, reduction: lce(
        hidden, weight, targets, ignore_index=ignore_index, reduction=reduction)


@linear_cross_entropy.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True)
def liger():
    """liger-kernel's LigerFusedLinearCrossEntropyLoss (chunked, gradients made in the forward)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    losses: dict = {}

    def call(hidden, weight, targets, ignore_index, reduction):
        key = (ignore_index, reduction)
        if key not in losses:
            losses[key] = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction=reduction)
        return losses[key](weight, hidden, targets)  # liger takes the weight first

    return call
