"""The SwiGLU activation of a Llama MLP: out = silu(gate) * up, gate and up of one shape.

Bytes model (element size s): the forward reads gate and up and writes out, 3s per element;
forward+backward adds reading dy, gate and up and writing dgate and dup, 8s per element in all.
That is the fused minimum: eager PyTorch moves 5s forward (silu, then mul) and 9s backward.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .base import Requires, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch


def swiglu_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in the inputs' dtype (the harness upcasts the reference's inputs)."""
    import torch.nn.functional as F

    return F.silu(gate) * up


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    import torch

    shape, dtype = workload.spec["shape"], torch_dtype(workload.spec["dtype"])
    gate = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    up = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    return {"gate": gate, "up": up}


def _bytes(workload: Workload, mode: str) -> int:
    import torch

    numel = math.prod(workload.spec["shape"])
    size = torch.empty((), dtype=torch_dtype(workload.spec["dtype"])).element_size()
    return numel * size * (3 if mode == "fwd" else 8)


def _workload(name: str, tier: str, shape: tuple[int, ...], dtype: str, seed: int = 0) -> Workload:
    return Workload(name, tier, {"shape": shape, "dtype": dtype}, seed=seed)


swiglu = FunctionOp(
    "swiglu",
    doc="SwiGLU activation silu(gate) * up, forward and backward",
    model_layer="silu_mul",
    workloads=[
        _workload("4x64-fp32", "cpu", (4, 64), "fp32", seed=1),
        # Llama-1B's MLP at batch 4 x 2048 tokens: (8192 tokens, intermediate 8192).
        _workload("llama-1b-8192x8192-bf16", "gpu", (8192, 8192), "bf16"),
        # Llama-3-8B's intermediate (14336) at 4096 tokens.
        _workload("4096x14336-bf16", "gpu", (4096, 14336), "bf16"),
    ],
    speed_anchor="torch-compile",
    make_inputs=_inputs,
    reference=swiglu_ref,
    outputs=("out",),
    grad_inputs=("gate", "up"),
    modes=("fwd", "fwd+bwd"),
    bytes_moved=_bytes,
    dims=Dims(("M", "N"), "M tokens, N the MLP's intermediate size (gate and up are M x N)",
              example="8192x8192:bf16", small="4x64:fp32"),
    # liger writes dgate and dup into gate and up.
    inplace=("gate", "up"),
)


@swiglu.candidate("torch-eager", baseline=True)
def torch_eager():
    """F.silu(gate) * up in eager PyTorch: two kernels forward, three backward."""
    return swiglu_ref


@swiglu.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch.compile of the eager SwiGLU."""
    return compile_anchor(swiglu_ref)


@swiglu.candidate("triton", requires=Requires(triton=True))
def triton_swiglu():
    """kernelbench.nn.silu_mul: one fused kernel forward, one backward (sigmoid recomputed)."""
    from kernelbench.nn.swiglu import silu_mul

    return lambda gate, up: silu_mul(gate, up, impl="triton")


# Some liger-kernel versions write dgate and dup into the saved gate and up: the harness restores
# the inputs before each rep (untimed).
@swiglu.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True,
                  mutates_inputs=True)
def liger():
    """liger-kernel's LigerSiLUMulFunction."""
    import torch.distributed.tensor  # noqa: F401  (liger's forward checks for DTensor inputs)
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return lambda gate, up: LigerSiLUMulFunction.apply(gate, up)
