"""SwiGLU activation kernels (``silu(gate) * up``), their launch configuration, the autograd
Function and the custom ops.

Math, element by element (fp32 whatever the storage dtype; fp64 inputs stay fp64):

    sig   = 1 / (1 + exp(-g))
    out   = g * sig * u                              (rounded once, to the input dtype)
    dgate = dy * u * sig * (1 + g * (1 - sig))
    dup   = dy * g * sig

Kernels, both elementwise over the flattened tensors (contiguous; other layouts are copied first):
- ``_silu_mul_fwd_kernel`` reads gate and up once and writes out: 3 x numel x s bytes.
- ``_silu_mul_bwd_kernel`` reads dy, gate and up once and writes dgate and dup: 5 x numel x s
  bytes. sig is recomputed from gate, so the forward saves only gate and up: eager's mul also
  keeps silu(gate), one more activation of that size per layer.
Eager PyTorch takes 5 passes forward (silu, then mul) and 9 backward (three kernels); fused: 3 + 5.

Each program moves ``SiluMulConfig.block`` elements; eager launches go through
``kernelbench.fast_launch.CachedLauncher``, one per (numel, dtype, device, config); the ops
torch.compile traces launch the same configs through ``wrap_triton``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: impl="auto" resolves to "torch"
    from ._no_triton import tl, triton

from ..fast_launch import CachedLauncher, PlanCache
from . import _inductor_fallbacks
from ._triton_support import compiled_op, tl_acc, wrap_triton

# fp64 is computed in fp64 throughout (for gradcheck); the others in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DTYPE_NAMES = "float32, bfloat16, float16, float64"

# Each thread moves this many 16-byte vectors of every tensor per program: two loads of each
# input in flight per thread (LDG.128), so an SM full of programs keeps enough bytes in flight
# to cover HBM latency.
_VECTORS_PER_THREAD = 2
_NUM_WARPS = 8


@dataclass(frozen=True)
class SiluMulConfig:
    """Launch of the forward or backward kernel: ``block`` elements per program (a power of
    two) on ``num_warps`` warps."""

    block: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"swiglu SiluMulConfig: block must be a power of two, got {self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"swiglu SiluMulConfig: num_warps must be one of 1, 2, 4, 8, 16, 32, "
                             f"got {self.num_warps}")


@functools.cache
def default_config(element_size: int) -> SiluMulConfig:
    """The default launch for elements of ``element_size`` bytes (forward and backward)."""
    per_thread = _VECTORS_PER_THREAD * 16 // element_size
    return SiluMulConfig(per_thread * 32 * _NUM_WARPS, _NUM_WARPS)


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------
# Launchers by (numel, dtype, device, config): a repeated shape does no configuration work.
_fwd_plans: PlanCache = PlanCache()
_bwd_plans: PlanCache = PlanCache()


def _launcher(plans: PlanCache, kernel, numel: int, like: torch.Tensor, config: SiluMulConfig | None) -> CachedLauncher:
    key = (numel, like.dtype, like.get_device(), config)
    launch = plans.get(key)
    if launch is None:
        grid, meta = _launch_spec(numel, like, config)
        launch = plans.remember(key, CachedLauncher(kernel, grid, **meta))
    return launch


def _launch_spec(numel: int, like: torch.Tensor, config: SiluMulConfig | None) -> tuple[tuple, dict]:
    """(grid, compile-time arguments) of either kernel's launch over ``numel`` elements."""
    cfg = config or default_config(like.element_size())
    return (triton.cdiv(numel, cfg.block),), dict(BLOCK=cfg.block, EVEN=bool(numel % cfg.block == 0),
                                                   ACC=tl_acc(like.dtype), num_warps=cfg.num_warps)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def silu_mul_fwd(gate: torch.Tensor, up: torch.Tensor, *, config: SiluMulConfig | None = None,
                 traced: bool = False) -> torch.Tensor:
    """silu(gate) * up, contiguous, shaped like gate; ``config`` None: ``default_config``;
    ``traced``: launch through ``wrap_triton`` (the op's body, which torch.compile traces) instead
    of the cached launchers. The kernels are named in the ``wrap_triton`` calls themselves: the
    compile caches key on the kernels found by reading the op's body and what it calls."""
    gate, up = _flat(gate), _flat(up)
    out = torch.empty_like(gate)  # contiguous input: contiguous output
    numel = gate.numel()
    if numel:
        if traced:
            grid, meta = _launch_spec(numel, gate, config)
            wrap_triton(_silu_mul_fwd_kernel)[grid](gate, up, out, numel, **meta)
        else:
            _launcher(_fwd_plans, _silu_mul_fwd_kernel, numel, gate, config)(gate, up, out, numel)
    return out


def silu_mul_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, *,
                 config: SiluMulConfig | None = None, traced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous, shaped like gate."""
    dy, gate, up = _flat(dy), _flat(gate), _flat(up)
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    numel = gate.numel()
    if numel:
        if traced:
            grid, meta = _launch_spec(numel, gate, config)
            wrap_triton(_silu_mul_bwd_kernel)[grid](dy, gate, up, dgate, dup, numel, **meta)
        else:
            _launcher(_bwd_plans, _silu_mul_bwd_kernel, numel, gate, config)(dy, gate, up, dgate, dup, numel)
    return dgate, dup


class _SiluMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = _flat(gate), _flat(up)
        ctx.save_for_backward(gate, up)
        return silu_mul_fwd(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return silu_mul_bwd(dy, gate, up)


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees (``compiled_op``: triton_ops, so Inductor launches the kernels from
# its generated code), with fakes and an autograd formula so a model compiles with
# fullgraph=True; the bodies make eager's launches traceably
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::silu_mul_fwd", mutates_args=())
def _silu_mul_fwd_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, contiguous."""
    return silu_mul_fwd(gate, up, traced=True)


@_silu_mul_fwd_op.register_fake
def _(gate, up):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    check_inputs(gate, up)
    return gate.new_empty(gate.shape)


@compiled_op("kernelbench::silu_mul_bwd", mutates_args=())
def _silu_mul_bwd_op(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous."""
    return silu_mul_bwd(dy, gate, up, traced=True)


@_silu_mul_bwd_op.register_fake
def _(dy, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _op_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _op_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    return torch.ops.kernelbench.silu_mul_bwd(dy, gate, up)


_silu_mul_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(gate: torch.Tensor, up: torch.Tensor) -> None:
    """Raise a one-line error naming what is wrong with (gate, up) and what is accepted."""
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"silu_mul: {name} must be a tensor, got {type(t).__name__}")
    if gate.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"silu_mul: unsupported dtype {gate.dtype}; accepted: {_DTYPE_NAMES}")
    if up.dtype != gate.dtype:
        raise TypeError(f"silu_mul: up has dtype {up.dtype}, gate {gate.dtype}; both must have the same dtype")
    if up.shape != gate.shape:
        raise ValueError(f"silu_mul: up has shape {tuple(up.shape)}, gate {tuple(gate.shape)}; "
                         "both must have the same shape (no broadcasting)")
    if up.device != gate.device:
        raise ValueError(f"silu_mul: up is on {up.device}, gate on {gate.device}; both must be on one device")


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.silu_mul_fwd.default,
    torch.ops.kernelbench.silu_mul_bwd.default,
)
