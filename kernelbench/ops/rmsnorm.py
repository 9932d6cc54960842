"""RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32.

Bytes model (element size s): forward reads x and writes y, 2s per element; forward+backward
adds reading x and dy and writing dx, 5s per element in all (the weight is negligible).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .base import Requires, Tolerance, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch


def rmsnorm_ref_hf(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: statistics in fp32, scaled back in the input dtype."""
    import torch

    dtype = x.dtype
    xf = x.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else x
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    import torch

    shape, dtype = workload.spec["shape"], torch_dtype(workload.spec["dtype"])
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=gen, device=device, dtype=torch.float32)).to(dtype)
    return {"x": x, "weight": weight, "eps": 1e-6}


def _bytes(workload: Workload, mode: str) -> int:
    numel = math.prod(workload.spec["shape"])
    import torch

    size = torch.empty((), dtype=torch_dtype(workload.spec["dtype"])).element_size()
    return numel * size * (2 if mode == "fwd" else 5)


def _workload(name: str, tier: str, shape: tuple[int, ...], dtype: str, seed: int = 0,
              host_timing: bool = False) -> Workload:
    spec = {"shape": shape, "dtype": dtype}
    if host_timing:  # the harness adds the per-call host time beside the device time
        spec["host_timing"] = True
    return Workload(name, tier, spec, seed=seed)


# The sweep keeps M*N = 2^27 elements (256 MiB of bf16), the size of the headline shape.
SWEEP = [_workload(f"sweep-n{n}-bf16", "gpu", (2**27 // n, n), "bf16") for n in
         (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)]

rmsnorm = FunctionOp(
    "rmsnorm",
    doc="RMSNorm (x, weight, eps) over the last dim, forward and backward",
    model_layer="norm",
    workloads=[
        _workload("64x256-fp32", "cpu", (64, 256), "fp32", seed=1),
        _workload("1x760-fp32", "cpu", (1, 760), "fp32", seed=2),
        _workload("5x123x123-bf16", "cpu", (5, 123, 123), "bf16", seed=3),
        _workload("32768x4096-bf16", "gpu", (32768, 4096), "bf16"),
        # Decode-sized / small per-GPU batch: the host's time per call decides the speed.
        _workload("host-8x4096", "gpu", (8, 4096), "bf16", host_timing=True),
        *SWEEP,
    ],
    speed_anchor="torch-compile",
    make_inputs=_inputs,
    reference=rmsnorm_ref_hf,
    outputs=("y",),
    grad_inputs=("x", "weight"),
    modes=("fwd", "fwd+bwd"),
    bytes_moved=_bytes,
    dims=Dims(("M", "N"), "M rows (tokens), each of N features normalised", example="16384x4096:bf16",
              small="64x256:fp32"),
    # dweight sums M products rounded to bf16/fp16: its error is absolute (~sqrt(M) roundings),
    # so near-zero sums fail any relative bound; the norm of the error is what stays small.
    tensor_tolerances={"grad_weight": {
        # fp32 too: 64 products summed in another order leave ~3e-6 absolute on a sum near 0.
        "fp32": Tolerance(0, 0, fro=1e-5, reason="grad_weight: sum of M products, order-dependent"),
        "bf16": Tolerance(0, 0, fro=1e-2, reason="grad_weight: sum of M rounded products"),
        "fp16": Tolerance(0, 0, fro=2e-3, reason="grad_weight: sum of M rounded products"),
    }},
)


@rmsnorm.candidate("torch-eager", baseline=True)
def torch_eager():
    """Hugging Face-style eager RMSNorm, fp32 statistics."""
    return rmsnorm_ref_hf


@rmsnorm.candidate("torch-rms-norm", baseline=True)
def torch_rms_norm():
    """torch.nn.functional.rms_norm."""
    import torch.nn.functional as F

    return lambda x, weight, eps: F.rms_norm(x, (x.shape[-1],), weight, eps)


@rmsnorm.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch.compile of the eager RMSNorm."""
    return compile_anchor(rmsnorm_ref_hf)


@rmsnorm.candidate("triton", requires=Requires(triton=True))
def triton_rmsnorm():
    """kernelbench.nn.rms_norm's Triton kernels (persistent backward, fp32 dw partials)."""
    from kernelbench.nn.rmsnorm import rms_norm

    return lambda x, weight, eps: rms_norm(x, weight, eps, impl="triton")


@rmsnorm.candidate("auto", requires=Requires(cuda=True))
def auto_rmsnorm():
    """kernelbench.nn.rms_norm as users get it (impl="auto"): Triton or F.rms_norm, whichever
    this GPU ran faster for the shape, dtype and mode (see ``kernelbench autoselect``)."""
    from kernelbench.nn.rmsnorm import rms_norm

    return lambda x, weight, eps: rms_norm(x, weight, eps)


@rmsnorm.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True)
def liger():
    """liger-kernel's LigerRMSNormFunction, llama casting, dy not overwritten."""
    import torch.distributed.tensor  # noqa: F401  (liger's forward checks for DTensor inputs)
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # Positional: (X, W, eps, offset, casting_mode, in_place). in_place=False keeps the
    # harness's upstream gradient intact between reps.
    return lambda x, weight, eps: LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)
