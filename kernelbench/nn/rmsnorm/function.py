"""RMSNorm's autograd: the eager ``RMSNormFunction``, and the ops torch.compile sees
(``kernelbench::rms_norm_fwd`` / ``rms_norm_bwd``, ``compiled_op``: triton_ops, so Inductor
launches the kernels from its generated code) with fakes and an autograd formula, so a model
compiles with fullgraph=True. The ops' bodies are traceable: plain allocations and
``wrap_triton`` launches of the eager path's kernels and configs (``host.fwd_spec`` /
``host.bwd_spec``), so compiled results equal eager ones bit for bit.

Eager calls take the fast path (``fast_path``) while ``kernelbench.fast_launch.enabled()``, the
plain ``host.forward`` / ``host.backward`` otherwise; both launch the same kernels and configs.
"""

from __future__ import annotations

import torch

from ... import fast_launch
from .. import _inductor_fallbacks
from .._triton_support import acc_dtype, compiled_op, static_int, wrap_triton
from . import fast_path, host
from .host import (
    MAX_N,
    as_rows,
    bwd_args,
    bwd_config,
    bwd_spec,
    check_backward_inputs,
    check_inputs,
    fwd_args,
    fwd_config,
    fwd_spec,
    recomputes_rstd,
    scratch_rstd,
)
from .kernels import (
    _rmsnorm_bwd_kernel,
    _rmsnorm_bwd_wide_kernel,
    _rmsnorm_dw_kernel,
    _rmsnorm_fwd_kernel,
    _sum_rows_kernel,
)


def forward_shaped(x, weight, residual, eps, rstd="keep"):
    """y and h (None without a residual) shaped like x, and what the backward needs: the
    normalised rows, the weight as read, rstd. ``rstd``: "keep" (a buffer of its own), "scratch"
    (nobody differentiates: a shared buffer, returned all the same) or "eager-backward" (kept
    unless ``recomputes_rstd``: then None, the backward recomputing it)."""
    n = x.shape[-1]
    x2d = as_rows(x, n)
    res2d = as_rows(residual, n) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    recompute = rstd == "eager-backward" and recomputes_rstd(x2d.shape[0], n)
    scratch = rstd == "scratch" or recompute
    rows_forward = fast_path.forward if fast_launch.enabled() else host.forward
    y, h, rstd = rows_forward(x2d, w, res2d, eps, rstd=scratch_rstd(x2d.shape[0], x2d) if scratch else None)
    saved = (h if h is not None else x2d, w, None if recompute else rstd)
    if x.dim() == 2:  # a view costs host time; launch-bound calls notice
        return y, h, saved
    return y.view(x.shape), (h.view(x.shape) if h is not None else None), saved


def forward_no_grad(x, weight, residual, eps):
    """y and h (None without a residual) of a call nobody differentiates."""
    if not fast_launch.enabled():
        y, h, _ = forward_shaped(x, weight, residual, eps, rstd="scratch")
        return y, h
    small = fast_path.small_call(x, weight, residual)
    out = small.forward(x, weight, residual, eps) if small is not None else None
    if out is None:
        y, h, _ = forward_shaped(x, weight, residual, eps, rstd="scratch")
        fast_path.bind_small_call(x, weight, residual)
        return y, h
    return out


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        fast = fast_launch.enabled()
        small = fast_path.small_call(x, weight, residual) if fast else None
        out = small.forward(x, weight, residual, eps) if small is not None else None
        if out is not None:
            y, h = out
            ctx.save_for_backward(h if h is not None else x, weight, None)
        else:
            small = None
            y, h, saved = forward_shaped(x, weight, residual, eps, rstd="eager-backward")
            ctx.save_for_backward(*saved)
            if fast:
                fast_path.bind_small_call(x, weight, residual)
        ctx.small, ctx.shape, ctx.has_residual, ctx.eps = small, x.shape, residual is not None, eps
        ctx.set_materialize_grads(False)
        return y if h is None else (y, h)

    @staticmethod
    def backward(ctx, dy, dh=None):
        normed, weight, rstd = ctx.saved_tensors
        small = ctx.small
        grads = small.backward(normed, weight, dy, dh, ctx.eps) if small is not None and dy is not None else None
        if grads is not None:
            dx, dw = grads
            return dx, dw, (dx if ctx.has_residual else None), None
        # Rows again: the small call saves x as given, and saved-tensor hooks may hand back any layout.
        n = normed.shape[-1]
        normed = as_rows(normed, n)
        weight = weight.contiguous() if weight is not None else None
        dy2d = as_rows(dy, n) if dy is not None else torch.zeros_like(normed)
        dres2d = as_rows(dh, n) if dh is not None else None
        rows_backward = fast_path.backward if fast_launch.enabled() else host.backward
        dx, dw = rows_backward(normed, weight, rstd, dy2d, dres2d, eps=ctx.eps)
        if len(ctx.shape) != 2:
            dx = dx.view(ctx.shape)
        dres = dx if ctx.has_residual else None  # autograd clones where one tensor feeds two leaves
        return dx, dw, dres, None


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees
# ------------------------------------------------------------------------------------------------
def _check_forward(x, weight, residual) -> None:
    check_inputs(x, weight, residual)
    if x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm(impl='triton'): last dimension {x.shape[-1]} > {MAX_N}, the widest row the "
                         "Triton kernels take; use impl='torch' or impl='auto'")


@compiled_op("kernelbench::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd_op(
    x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, rstd): h = x + residual (an empty tensor without a residual), rstd of shape (M,)."""
    _check_forward(x, weight, residual)
    n = x.shape[-1]
    x2d = as_rows(x, n)
    res2d = as_rows(residual, n) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    m = x2d.shape[0]
    y = torch.empty_like(x2d)
    h = torch.empty_like(x2d) if res2d is not None else x.new_empty(0)
    rstd = x.new_empty((m,), dtype=acc_dtype(x.dtype))
    if m:
        # The hidden size decides the launch: specialized under dynamic shapes.
        grid, meta = fwd_spec(m, n, x.dtype, res2d is not None, w is not None, fwd_config(static_int(n)))
        wrap_triton(_rmsnorm_fwd_kernel)[grid](*fwd_args(x2d, res2d, w, y, h if res2d is not None else None,
                                                         rstd, eps), **meta)
    return y.view(x.shape), (h.view(x.shape) if res2d is not None else h), rstd


@_rms_norm_fwd_op.register_fake
def _(x, weight, residual, eps):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    _check_forward(x, weight, residual)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    h = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    return x.new_empty(x.shape), h, x.new_empty((rows,), dtype=acc_dtype(x.dtype))


@compiled_op("kernelbench::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(
    dy: torch.Tensor, dh: torch.Tensor | None, normed: torch.Tensor, weight: torch.Tensor | None,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) from the normalised input h (or x); dw is an empty tensor without a weight."""
    check_backward_inputs(dy, dh, normed, weight, rstd)
    n = normed.shape[-1]
    x2d, dy2d = as_rows(normed, n), as_rows(dy, n)
    dres2d = as_rows(dh, n) if dh is not None else None
    w = weight.contiguous() if weight is not None else None
    m = x2d.shape[0]
    dx = torch.empty_like(x2d)
    if not m:
        return dx.view(normed.shape), (torch.zeros_like(weight) if w is not None else normed.new_empty(0))
    spec = bwd_spec(bwd_args(x2d, w, dy2d, dres2d, rstd, dx, rstd), w is not None, dres2d is not None,
                    bwd_config(static_int(n)))  # the hidden size decides: specialized under dynamic shapes
    if w is None:
        dw = out = normed.new_empty(0)
    elif spec.sum_rows is None:  # one program writes dw itself
        dw = out = torch.empty_like(w)
    else:
        dw, out = torch.empty_like(w), x2d.new_empty((spec.partial_rows, n), dtype=acc_dtype(x2d.dtype))
    args = bwd_args(x2d, w, dy2d, dres2d, rstd, dx, out if spec.dw_columns is None and w is not None else rstd)
    if spec.kernel == "wide":
        wrap_triton(_rmsnorm_bwd_wide_kernel)[spec.grid](*args, **spec.meta)
    else:
        wrap_triton(_rmsnorm_bwd_kernel)[spec.grid](*args, 0.0, **spec.meta)
    if spec.dw_columns is not None:
        wrap_triton(_rmsnorm_dw_kernel)[spec.dw_columns[0]](
            x2d, x2d.stride(0), dy2d, dy2d.stride(0), rstd, out, m, n, spec.rows_per_split, **spec.dw_columns[1])
    if spec.sum_rows is not None:
        wrap_triton(_sum_rows_kernel)[spec.sum_rows[0]](out, dw, spec.partial_rows, n, **spec.sum_rows[1])
    return dx.view(normed.shape), dw


@_rms_norm_bwd_op.register_fake
def _(dy, dh, normed, weight, rstd):
    check_backward_inputs(dy, dh, normed, weight, rstd)
    dw = weight.new_empty(weight.shape) if weight is not None else normed.new_empty(0)
    return normed.new_empty(normed.shape), dw


def _op_setup_context(ctx, inputs, output):
    x, weight, residual, _ = inputs
    _, h, rstd = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if residual is not None else x, weight, rstd)
    # An output nobody reads (the final norm's h) gets None, not a zeros [tokens, hidden] buffer
    # held into the backward (results/2026-11-28-h200-tied-rows-compiled-peak).
    ctx.set_materialize_grads(False)


def _op_backward(ctx, dy, dh, _drstd):
    normed, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(normed)
    dx, dw = torch.ops.kernelbench.rms_norm_bwd(dy, dh if ctx.has_residual else None, normed, weight, rstd)
    return dx, (dw if weight is not None else None), (dx if ctx.has_residual else None), None


_rms_norm_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def rms_norm_compiled(x, weight, residual, eps):
    """The path taken under torch.compile: one custom op, whose output h is dropped without a residual."""
    y, h, _ = torch.ops.kernelbench.rms_norm_fwd(x, weight, residual, eps)
    return y if residual is None else (y, h)


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.rms_norm_fwd.default,
    torch.ops.kernelbench.rms_norm_bwd.default,
)
