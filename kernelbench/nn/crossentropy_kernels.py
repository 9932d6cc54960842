"""Cross-entropy kernels, their launch configuration, the autograd Function and the custom ops.

Math, for a row x of V logits with target t (in fp32 whatever the logits' dtype; fp64 for fp64):

    lse   = log(sum_j exp(x_j))                  (running max and sum of exp, chunk by chunk)
    loss  = lse - x_t                            (0 for a row whose target is ignore_index)
    dx_j  = (exp(x_j - lse) - [j == t]) * g      (0 for an ignored row)

g, the row's upstream gradient: grad_output[row] for reduction "none", grad_output for "sum",
grad_output / n_valid for "mean", where n_valid (the rows not ignored) is counted on the device by
the forward, so neither direction waits for the host.

Kernels, the row kernels launched with a frozen ``XentConfig`` (defaults per V from
``fwd_config`` / ``bwd_config``):
- ``_xent_fwd_kernel``: one row per program, read once in chunks of ``block_v``; per chunk one
  max reduction, the sum of exp kept per lane and reduced once at the end; the target's logit is
  loaded directly. Writes the row's loss and lse (saved for the backward). Ignored rows read
  nothing.
- ``_xent_reduce_kernel`` ("mean" / "sum"): one program sums the row losses and counts the valid
  targets in a fixed order, so the loss is the same bit for bit on every run.
- ``_xent_bwd_kernel``: one row per program, reads the row once and writes dx in the logits'
  dtype; ignored rows only write zeros.

Bytes: the forward reads M * V logits, the backward reads and writes M * V, besides per-row terms.
Targets outside [0, V) other than ignore_index are not checked on the host (that would be a
device-to-host sync): their row's loss is NaN and their gradient lacks the one-hot term.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: impl="auto" resolves to "torch"
    from ._no_triton import tl, triton

from ..fast_launch import CachedLauncher, PlanCache
from . import _inductor_fallbacks
from ._triton_support import (
    acc_dtype,
    capped_power_of_two,
    compiled_op,
    is_power_of_two,
    static_int,
    tl_acc,
    wrap_triton,
)

# fp64 is computed in fp64 throughout (for gradcheck); the others in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
REDUCTIONS = ("mean", "sum", "none")

# Widest chunk a program holds: at 16 warps, 16 values a thread (two 16-byte bf16 vectors).
_MAX_BLOCK_V = 8192
_VALUES_PER_THREAD = 16
# The forward keeps a lane's sum of exp besides the chunk (two programs of 16 warps per SM by
# registers): two more chunks in flight through shared memory keep the loads going while a
# program reduces. The backward, with half the registers, fits twice the programs instead.
_FWD_STAGES = 3
_BWD_STAGES = 1
# The reduction over rows: 4096 rows a step at 16 warps (8 values a thread).
_REDUCE_BLOCK_M = 4096


@dataclass(frozen=True)
class XentConfig:
    """Launch of the forward or backward kernel: one row per program in chunks of ``block_v``,
    ``num_stages`` chunks in flight (1: no software pipelining)."""

    block_v: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        if not is_power_of_two(self.block_v):
            raise ValueError(f"cross_entropy XentConfig: block_v must be a power of two, got {self.block_v}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"cross_entropy XentConfig: num_warps must be one of 1, 2, 4, 8, 16, 32, "
                             f"got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"cross_entropy XentConfig: num_stages must be 1 to 4, got {self.num_stages}")


def _chunk(v: int) -> tuple[int, int]:
    block_v = min(_MAX_BLOCK_V, triton.next_power_of_2(v))
    return block_v, max(1, min(16, block_v // (32 * _VALUES_PER_THREAD)))


@functools.cache
def fwd_config(v: int) -> XentConfig:
    """The forward's default launch for rows of V logits."""
    block_v, warps = _chunk(v)
    # Pipelining only pays when a row has chunks to overlap.
    return XentConfig(block_v, warps, _FWD_STAGES if v > block_v else 1)


@functools.cache
def bwd_config(v: int) -> XentConfig:
    """The backward's default launch for rows of V logits."""
    block_v, warps = _chunk(v)
    return XentConfig(block_v, warps, _BWD_STAGES if v > block_v else 1)


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _xent_fwd_kernel(
    x_ptr, x_stride,  # logits (M, V), unit column stride
    t_ptr,  # targets (M,) int64
    loss_ptr,  # (M,) row losses, ACC
    lse_ptr,  # (M,) logsumexp of each row, ACC (0 for ignored rows)
    V, ignore_index,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,  # chunks in flight through shared memory (1: loads straight to registers)
    ACC: tl.constexpr,  # fp32; fp64 for fp64 logits
):
    row = tl.program_id(0)
    target = tl.load(t_ptr + row)
    if target != ignore_index:
        x_row = x_ptr + row.to(tl.int64) * x_stride
        # The target's logit first: its load's latency hides under the row's.
        in_range = (target >= 0) & (target < V)
        x_t = tl.load(x_row + target, mask=in_range, other=float("nan")).to(ACC)
        cols = tl.arange(0, BLOCK_V)
        m = tl.full([], float("-inf"), ACC)
        s = tl.zeros([BLOCK_V], ACC)
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(ACC)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            # A row starting with -inf chunks keeps m = -inf: shift by 0 there, not by -inf (NaN).
            shift = tl.where(m_new == float("-inf"), 0.0, m_new).to(ACC)
            s = s * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        lse = tl.where(m == float("-inf"), 0.0, m).to(ACC) + tl.log(tl.sum(s, axis=0))
        tl.store(loss_ptr + row, lse - x_t)
        tl.store(lse_ptr + row, lse)
    else:
        tl.store(loss_ptr + row, tl.zeros([], ACC))
        tl.store(lse_ptr + row, tl.zeros([], ACC))  # never read: written so the op's outputs are defined


@triton.jit
def _xent_reduce_kernel(
    loss_rows_ptr,  # (M,) row losses, ACC
    t_ptr,  # targets (M,) int64
    out_ptr,  # () the reduced loss, ACC
    n_valid_ptr,  # () rows whose target is not ignore_index, ACC
    M, ignore_index,
    MEAN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ACC: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_M)
    total = tl.zeros([BLOCK_M], ACC)
    count = tl.zeros([BLOCK_M], tl.int32)
    for start in range(0, M, BLOCK_M):
        rows = start + offs
        mask = rows < M
        total += tl.load(loss_rows_ptr + rows, mask=mask, other=0.0)
        t = tl.load(t_ptr + rows, mask=mask, other=0)
        count += ((t != ignore_index) & mask).to(tl.int32)
    n_valid = tl.sum(count, axis=0).to(ACC)
    loss = tl.sum(total, axis=0)
    if MEAN:
        loss = loss / n_valid  # 0 / 0 = NaN when every row is ignored, as torch
    tl.store(out_ptr, loss)
    tl.store(n_valid_ptr, n_valid)


@triton.jit
def _xent_bwd_kernel(
    g_ptr, g_stride,  # upstream gradient: (M,) for "none", a scalar (stride 0) otherwise
    x_ptr, x_stride,  # logits (M, V)
    t_ptr,  # targets (M,) int64
    lse_ptr,  # (M,) from the forward, ACC
    n_valid_ptr,  # () from the forward (MEAN)
    dx_ptr, dx_stride,  # (M, V) in the logits' dtype
    V, ignore_index,
    MEAN: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,
    ACC: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    target = tl.load(t_ptr + row)
    cols = tl.arange(0, BLOCK_V)
    dx_row = dx_ptr + row64 * dx_stride
    if target != ignore_index:
        g = tl.load(g_ptr + row64 * g_stride).to(ACC)
        if MEAN:
            g = g / tl.load(n_valid_ptr)
        lse = tl.load(lse_ptr + row)
        x_row = x_ptr + row64 * x_stride
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            mask = offs < V
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(ACC)
            p = tl.exp(x - lse)
            dx = tl.where(offs == target, p - 1.0, p) * g
            tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        zeros = tl.zeros([BLOCK_V], dx_ptr.dtype.element_ty)
        for start in range(0, V, BLOCK_V):
            offs = start + cols
            tl.store(dx_row + offs, zeros, mask=offs < V)


# ------------------------------------------------------------------------------------------------
# Launches
# ------------------------------------------------------------------------------------------------
def _as_rows(logits: torch.Tensor) -> torch.Tensor:
    """(M, V) view with unit column stride (copies only when that needs one)."""
    rows = logits.reshape(-1, logits.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[0] == 0 else rows.contiguous()


def _as_targets(targets: torch.Tensor) -> torch.Tensor:
    flat = targets.reshape(-1)
    return flat if flat.stride(0) == 1 or flat.numel() <= 1 else flat.contiguous()


# Launchers by (rows, V, dtype, device, config...): a shape seen before costs no configuration
# work.
_plans: PlanCache = PlanCache()


def _launcher(key: tuple, make) -> CachedLauncher:
    launch = _plans.get(key)
    if launch is None:
        launch = _plans.remember(key, make())
    return launch


def _forward(x2d: torch.Tensor, t1d: torch.Tensor, ignore_index: int, reduction: str,
             config: XentConfig | None = None, *,
             traced: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, n_valid): loss (M,) for "none", else a scalar; lse (M,); n_valid a scalar
    ("mean" / "sum") or an empty tensor ("none"). ``traced``: launch through ``wrap_triton`` (the
    op's body, which torch.compile traces) instead of the cached launchers."""
    m, v = x2d.shape
    acc = acc_dtype(x2d.dtype)
    lse = torch.empty(m, dtype=acc, device=x2d.device)
    loss_rows = torch.empty(m, dtype=acc, device=x2d.device)
    if m:
        cfg = config or fwd_config(static_int(v))  # the vocabulary: specialized under dynamic shapes
        args = (x2d, x2d.stride(0), t1d, loss_rows, lse, v, ignore_index)
        if traced:
            wrap_triton(_xent_fwd_kernel)[(m,)](*args, **_fwd_meta(cfg, x2d.dtype))
        else:
            _launcher(("fwd", m, v, x2d.dtype, x2d.device, cfg), lambda: CachedLauncher(
                _xent_fwd_kernel, (m,), **_fwd_meta(cfg, x2d.dtype)))(*args)
    if reduction == "none":
        return loss_rows, lse, lse.new_empty(0)
    if not m:
        empty = float("nan") if reduction == "mean" else 0.0
        return torch.full((), empty, dtype=acc, device=x2d.device), lse, torch.zeros((), dtype=acc, device=x2d.device)
    loss = torch.empty((), dtype=acc, device=x2d.device)
    n_valid = torch.empty((), dtype=acc, device=x2d.device)
    args = (loss_rows, t1d, loss, n_valid, m, ignore_index)
    if traced:
        wrap_triton(_xent_reduce_kernel)[(1,)](*args, **_reduce_meta(m, x2d.dtype, reduction))
    else:
        _launcher(("reduce", m, x2d.dtype, x2d.device, reduction), lambda: CachedLauncher(
            _xent_reduce_kernel, (1,), **_reduce_meta(m, x2d.dtype, reduction)))(*args)
    return loss, lse, n_valid


def _fwd_meta(cfg: XentConfig, dtype: torch.dtype) -> dict:
    return dict(BLOCK_V=cfg.block_v, STAGES=cfg.num_stages, ACC=tl_acc(dtype), num_warps=cfg.num_warps)


def _reduce_meta(m: int, dtype: torch.dtype, reduction: str) -> dict:
    block_m = capped_power_of_two(m, _REDUCE_BLOCK_M)
    return dict(MEAN=reduction == "mean", BLOCK_M=block_m, ACC=tl_acc(dtype), num_warps=max(1, min(16, block_m // 256)))


def _backward(grad: torch.Tensor, x2d: torch.Tensor, t1d: torch.Tensor, lse: torch.Tensor,
              n_valid: torch.Tensor, ignore_index: int, reduction: str,
              config: XentConfig | None = None) -> torch.Tensor:
    """dlogits (M, V), contiguous, in the logits' dtype."""
    m, v = x2d.shape
    dx = torch.empty((m, v), dtype=x2d.dtype, device=x2d.device)
    if not m:
        return dx
    if reduction == "none":
        grad = grad.reshape(-1)
        g_stride = grad.stride(0)
    else:
        g_stride = 0
    cfg = config or bwd_config(v)
    mean = reduction == "mean"
    launch = _launcher(("bwd", m, v, x2d.dtype, x2d.device, mean, cfg), lambda: CachedLauncher(
        _xent_bwd_kernel, (m,), MEAN=mean, BLOCK_V=cfg.block_v, STAGES=cfg.num_stages, ACC=tl_acc(x2d.dtype),
        num_warps=cfg.num_warps))
    launch(grad, g_stride, x2d, x2d.stride(0), t1d, lse, n_valid if mean else lse, dx, dx.stride(0), v, ignore_index)
    return dx


class _CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction):
        x2d, t1d = _as_rows(logits), _as_targets(targets)
        loss, lse, n_valid = _forward(x2d, t1d, ignore_index, reduction)
        ctx.save_for_backward(x2d, t1d, lse, n_valid)
        ctx.shape, ctx.ignore_index, ctx.reduction = logits.shape, ignore_index, reduction
        return loss.view(targets.shape) if reduction == "none" else loss

    @staticmethod
    @once_differentiable  # the backward kernel has no derivative: a double backward is an error
    def backward(ctx, grad):
        x2d, t1d, lse, n_valid = ctx.saved_tensors
        dx = _backward(grad, x2d, t1d, lse, n_valid, ctx.ignore_index, ctx.reduction)
        return dx.view(ctx.shape), None, None, None


def _forward_no_grad(logits, targets, ignore_index, reduction):
    loss, _, _ = _forward(_as_rows(logits), _as_targets(targets), ignore_index, reduction)
    return loss.view(targets.shape) if reduction == "none" else loss


# ------------------------------------------------------------------------------------------------
# The op torch.compile sees (``compiled_op``: a triton_op, so Inductor launches the kernels from
# its generated code), with a fake and an autograd formula in ATen ops, so a model compiles with
# fullgraph=True
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::cross_entropy_fwd", mutates_args=())
def _cross_entropy_fwd_op(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, n_valid); lse of shape (M,), n_valid a scalar (empty for "none")."""
    loss, lse, n_valid = _forward(_as_rows(logits), _as_targets(targets), ignore_index, reduction, traced=True)
    return (loss.view(targets.shape) if reduction == "none" else loss), lse, n_valid


@_cross_entropy_fwd_op.register_fake
def _(logits, targets, ignore_index, reduction):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    _check_inputs(logits, targets, ignore_index, reduction)
    acc = acc_dtype(logits.dtype)
    loss = logits.new_empty(targets.shape if reduction == "none" else (), dtype=acc)
    n_valid = logits.new_empty(0 if reduction == "none" else (), dtype=acc)
    return loss, logits.new_empty((targets.numel(),), dtype=acc), n_valid


def _op_setup_context(ctx, inputs, output):
    logits, targets, ignore_index, reduction = inputs
    _, lse, n_valid = output
    ctx.save_for_backward(logits, targets, lse, n_valid)
    ctx.ignore_index, ctx.reduction = ignore_index, reduction


def _op_backward(ctx, grad, _dlse, _dn_valid):
    """The backward torch.compile traces: ``_xent_bwd_kernel``'s formula as ATen ops, which Inductor
    fuses with what else the graph adds to dlogits. A compiled step that also returns its logits
    adds their zero gradient, which beside an opaque op costs a pass of its own over M x V
    (results/2026-11-24-h100-small-call/README.md); alone the formula is one pass, like the kernel.
    Eager calls take ``_CrossEntropyFunction`` and the kernel."""
    logits, targets, lse, n_valid = ctx.saved_tensors
    acc = acc_dtype(logits.dtype)
    g = grad.to(acc)
    if ctx.reduction == "mean":
        g = g / n_valid
    g = g.expand(targets.shape).unsqueeze(-1)
    p = torch.exp(logits.to(acc) - lse.view(targets.shape).unsqueeze(-1))
    onehot = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)
    dx = (p - onehot.to(acc)) * g
    # Ignored rows: zeros, whatever their lse holds (the forward skips them).
    dx = torch.where((targets != ctx.ignore_index).unsqueeze(-1), dx, 0.0).to(logits.dtype)
    return dx, None, None, None


_cross_entropy_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def _cross_entropy_compiled(logits, targets, ignore_index, reduction):
    """The path taken under torch.compile: one op, lse and n_valid kept for the backward."""
    loss, _, _ = torch.ops.kernelbench.cross_entropy_fwd(logits, targets, ignore_index, reduction)
    return loss


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def _check_inputs(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"cross_entropy: logits must be a tensor, got {type(logits).__name__}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"cross_entropy: targets must be a tensor, got {type(targets).__name__}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"cross_entropy: unsupported logits dtype {logits.dtype}; accepted: float32, bfloat16, "
                        "float16, float64")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits of shape {tuple(logits.shape)} have no classes; expected "
                         "(..., V) with V >= 1")
    if targets.dtype != torch.int64:
        raise TypeError(f"cross_entropy: targets must be int64 class indices, got dtype {targets.dtype}")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"cross_entropy: targets has shape {tuple(targets.shape)}, expected "
                         f"{tuple(logits.shape[:-1])} (the logits' shape {tuple(logits.shape)} without the last dim)")
    if targets.device != logits.device:
        raise ValueError(f"cross_entropy: targets are on {targets.device}, logits on {logits.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if type(ignore_index) is not int:
        raise TypeError(f"cross_entropy: ignore_index must be an int, got {type(ignore_index).__name__}")


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(torch.ops.kernelbench.cross_entropy_fwd.default)
