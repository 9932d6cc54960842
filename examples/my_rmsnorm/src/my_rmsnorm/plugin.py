"""Registers with kernelbench, through the API its own candidates use:

- ``my-triton``, a candidate of kernelbench's ``rmsnorm`` op (its workloads, reference, tolerances
  and bytes model apply);
- ``add-silu``, a new op, silu(a + b), with an eager anchor and this package's Triton kernel.

Kernels are imported inside the factories, so that listing ops imports neither torch nor Triton.
"""

from __future__ import annotations

import math

from kernelbench.ops import Dims, FunctionOp, Requires, Workload, get_op
from kernelbench.ops.base import torch_dtype


@get_op("rmsnorm").candidate("my-triton", requires=Requires(triton=True))
def my_triton_rmsnorm():
    """my_rmsnorm's Triton RMSNorm (one row per program forward, fp32 dw partials backward)."""
    from my_rmsnorm.kernels import rms_norm

    return rms_norm


def add_silu_ref(a, b):
    """F.silu(a + b) in the inputs' dtype (the harness upcasts the reference's inputs)."""
    import torch.nn.functional as F

    return F.silu(a + b)


def _inputs(workload: Workload, device: str, gen) -> dict:
    import torch

    shape, dtype = workload.spec["shape"], torch_dtype(workload.spec["dtype"])
    a = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    return {"a": a, "b": b}


def _bytes(workload: Workload, mode: str) -> int:
    size = {"fp32": 4, "bf16": 2, "fp16": 2}[workload.spec["dtype"]]
    return 3 * math.prod(workload.spec["shape"]) * size  # read a and b, write y


add_silu = FunctionOp(
    "add-silu",
    doc="silu(a + b) on two (M, N) tensors, fused",
    workloads=[
        Workload("64x256-fp32", "cpu", {"shape": (64, 256), "dtype": "fp32"}, seed=1),
        Workload("7x333-bf16", "cpu", {"shape": (7, 333), "dtype": "bf16"}, seed=2),
        Workload("16384x4096-bf16", "gpu", {"shape": (16384, 4096), "dtype": "bf16"}),
    ],
    make_inputs=_inputs,
    reference=add_silu_ref,
    outputs=("y",),
    modes=("fwd",),
    bytes_moved=_bytes,
    dims=Dims(("M", "N"), "M rows of N elements", example="16384x4096:bf16", small="64x256:fp32"),
    speed_anchor="torch-eager",
)


@add_silu.candidate("torch-eager", baseline=True)
def torch_eager():
    """F.silu(a + b): two kernels, the sum written and read back."""
    return add_silu_ref


@add_silu.candidate("triton", requires=Requires(triton=True))
def triton_add_silu():
    """my_rmsnorm's fused Triton kernel."""
    from my_rmsnorm.kernels import add_silu as fused

    return fused
