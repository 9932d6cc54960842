"""The SwiGLU activation, ``silu(gate) * up``, fused in one Triton kernel forward and one
backward: ``silu_mul``.

In a Llama MLP, ``down_proj(silu_mul(gate_proj(x), up_proj(x)))``. ``silu_mul_ref_fp32`` is the
reference the kernels are tested against.

Below this file: ``function.py`` (autograd and the ops torch.compile sees), ``host.py`` (launch
configuration, checks, ``forward`` / ``backward``), ``kernels.py`` (the Triton kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...fast_launch import fast_apply
from .._triton_support import foreign, on_input_device, require_const, runs_here, runs_here_const
from .._triton_support import why_not_here as triton_usable
from ..autoselect import IMPLEMENTATIONS, Candidates, choose_impl
from . import host
from .function import SiluMulFunction
from .host import SUPPORTED_DTYPES, SiluMulConfig, check_inputs, default_config

__all__ = ["AUTOSELECT", "IMPLS", "SUPPORTED_DTYPES", "SiluMulConfig", "default_config", "silu_mul",
           "silu_mul_ref_fp32", "triton_usable"]

# Eager calls skip autograd.Function.apply's Python wrapper (host time of small calls).
_silu_mul_autograd = fast_apply(SiluMulFunction)

IMPLS = ("auto", "triton", "torch")


def silu_mul_ref_fp32(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Reference computed in fp32 (fp64 inputs stay fp64) and rounded once to the input dtype:
    the math of ``kernels.py``."""
    compute = torch.float64 if gate.dtype == torch.float64 else torch.float32
    return (F.silu(gate.to(compute)) * up.to(compute)).to(gate.dtype)


@on_input_device
def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` for gate and up of one shape, dtype (fp32 / bf16 / fp16 / fp64) and
    device; math in fp32 (fp64 for fp64), the result rounded once to the input dtype.

    ``impl``: "triton" (one fused kernel forward, one backward), "torch"
    (``F.silu(gate) * up``) or "auto": on a CUDA tensor the faster of the two for this shape and
    dtype (measured once and cached on disk, see kernelbench.nn.autoselect: where the host's
    launch time decides, torch's two ATen calls can beat one Python autograd call), Triton in
    the interpreter (TRITON_INTERPRET=1), else torch; a tensor subclass (DTensor) takes torch's
    path under "auto" and is an error under "triton". Non-contiguous inputs are copied first; the
    result is contiguous. Under ``torch.compile`` the Triton path is the custom ops
    ``kernelbench::silu_mul_fwd`` / ``silu_mul_bwd`` (no graph break, forward or backward).
    """
    if impl not in IMPLS:
        raise ValueError(f"silu_mul: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    compiling = torch.compiler.is_compiling()
    # Traced too: under torch.compile a bad input then raises this same error (fullgraph=True
    # wraps it in Dynamo's "Observed exception"); valid inputs trace to shape guards only.
    check_inputs(gate, up)
    unsafe = None if compiling else foreign(gate, up)
    if impl == "auto":
        usable = runs_here_const(gate.is_cuda) if compiling else runs_here(gate) and not unsafe
        impl = "triton" if usable else "torch"
        if usable and gate.is_cuda:  # the interpreter has no timings to choose by
            needs_grad = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)
            impl = choose_impl(AUTOSELECT, tuple(gate.shape), gate.dtype, gate.device, requires_grad=needs_grad)
    if impl == "torch":
        return F.silu(gate) * up
    if compiling:
        require_const(gate.is_cuda, "silu_mul(impl='triton')")
        return torch.ops.kernelbench.silu_mul_fwd(gate, up)
    if unsafe or not runs_here(gate):
        raise ValueError(f"silu_mul(impl='triton'): {unsafe or triton_usable(gate)}; use impl='torch' or impl='auto'")
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _silu_mul_autograd(gate, up)
    # No gradient to record: skip autograd.Function's bookkeeping (host time in launch-bound calls).
    return host.forward(gate, up)


# ------------------------------------------------------------------------------------------------
# What impl="auto" times
# ------------------------------------------------------------------------------------------------
def _autoselect_runners(shape: tuple, dtype: torch.dtype, device: str, mode: str,
                        variant: str) -> dict[str, Callable[[], None]]:
    if variant:
        raise ValueError(f"autoselect: swiglu has no variants, got {variant!r}")
    gen = torch.Generator(device=device).manual_seed(0)
    gate, up = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype) for _ in range(2))
    backward = mode == "fwd+bwd"
    if backward:
        gate.requires_grad_(True)
        up.requires_grad_(True)
        dy = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    def runner(impl: str) -> Callable[[], None]:
        def run() -> None:
            y = silu_mul(gate, up, impl=impl)
            if backward:
                gate.grad = up.grad = None
                y.backward(dy)

        return run

    return {impl: runner(impl) for impl in IMPLEMENTATIONS}


AUTOSELECT = Candidates("swiglu", _autoselect_runners)
