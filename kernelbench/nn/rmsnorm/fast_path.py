"""RMSNorm's fast path for launch-bound eager calls: the same kernels, plans and configs as
``host.forward`` / ``host.backward``, launched with pointers as ints (``DirectLaunch``).

- ``forward`` / ``backward`` on rows: after a plan's first call with every pointer 16-byte
  aligned, its ``DirectLaunch`` takes the pointers as ints, skipping the per-argument keying of
  ``CachedLauncher`` (host time of small calls).
- ``SmallCall``: for one launch-bound input signature (contiguous rows whose backward is one
  program recomputing rstd), the launches' fixed arguments found once, so a call does only its
  allocations, its pointers and one direct launch per direction: where the host decides the
  speed, Python is most of a call (results/2026-11-24-h100-host-threads/README.md).

Taken only while ``kernelbench.fast_launch.enabled()``; a direct launch that cannot run (a
pointer off a 16-byte boundary, a profiler's launch hooks, the fast path switched off since the
plan was bound) falls back to the plan's ``CachedLauncher``.
"""

from __future__ import annotations

import torch

from ...fast_launch import CachedLauncher, DirectLaunch, PlanCache, current_device
from .._triton_support import acc_dtype
from . import host


class _Bound:
    """A plan (``host.BwdPlan`` for the backward) and its main kernel's launcher; after the first
    call with every pointer 16-byte aligned, the ``DirectLaunch`` of that specialization (False
    where there is none). The plan key fixes every dtype and int the kernel specializes on, so
    aligned calls of one plan all specialize alike."""

    __slots__ = ("plan", "launcher", "direct")

    def __init__(self, plan, launcher: CachedLauncher) -> None:
        self.plan, self.launcher, self.direct = plan, launcher, None

    def first_or_fallback(self, aligned: bool, args) -> None:
        """Launch ``args`` (tensors) through the CachedLauncher; the first aligned call also
        binds the DirectLaunch."""
        if aligned and self.direct is None:
            self.direct = self.launcher.direct(*args) or False
        else:
            self.launcher(*args)


# By the host's plan keys (config None: the defaults).
_fwd_bound: PlanCache = PlanCache()
_bwd_bound: PlanCache = PlanCache()


def forward(x2d, weight, residual2d, eps, *, rstd=None):
    """``host.forward`` with the default config, its launch direct where it can be."""
    m, n = x2d.shape
    y = torch.empty_like(x2d)
    h = torch.empty_like(y) if residual2d is not None else None
    if rstd is None:
        rstd = torch.empty(m, dtype=acc_dtype(x2d.dtype), device=x2d.device)
    if m == 0:
        return y, h, rstd
    device = torch.cuda.current_device() if x2d.is_cuda else -1  # host.launch_device, inline
    x_stride, y_stride = x2d.stride(0), y.stride(0)
    res_stride = residual2d.stride(0) if residual2d is not None else 0
    key = (m, n, x2d.dtype, device, x_stride, y_stride, residual2d is not None, res_stride,
           weight.dtype if weight is not None else None, None)  # host.fwd_key
    bound = _fwd_bound.get(key)
    if bound is None:
        bound = _fwd_bound.remember(key, _Bound(None, host.fwd_launcher(key)))
    xp, yp, sp = x2d.data_ptr(), y.data_ptr(), rstd.data_ptr()
    wp = weight.data_ptr() if weight is not None else xp
    rp = residual2d.data_ptr() if residual2d is not None else xp
    hp = h.data_ptr() if h is not None else yp
    aligned = not (xp | yp | sp | wp | rp | hp) & 15
    direct = bound.direct
    if aligned and direct and direct(device, xp, x_stride, rp, res_stride, wp, yp, y_stride, hp,
                                     h.stride(0) if h is not None else 0, sp, m, n, eps):
        return y, h, rstd
    bound.first_or_fallback(aligned, host.fwd_args(x2d, residual2d, weight, y, h, rstd, eps))
    return y, h, rstd


def backward(x2d, weight, rstd, dy2d, dres2d, *, eps: float = 0.0):
    """``host.backward`` with the default config, its main launch direct where it can be."""
    m, n = x2d.shape
    dx = torch.empty_like(x2d)
    has_weight = weight is not None
    if m == 0:
        return dx, (torch.zeros_like(weight) if has_weight else None)
    device = torch.cuda.current_device() if x2d.is_cuda else -1
    x_stride, dy_stride, dx_stride = x2d.stride(0), dy2d.stride(0), dx.stride(0)
    dres_stride = dres2d.stride(0) if dres2d is not None else 0
    recompute = rstd is None
    key = (m, n, x2d.dtype, device, weight.dtype if has_weight else None, dy2d.dtype,
           dres2d.dtype if dres2d is not None else None, x_stride, dy_stride, dres_stride, dx_stride,
           recompute, None)  # host.bwd_key
    if recompute:
        rstd = x2d  # a placeholder pointer: the kernel reads no rstd
    bound = _bwd_bound.get(key)
    if bound is None:
        plan = host.bwd_plan(key, host.bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, rstd))
        bound = _bwd_bound.remember(key, _Bound(plan, plan.main))
    plan = bound.plan
    dw, out = host.bwd_outputs(plan, x2d, weight)
    main_out = out if plan.dw_columns is None and out is not None else rstd
    xp, dyp, sp, dxp = x2d.data_ptr(), dy2d.data_ptr(), rstd.data_ptr(), dx.data_ptr()
    wp = weight.data_ptr() if has_weight else xp
    dresp = dres2d.data_ptr() if dres2d is not None else dyp
    outp = main_out.data_ptr()
    aligned = not (xp | dyp | sp | dxp | wp | dresp | outp) & 15
    direct = bound.direct
    tail = (m, n, eps) if plan.spec.takes_eps else (m, n)
    if not (aligned and direct and direct(device, xp, x_stride, wp, dyp, dy_stride, dresp, dres_stride, sp,
                                          dxp, dx_stride, outp, *tail)):
        args = host.bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, main_out)  # built only off the direct path
        bound.first_or_fallback(aligned, [*args, eps] if plan.spec.takes_eps else args)
    return dx, host.reduce_dw(plan, x2d, dy2d, rstd, out, dw, weight)


# ------------------------------------------------------------------------------------------------
# Launch-bound eager calls: what every call of one input signature shares, found once
# ------------------------------------------------------------------------------------------------
class SmallCall:
    """The eager forward and backward of one launch-bound input signature: contiguous rows whose
    backward is one program recomputing rstd (``host.recomputes_rstd``).

    Either direction returns None where its launch cannot be direct (a pointer off a 16-byte
    boundary, a profiler's launch hooks, the fast path off, a gradient laid out otherwise, the
    backward's plan not yet bound by a first backward); the caller then takes the general path."""

    __slots__ = ("fwd", "bwd", "bwd_key", "device", "m", "n", "res_stride", "rstd", "rstd_ptr")

    def __init__(self, fwd: DirectLaunch, bwd_key: tuple, device: int, m: int, n: int, has_residual: bool,
                 rstd: torch.Tensor) -> None:
        self.fwd, self.bwd, self.bwd_key = fwd, None, bwd_key
        self.device, self.m, self.n = device, m, n
        self.res_stride = n if has_residual else 0
        self.rstd, self.rstd_ptr = rstd, rstd.data_ptr()  # scratch: written, never read

    def forward(self, x, weight, residual, eps):
        """(y, h or None), or None."""
        n = self.n
        y = torch.empty_like(x)
        xp, yp = x.data_ptr(), y.data_ptr()
        wp = weight.data_ptr() if weight is not None else xp
        if residual is None:
            h, rp, hp = None, xp, yp
        else:
            h = torch.empty_like(x)
            rp, hp = residual.data_ptr(), h.data_ptr()
        if (xp | wp | rp) & 15 or not self.fwd(self.device, xp, n, rp, self.res_stride, wp, yp, n, hp,
                                                self.res_stride, self.rstd_ptr, self.m, n, eps):
            return None
        return y, h

    def backward(self, normed, weight, dy, dh, eps):
        """(dx, dw or None), or None."""
        bwd = self.bwd
        if bwd is None:
            bound = _bwd_bound.get(self.bwd_key)
            if bound is None or not bound.direct:
                return None
            bwd = self.bwd = bound.direct
        # Saved-tensor hooks (offloading, checkpointing) may hand back other tensors than were saved.
        if (dh is None) != (self.res_stride == 0) or dy.dtype != normed.dtype or not (
                dy.is_contiguous() and normed.is_contiguous() and (weight is None or weight.is_contiguous())
                and (dh is None or dh.is_contiguous())):
            return None
        n = self.n
        dx = torch.empty_like(normed)
        xp, dyp, dxp = normed.data_ptr(), dy.data_ptr(), dx.data_ptr()
        dresp = dh.data_ptr() if dh is not None else dyp
        if weight is None:
            dw, wp, dwp = None, xp, xp
        else:
            dw = torch.empty_like(weight)
            wp, dwp = weight.data_ptr(), dw.data_ptr()
        if (xp | wp | dyp | dresp) & 15:
            return None
        # The rstd argument is a placeholder: the one program recomputes rstd from the rows.
        if not bwd(self.device, xp, n, wp, dyp, n, dresp, self.res_stride, xp, dxp, n, dwp, self.m, n, eps):
            return None
        return dx, dw


# By (shape, dtype, weight dtype, residual is None, device): a bound SmallCall, or False where the
# signature never takes one (too large, no direct launch here).
_small_calls: PlanCache = PlanCache()


def small_call(x, weight, residual) -> SmallCall | None:
    """The SmallCall this call can take, or None."""
    small = _small_calls.get((x.shape, x.dtype, weight.dtype if weight is not None else None, residual is None,
                              x.get_device()))
    if (small and x.is_contiguous() and (weight is None or weight.is_contiguous())
            and (residual is None or residual.is_contiguous()) and current_device() == small.device):
        return small
    return None


def _direct_launch_device(x) -> int | None:
    """The device a direct launch for ``x`` runs on: x's, where it is the current CUDA device (the
    one Triton compiled the plans' launches for); None where there is none."""
    if not x.is_cuda:
        return None
    device = x.get_device()
    return device if device == current_device() else None


def bind_small_call(x, weight, residual) -> None:
    """After a general call: remember whether this signature takes a SmallCall, and bind it once
    the forward plan's direct launch is (its first aligned call binds it)."""
    key = (x.shape, x.dtype, weight.dtype if weight is not None else None, residual is None, x.get_device())
    if key in _small_calls:
        return
    device = _direct_launch_device(x)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if device is None or m == 0 or not host.recomputes_rstd(m, n):
        _small_calls.remember(key, False)
        return
    if not (x.is_contiguous() and (weight is None or weight.is_contiguous())
            and (residual is None or residual.is_contiguous())):
        return  # decided by a contiguous call
    has_residual = residual is not None
    weight_dtype = weight.dtype if weight is not None else None
    bound = _fwd_bound.get((m, n, x.dtype, device, n, n, has_residual, n if has_residual else 0, weight_dtype, None))
    if bound is None or bound.direct is None:
        return  # not bound yet: no aligned call so far
    if not bound.direct:
        _small_calls.remember(key, False)
        return
    bwd_key = (m, n, x.dtype, device, weight_dtype, x.dtype, x.dtype if has_residual else None, n, n,
               n if has_residual else 0, n, True, None)
    _small_calls.remember(key, SmallCall(bound.direct, bwd_key, device, m, n, has_residual,
                                         host.scratch_rstd(m, x)))


def clear() -> None:
    """Forget every bound plan and small call (they are bound again on the next calls)."""
    for cache in (_fwd_bound, _bwd_bound, _small_calls):
        cache.clear()
