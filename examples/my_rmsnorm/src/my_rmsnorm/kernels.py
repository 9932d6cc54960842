"""Two Triton kernels and their torch-facing functions.

RMSNorm over the last dimension, y = x / sqrt(mean(x^2) + eps) * w, statistics in fp32, a block of
rows per program. Backward, with x_hat = x * rstd: dx = rstd * (w * dy - x_hat * mean(x_hat * w * dy)),
dw = sum over rows of dy * x_hat (each program sums its rows into one fp32 partial; torch adds the
partials).

Fused add + SiLU: y = s * sigmoid(s) with s = a + b, one read of a and b, one write of y.

Loads are upcast to fp32 before any arithmetic (bf16 arithmetic is also wrong in the Triton
interpreter, where these run without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Rows of the backward per program: enough programs to fill a GPU, few enough partial dw rows.
BWD_PROGRAMS = 512


@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr,  # x, y: (M, N) rows; w: (N,); rstd: (M,) fp32
                        M, N, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)
    tl.store(y_ptr + offsets, (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr,  # dy, x: (M, N); w: (N,); rstd: (M,)
                        dx_ptr, dw_partial_ptr,  # dx: (M, N); dw_partial: (programs, N) fp32
                        M, N, rows_per_program, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, rows_per_program, BLOCK_M):
        rows = pid * rows_per_program + start + tl.arange(0, BLOCK_M)
        live = (rows < M) & (start + tl.arange(0, BLOCK_M) < rows_per_program)
        mask = live[:, None] & (cols[None, :] < N)
        offsets = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=live, other=0.0)
        x_hat = x * rstd[:, None]
        wdy = w[None, :] * dy
        dx = (wdy - x_hat * (tl.sum(x_hat * wdy, axis=1) / N)[:, None]) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * x_hat, axis=0)
    tl.store(dw_partial_ptr + pid * N + cols, dw, mask=cols < N)


def _block_m(block_n: int) -> int:
    """Rows per block: a few thousand elements per program (several rows of a narrow input)."""
    return max(1, min(16, 4096 // block_n))


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        m, n = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(m, device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(n)
        rows = _block_m(block)
        _rmsnorm_fwd_kernel[(triton.cdiv(m, rows),)](x2, weight.contiguous(), y, rstd, m, n, eps, BLOCK_M=rows,
                                                     BLOCK_N=block, num_warps=_warps(block))
        ctx.save_for_backward(x2, weight, rstd)
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = dy.reshape(m, n).contiguous()
        dx = torch.empty_like(x2)
        block = triton.next_power_of_2(n)
        block_m = _block_m(block)
        programs = min(triton.cdiv(m, block_m), BWD_PROGRAMS)
        rows = triton.cdiv(m, programs)
        programs = triton.cdiv(m, rows)
        dw_partial = torch.empty((programs, n), device=x2.device, dtype=torch.float32)
        _rmsnorm_bwd_kernel[(programs,)](dy2, x2, weight.contiguous(), rstd, dx, dw_partial, m, n, rows,
                                         BLOCK_M=block_m, BLOCK_N=block, num_warps=_warps(block))
        return dx.reshape(dy.shape), dw_partial.sum(0).to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of x over its last dimension (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(f"rms_norm: x's last dimension {x.shape[-1]} is not weight's {weight.shape[0]}")
    if x.device != weight.device:
        raise ValueError(f"rms_norm: x on {x.device}, weight on {weight.device}")
    return _RMSNorm.apply(x, weight, eps)


@triton.jit
def _add_silu_kernel(a_ptr, b_ptr, y_ptr, numel, BLOCK: tl.constexpr):  # a, b, y: numel elements
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    s = tl.load(a_ptr + offsets, mask=mask).to(tl.float32) + tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(y_ptr + offsets, (s * tl.sigmoid(s)).to(y_ptr.dtype.element_ty), mask=mask)


def add_silu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a + b) in one pass (a and b of one shape, dtype and device)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"add_silu: a {tuple(a.shape)} {a.dtype} {a.device} and b {tuple(b.shape)} {b.dtype} "
                         f"{b.device} differ")
    a, b = a.contiguous(), b.contiguous()
    y = torch.empty_like(a)
    block = 1024
    _add_silu_kernel[(triton.cdiv(a.numel(), block),)](a, b, y, a.numel(), BLOCK=block)
    return y
