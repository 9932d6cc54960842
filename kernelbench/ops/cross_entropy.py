"""Cross-entropy of (M, V) logits against M class indices, as a language model's loss computes it:
``F.cross_entropy(logits.float(), targets)``, forward and backward.

Bytes model (element size s of the logits): the forward reads the logits once, M * V * s; the
backward reads them again and writes their gradient, so forward+backward moves 3 * M * V * s
(the targets and per-row statistics, 16 bytes a row, are left out). Torch's eager expression
moves about seven times that: the fp32 copy, its log-softmax, their gradients.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .base import Requires, Tolerance, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch


def cross_entropy_upcast(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                         reduction: str) -> torch.Tensor:
    """What Hugging Face models compute: the logits upcast to fp32 (fp64 stays fp64)."""
    from kernelbench.nn.crossentropy import cross_entropy_ref_fp32

    return cross_entropy_ref_fp32(logits, targets, ignore_index, reduction)


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    import torch

    spec = workload.spec
    (m, v), dtype = spec["shape"], torch_dtype(spec["dtype"])
    # Logits of a spread a trained model's have (std 2), targets uniform over the vocabulary.
    logits = (2 * torch.randn((m, v), generator=gen, device=device, dtype=torch.float32)).to(dtype)
    targets = torch.randint(0, v, (m,), generator=gen, device=device)
    ignored = spec.get("ignored", 0)
    if ignored:  # padding: the last rows carry no label
        targets[m - ignored:] = -100
    return {"logits": logits, "targets": targets, "ignore_index": -100, "reduction": spec.get("reduction", "mean")}


def _bytes(workload: Workload, mode: str) -> int:
    import torch

    size = torch.empty((), dtype=torch_dtype(workload.spec["dtype"])).element_size()
    return math.prod(workload.spec["shape"]) * size * (1 if mode == "fwd" else 3)


def _workload(name: str, tier: str, shape: tuple[int, int], dtype: str, seed: int = 0, **spec) -> Workload:
    return Workload(name, tier, {"shape": shape, "dtype": dtype, **spec}, seed=seed)


cross_entropy = FunctionOp(
    "cross-entropy",
    doc="cross-entropy of (M, V) logits against class indices, fp32 math, forward and backward",
    model_layer="loss",
    workloads=[
        _workload("8x100-fp32", "cpu", (8, 100), "fp32", seed=1, ignored=1),
        _workload("6x300-fp16-sum", "cpu", (6, 300), "fp16", seed=2, ignored=2, reduction="sum"),
        # The llama-step model's logits: 4 x 2048 tokens, Llama-2's 32000-word vocabulary.
        _workload("llama-32k", "gpu", (8192, 32000), "bf16"),
        # Llama-3's vocabulary, half the tokens: rows of 250 KB.
        _workload("llama3-128k", "gpu", (4096, 128256), "bf16"),
    ],
    speed_anchor="torch-compile",
    make_inputs=_inputs,
    reference=cross_entropy_upcast,
    outputs=("loss",),
    grad_inputs=("logits",),
    modes=("fwd", "fwd+bwd"),
    bytes_moved=_bytes,
    dims=Dims(("M", "V"), "M tokens' logits over a vocabulary of V", example="8192x32000:bf16", small="8x100:fp32"),
    # liger writes the gradient into the logits.
    inplace=("logits",),
    # The gradient is (softmax - onehot) * g rounded once to the logits' dtype: element-wise
    # relative error, since its elements are ~1 / (M * V) and any fixed atol would hide them.
    # fp16 flushes the smallest of them to zero (as torch's fp32-upcast gradient does), so its
    # error is judged by the norm.
    tensor_tolerances={"grad_logits": {
        "fp32": Tolerance(1e-12, 1e-5, reason="grad_logits: elements ~1/(M*V), relative bound"),
        "bf16": Tolerance(1e-12, 1e-2, reason="grad_logits: elements ~1/(M*V), one bf16 rounding"),
        "fp16": Tolerance(0, 0, fro=2e-3, reason="grad_logits: fp16 flushes elements below 6e-8 to zero"),
    }},
)


@cross_entropy.candidate("torch-eager", baseline=True)
def torch_eager():
    """F.cross_entropy(logits.float(), targets): the Hugging Face loss."""
    return cross_entropy_upcast


@cross_entropy.candidate("torch-eager-no-upcast", baseline=True, tolerance={
    "bf16": Tolerance(0, 0, fro=5e-2, reason="log-softmax rounded to bf16 before its exp in the backward"),
    "fp16": Tolerance(0, 0, fro=5e-3, reason="log-softmax rounded to fp16 before its exp in the backward"),
})
def torch_eager_no_upcast():
    """F.cross_entropy on the logits in their own dtype (loss and log-softmax rounded to it)."""
    import torch.nn.functional as F

    return lambda logits, targets, ignore_index, reduction: F.cross_entropy(
        logits, targets, ignore_index=ignore_index, reduction=reduction)


@cross_entropy.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch.compile of F.cross_entropy(logits.float(), targets)."""
    return compile_anchor(cross_entropy_upcast)


@cross_entropy.candidate("triton", requires=Requires(triton=True))
def triton_cross_entropy():
    """kernelbench.nn.cross_entropy: online logsumexp forward, one-pass backward."""
    from kernelbench.nn.crossentropy import cross_entropy as xent

    return lambda logits, targets, ignore_index, reduction: xent(
        logits, targets, ignore_index=ignore_index, reduction=reduction, impl="triton")


# liger writes the gradient into the logits during the forward (when they require grad): the
# harness restores them, untimed, before each call.
@cross_entropy.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True,
                         mutates_inputs=True)
def liger():
    """liger-kernel's LigerCrossEntropyFunction (gradient computed in the forward, loss in the logits' dtype)."""
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    # Positional: (input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction).
    return lambda logits, targets, ignore_index, reduction: LigerCrossEntropyFunction.apply(
        logits, targets, None, ignore_index, 0.0, 0.0, reduction)[0]
