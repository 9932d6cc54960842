"""Linear cross-entropy's host side: input checks, the chunk plan (``plan_chunk_rows``), and
``forward`` (loss and both gradients, chunk by chunk) / ``backward`` (the upstream gradient's
scaling). The fp32 logits of the whole batch never exist: one chunk's logits buffer, in the input
dtype, holds the logits and then their gradient.

Both gradients are computed in the forward, so the logits are made once; the backward is two
element-wise products. dW is accumulated in the weight's dtype by cuBLAS (``addmm_``, beta=1: the
sum C + A @ B is formed in fp32 and rounded once per chunk), not in an fp32 buffer: that buffer
(4 * V * H bytes, plus a pass over it per chunk) would cost about as much memory as the chunk's
logits, while the chunk rule below keeps the roundings to a few.
"""

from __future__ import annotations

import math

import torch

from .._triton_support import acc_dtype, tl_acc
from ..crossentropy import host as xent_host
from ..crossentropy.host import as_rows, as_targets
from .kernels import _scale_unless_one_kernel

__all__ = ["FUSE_MIN_LOGITS", "LOGITS_BUDGET_BYTES", "MIN_CHUNK_ROWS", "REDUCTIONS", "ROWS_PER_HIDDEN",
           "SUPPORTED_DTYPES", "as_rows", "as_targets", "backward", "backward_in_place", "check_inputs", "forward",
           "fusing_pays", "plan_chunk_rows"]

# fp64 (computed in fp64, as cross-entropy does) is for gradcheck.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# "none" would need the per-row upstream gradient inside the forward, where the gradients are made.
REDUCTIONS = ("mean", "sum")

# A chunk's logits buffer holds at most this many bytes, unless that is fewer rows than
# MIN_CHUNK_ROWS (below that the three GEMMs per chunk get too thin to run near the matmul rate)
# or than ROWS_PER_HIDDEN * H: every chunk after the first re-reads dW (V x H) in its accumulating
# GEMM, against about 5 passes over its own rows x V logits, so chunks of 2H rows keep that re-read
# near a tenth of the logits' traffic (at 4096 x 4096 x 128256, one chunk of 4096 rows against two
# of 2048: 2.6% faster, results/2026-11-29-h200-fused-loss-chunks).
LOGITS_BUDGET_BYTES = 512 << 20
MIN_CHUNK_ROWS = 2048
ROWS_PER_HIDDEN = 2
# Chunk sizes are multiples of this, so each GEMM's M dimension splits into whole tiles.
_ROW_MULTIPLE = 128
# Fusing the head and the loss pays from this many logits (rows x vocabulary; 1 GiB as the fp32
# logits the plain loss upcasts to): below it the chunks' Python-launched ops cost the step more
# host time than the logits' traffic costs the GPU (llama-7m, 4096 x 32000: 1.07-1.20x of the plain
# loss compiled), above it the fused op is faster and its peak far lower (results/2026-11-27-4xh200-model-grid).
FUSE_MIN_LOGITS = 1 << 28


def fusing_pays(rows: int, vocab: int) -> bool:
    """Whether a model's ``fused_head_loss="auto"`` fuses the head and loss of ``rows`` tokens over
    ``vocab`` classes (at least FUSE_MIN_LOGITS logits)."""
    return rows * vocab >= FUSE_MIN_LOGITS


def plan_chunk_rows(n: int, h: int, v: int, element_size: int, chunk_rows: int | None = None) -> int:
    """Rows per chunk for N rows of width H against V logits of ``element_size`` bytes:
    ``chunk_rows`` when given (capped at N); else the byte budget's rows (at least MIN_CHUNK_ROWS
    and ROWS_PER_HIDDEN * H), evened out over the chunks that takes so the last one is not a sliver."""
    if chunk_rows is not None:
        return max(1, min(chunk_rows, n))
    by_budget = LOGITS_BUDGET_BYTES // (v * element_size) // _ROW_MULTIPLE * _ROW_MULTIPLE
    by_hidden = math.ceil(ROWS_PER_HIDDEN * h / _ROW_MULTIPLE) * _ROW_MULTIPLE
    rows = max(MIN_CHUNK_ROWS, by_budget, by_hidden)
    if rows >= n:
        return max(1, n)
    chunks = math.ceil(n / rows)
    return math.ceil(math.ceil(n / chunks) / _ROW_MULTIPLE) * _ROW_MULTIPLE


def forward(h2d: torch.Tensor, weight: torch.Tensor, t1d: torch.Tensor, ignore_index: int, reduction: str,
            chunk_rows: int | None, grad_hidden: bool, grad_weight: bool
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(loss, dh, dW) for contiguous h2d (N, H), weight (V, H) and t1d (N,) int64, as the
    gradients of the loss itself (upstream gradient 1); dh / dW are None unless asked for.
    The loss is fp32 (fp64 for fp64 inputs); the gradients have the inputs' dtype."""
    n = h2d.shape[0]
    v = weight.shape[0]
    rows = plan_chunk_rows(n, h2d.shape[1], v, h2d.element_size(), chunk_rows)
    acc = torch.float64 if h2d.dtype == torch.float64 else torch.float32
    # Counted on the device over the whole batch: every chunk's gradient divides by it.
    n_valid = (t1d != ignore_index).sum(dtype=acc)
    unit_grad = torch.ones((), dtype=acc, device=h2d.device)
    loss = torch.zeros((), dtype=acc, device=h2d.device)
    dh = torch.empty_like(h2d) if grad_hidden else None
    dw = (torch.empty_like(weight) if n else torch.zeros_like(weight)) if grad_weight else None
    logits_buffer = torch.empty((min(rows, n), v), dtype=h2d.dtype, device=h2d.device)
    # fp16 cannot hold a mean's logit gradients (about 1 / (V * N): below its smallest subnormal at
    # 32k x 3k), so they stay unscaled in the GEMMs and the gradients are divided once at the end.
    scale_after = reduction == "mean" and h2d.dtype == torch.float16
    grad_reduction = "sum" if scale_after else reduction
    for start in range(0, n, rows):
        end = min(start + rows, n)
        h_chunk, t_chunk = h2d[start:end], t1d[start:end]
        logits = logits_buffer[: end - start]
        torch.mm(h_chunk, weight.t(), out=logits)
        chunk_loss, lse, _ = xent_host.forward(logits, t_chunk, ignore_index, "sum")
        loss.add_(chunk_loss)
        if dh is None and dw is None:
            continue
        xent_host.backward(unit_grad, logits, t_chunk, lse, n_valid, ignore_index, grad_reduction, out=logits)
        if dh is not None:
            torch.mm(logits, weight, out=dh[start:end])
        if dw is not None:
            if start == 0:
                torch.mm(logits.t(), h_chunk, out=dw)
            else:
                dw.addmm_(logits.t(), h_chunk)
    if scale_after:
        for grad in (dh, dw):
            if grad is not None:
                grad.div_(n_valid)
    if reduction == "mean":
        loss = loss / n_valid  # 0 / 0 = NaN when every row is ignored, as torch
    return loss, dh, dw


def backward(grad: torch.Tensor, dh: torch.Tensor | None, dw: torch.Tensor | None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The forward's gradients scaled by the loss's upstream gradient (a scalar tensor)."""
    return (None if dh is None else dh * grad.to(dh.dtype),
            None if dw is None else dw * grad.to(dw.dtype))


_SCALE_BLOCK = 4096


def backward_in_place(grad: torch.Tensor, dh: torch.Tensor | None, dw: torch.Tensor | None
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``backward``'s result written over dh and dW themselves, which are returned: nothing is
    read or written where the upstream gradient is 1. Only for a backward that runs once (the
    graph not kept), since it consumes the forward's gradients. Same values as ``backward``."""
    g = grad.detach().reshape(()).to(dtype=acc_dtype(dh.dtype if dh is not None else dw.dtype))
    for t in (dh, dw):
        if t is not None and t.numel():
            _scale_unless_one_kernel[(-(-t.numel() // _SCALE_BLOCK),)](
                t, g, t.numel(), BLOCK=_SCALE_BLOCK, ACC=tl_acc(t.dtype))
    return dh, dw


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                 reduction: str, chunk_rows: int | None) -> None:
    """Raise a one-line error naming what is wrong with the inputs and what is accepted."""
    name = "linear_cross_entropy"
    for arg, value in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a tensor, got {type(value).__name__}")
    if hidden.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: unsupported hidden dtype {hidden.dtype}; accepted: float32, bfloat16, float16, "
                        "float64")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{name}: weight has dtype {weight.dtype}, hidden {hidden.dtype}; they must match")
    if hidden.dim() not in (2, 3):
        raise ValueError(f"{name}: hidden of shape {tuple(hidden.shape)}; expected (N, H) or (B, S, H)")
    if weight.dim() != 2 or weight.shape[0] == 0:
        raise ValueError(f"{name}: weight of shape {tuple(weight.shape)}; expected (V, H) with V >= 1")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{name}: weight of shape {tuple(weight.shape)} does not match hidden of shape "
                         f"{tuple(hidden.shape)}; expected weight (V, {hidden.shape[-1]})")
    if targets.dtype != torch.int64:
        raise TypeError(f"{name}: targets must be int64 class indices, got dtype {targets.dtype}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{name}: targets has shape {tuple(targets.shape)}, expected {tuple(hidden.shape[:-1])} "
                         f"(hidden's shape {tuple(hidden.shape)} without the last dim)")
    if weight.device != hidden.device or targets.device != hidden.device:
        raise ValueError(f"{name}: hidden is on {hidden.device}, weight on {weight.device}, targets on "
                         f"{targets.device}; they must share one device")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if type(ignore_index) is not int:
        raise TypeError(f"{name}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if chunk_rows is not None and (type(chunk_rows) is not int or chunk_rows < 1):
        raise ValueError(f"{name}: chunk_rows must be None or an int >= 1, got {chunk_rows!r}")
