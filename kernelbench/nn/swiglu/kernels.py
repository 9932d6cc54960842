"""SwiGLU's Triton kernels (``silu(gate) * up``). Host code and launch configuration: ``host.py``.

Math, element by element (fp32 whatever the storage dtype; fp64 inputs stay fp64):

    sig   = 1 / (1 + exp(-g))
    out   = g * sig * u                              (rounded once, to the input dtype)
    dgate = dy * u * sig * (1 + g * (1 - sig))
    dup   = dy * g * sig

The kernels are elementwise over the flattened, contiguous tensors:
- ``_silu_mul_fwd_kernel`` reads gate and up once and writes out: 3 x numel x s bytes.
- ``_silu_mul_bwd_kernel`` reads dy, gate and up once and writes dgate and dup: 5 x numel x s
  bytes. sig is recomputed from gate, so the forward saves only gate and up: eager's mul also
  keeps silu(gate), one more activation of that size per layer.
- ``_silu_mul_bwd_in_place_kernel``: the same with dgate written over dy (the compiled backward's,
  where dy is a buffer nothing else reads).
Eager PyTorch takes 5 passes forward (silu, then mul) and 9 backward (three kernels); fused: 3 + 5.
"""

from __future__ import annotations

from .._triton_support import tl, triton


@triton.jit
def _silu_mul_fwd_kernel(
    gate_ptr,  # (numel,) contiguous
    up_ptr,  # (numel,) contiguous, gate's dtype
    out_ptr,  # (numel,) silu(gate) * up
    numel,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # numel is a multiple of BLOCK: no masks at all
    ACC: tl.constexpr,  # fp32; fp64 for fp64 inputs (gradcheck)
):
    # int64: tensors past 2^31 elements (8192 x 262144) must not wrap.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        g = tl.load(gate_ptr + offs).to(ACC)
        u = tl.load(up_ptr + offs).to(ACC)
    else:
        mask = offs < numel
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(ACC)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(ACC)
    sig = 1.0 / (1.0 + tl.exp(-g))
    out = (g * sig * u).to(out_ptr.dtype.element_ty)
    if EVEN:
        tl.store(out_ptr + offs, out)
    else:
        tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def _silu_mul_bwd_block(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, numel, BLOCK: tl.constexpr,
                        EVEN: tl.constexpr, ACC: tl.constexpr):
    """One program's block of the backward; each element of dy is read before dgate's is written,
    so dgate_ptr may be dy_ptr."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        dy = tl.load(dy_ptr + offs).to(ACC)
        g = tl.load(gate_ptr + offs).to(ACC)
        u = tl.load(up_ptr + offs).to(ACC)
    else:
        mask = offs < numel
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(ACC)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(ACC)
    sig = 1.0 / (1.0 + tl.exp(-g))
    dup = (dy * g * sig).to(dup_ptr.dtype.element_ty)
    dgate = (dy * u * sig * (1.0 + g * (1.0 - sig))).to(dgate_ptr.dtype.element_ty)
    if EVEN:
        tl.store(dgate_ptr + offs, dgate)
        tl.store(dup_ptr + offs, dup)
    else:
        tl.store(dgate_ptr + offs, dgate, mask=mask)
        tl.store(dup_ptr + offs, dup, mask=mask)


@triton.jit
def _silu_mul_bwd_kernel(
    dy_ptr,  # (numel,) gradient of out, contiguous
    gate_ptr,  # (numel,) the forward's inputs
    up_ptr,
    dgate_ptr,  # (numel,) outputs, in gate's dtype
    dup_ptr,
    numel,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    ACC: tl.constexpr,
):
    _silu_mul_bwd_block(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, numel, BLOCK, EVEN, ACC)


@triton.jit
def _silu_mul_bwd_in_place_kernel(
    dy_ptr,  # (numel,) gradient of out, contiguous; dgate is written over it
    gate_ptr,  # (numel,) the forward's inputs
    up_ptr,
    dup_ptr,  # (numel,) output, in gate's dtype
    numel,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    ACC: tl.constexpr,
):
    # One pointer for dy and dgate: a traced launch then names the buffer it mutates exactly once.
    _silu_mul_bwd_block(dy_ptr, gate_ptr, up_ptr, dy_ptr, dup_ptr, numel, BLOCK, EVEN, ACC)
