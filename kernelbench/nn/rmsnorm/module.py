"""RMSNorm over the last dimension on kernelbench's Triton kernels: ``rms_norm`` and the
``RMSNorm`` module (a drop-in for ``torch.nn.RMSNorm``), with an optional fused residual add.
``rmsnorm_ref_fp32`` is the fp32 reference the kernels are tested against.

Below this file: ``function.py`` (autograd and the ops torch.compile sees), ``host.py`` (launch
configurations and plans, ``forward`` / ``backward`` on rows), ``fast_path.py`` (launch-bound
eager calls), ``kernels.py`` (the Triton kernels and their math).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ...fast_launch import fast_apply
from .._triton_support import foreign, on_input_device, require_const, runs_here
from ..autoselect import IMPLEMENTATIONS, Candidates, choose_impl
from .function import RMSNormFunction, forward_no_grad, rms_norm_compiled
from .host import MAX_N, SUPPORTED_DTYPES, check_inputs, triton_usable

__all__ = ["IMPLS", "MAX_N", "SUPPORTED_DTYPES", "RMSNorm", "rms_norm", "rmsnorm_ref_fp32", "triton_usable"]

# Eager calls skip autograd.Function.apply's Python wrapper (host time of small calls).
_rms_norm_autograd = fast_apply(RMSNormFunction)


IMPLS = ("auto", "triton", "torch")


def rmsnorm_ref_fp32(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference with statistics and scaling in fp32 (fp64 inputs stay fp64), rounded once to
    the input dtype: the math of ``kernels.py``."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(compute)
    if residual is not None:
        h = (h + residual.to(compute)).to(x.dtype).to(compute)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute)
    y = y.to(x.dtype)
    return y if residual is None else (y, h.to(x.dtype))


def _torch_rms_norm(x, weight, eps, residual):
    if residual is None:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), weight, eps), h


@on_input_device
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    residual: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension of ``x`` (fp32 / bf16 / fp16), statistics in fp32.

    ``residual``: add it to ``x`` first and return ``(y, x + residual)`` (the new residual
    stream). ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in ``torch.nn.RMSNorm``.
    ``impl``: "triton", "torch" (``torch.nn.functional.rms_norm``) or "auto" (the faster of the
    two for this shape and dtype, measured once and cached on disk; see kernelbench.nn.autoselect).
    A tensor subclass (DTensor) takes torch's path under "auto" and is an error under "triton".
    """
    if impl not in IMPLS:
        raise ValueError(f"rms_norm: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    compiling = torch.compiler.is_compiling()
    # Traced too: under torch.compile a bad input then raises this same error (fullgraph=True
    # wraps it in Dynamo's "Observed exception"); valid inputs trace to shape guards only.
    check_inputs(x, weight, residual)
    if eps is None:
        eps = torch.finfo(x.dtype).eps if x.dtype.is_floating_point else 0.0
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad)
        or (residual is not None and residual.requires_grad))
    unsafe = None if compiling else foreign(x, weight, residual)
    if impl == "auto":
        # With a residual the call is timed as made: one fused op against torch's add + norm.
        impl = "torch" if x.shape[-1] > MAX_N or unsafe else choose_impl(
            AUTOSELECT, tuple(x.shape), x.dtype, x.device, requires_grad=needs_grad,
            variant=RESIDUAL_VARIANT if residual is not None else "")
    if impl == "torch":
        return _torch_rms_norm(x, weight, eps, residual)
    if compiling:
        require_const(x.is_cuda, "rms_norm(impl='triton')")
        if x.shape[-1] > MAX_N:
            raise ValueError(f"rms_norm(impl='triton'): last dimension {x.shape[-1]} > {MAX_N}, the widest row "
                             "the Triton kernels take; use impl='torch' or impl='auto'")
        return rms_norm_compiled(x, weight, residual, float(eps))
    if unsafe or not runs_here(x) or x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm(impl='triton'): {unsafe or triton_usable(x)}; use impl='torch' or impl='auto'")
    if needs_grad:
        return _rms_norm_autograd(x, weight, residual, float(eps))
    # No gradient to record: skip autograd.Function's bookkeeping and rstd's allocation (host
    # time in launch-bound calls).
    y, h = forward_no_grad(x, weight, residual, float(eps))
    return y if h is None else (y, h)


class RMSNorm(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm`` on kernelbench's Triton kernels.

    Same constructor (``normalized_shape``, ``eps``, ``elementwise_affine``, ``device``,
    ``dtype``) plus ``impl`` ("auto", "triton", "torch"). ``forward(x, residual=None)``: with a
    residual, returns ``(y, x + residual)``.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.impl = impl
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        k = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - k:]) != self.normalized_shape:
            raise ValueError(
                f"RMSNorm: input of shape {tuple(x.shape)} does not end in normalized_shape "
                f"{self.normalized_shape}"
            )
        if k == 1:
            return rms_norm(x, self.weight, self.eps, residual=residual, impl=self.impl)
        # Several normalised dims: flatten them into one row (a view for contiguous inputs).
        flat = x.reshape(*x.shape[: x.dim() - k], -1)
        flat_res = residual.reshape(flat.shape) if residual is not None else None
        weight = self.weight.reshape(-1) if self.weight is not None else None
        out = rms_norm(flat, weight, self.eps, residual=flat_res, impl=self.impl)
        if residual is None:
            return out.reshape(x.shape)
        return out[0].reshape(x.shape), out[1].reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"impl={self.impl!r}"
        )


# ------------------------------------------------------------------------------------------------
# What impl="auto" times
# ------------------------------------------------------------------------------------------------
RESIDUAL_VARIANT = "residual"  # rms_norm(x, weight, eps, residual=...): (norm(x + residual), x + residual)


def _autoselect_runners(shape: tuple, dtype: torch.dtype, device: str, mode: str,
                        variant: str) -> dict[str, Callable[[], None]]:
    if variant not in ("", RESIDUAL_VARIANT):
        raise ValueError(f"autoselect: rmsnorm variant {variant!r}; accepted: '' or {RESIDUAL_VARIANT!r}")
    gen = torch.Generator(device=device).manual_seed(0)

    def rows() -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    x = rows()
    residual = rows() if variant == RESIDUAL_VARIANT else None
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen, device=device)).to(dtype)
    backward = mode == "fwd+bwd"
    leaves = [t for t in (x, w, residual) if t is not None]
    if backward:
        for t in leaves:
            t.requires_grad_(True)
        grads = (rows(),) if residual is None else (rows(), rows())

    def runner(impl: str) -> Callable[[], None]:
        def run() -> None:
            out = rms_norm(x, w, 1e-6, residual=residual, impl=impl)
            if backward:
                for t in leaves:
                    t.grad = None
                torch.autograd.backward(out if residual is not None else (out,), grads)

        return run

    return {impl: runner(impl) for impl in IMPLEMENTATIONS}


def _autoselect_blocker(shape: tuple) -> str | None:
    if shape[-1] > MAX_N:
        return f"last dimension {shape[-1]} > {MAX_N}: beyond the Triton kernels"
    return None


AUTOSELECT = Candidates("rmsnorm", _autoselect_runners, blocker=_autoselect_blocker)
