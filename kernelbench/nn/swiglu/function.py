"""SwiGLU's autograd: the eager ``SiluMulFunction`` (``host.forward`` / ``host.backward``), and
the ops torch.compile sees (``kernelbench::silu_mul_fwd`` / ``silu_mul_bwd``, ``compiled_op``:
triton_ops, so Inductor launches the kernels from its generated code) with fakes and an autograd
formula, so a model compiles with fullgraph=True. The bodies make eager's launches traceably
(``wrap_triton`` with ``host.launch_spec``'s default config); the kernels are named in the
``wrap_triton`` calls themselves, since the compile caches key on the kernels found by reading an
op's body.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

from .. import _inductor_fallbacks
from .._triton_support import compiled_op, wrap_triton
from . import host
from .host import check_backward_inputs, check_inputs, flat, launch_spec
from .kernels import _silu_mul_bwd_in_place_kernel, _silu_mul_bwd_kernel, _silu_mul_fwd_kernel


class SiluMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = flat(gate), flat(up)
        ctx.save_for_backward(gate, up)
        return host.forward(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return host.backward(dy, gate, up)


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees
# ------------------------------------------------------------------------------------------------
@compiled_op("kernelbench::silu_mul_fwd", mutates_args=())
def _silu_mul_fwd_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, contiguous."""
    check_inputs(gate, up)
    gate, up = flat(gate), flat(up)
    out = torch.empty_like(gate)
    numel = gate.numel()
    if numel:
        grid, meta = launch_spec(numel, gate, None)
        wrap_triton(_silu_mul_fwd_kernel)[grid](gate, up, out, numel, **meta)
    return out


@_silu_mul_fwd_op.register_fake
def _(gate, up):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text.
    check_inputs(gate, up)
    return gate.new_empty(gate.shape)


@compiled_op("kernelbench::silu_mul_bwd", mutates_args=())
def _silu_mul_bwd_op(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous."""
    check_backward_inputs(dy, gate, up)
    dy, gate, up = flat(dy), flat(gate), flat(up)
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    numel = gate.numel()
    if numel:
        grid, meta = launch_spec(numel, gate, None)
        wrap_triton(_silu_mul_bwd_kernel)[grid](dy, gate, up, dgate, dup, numel, **meta)
    return dgate, dup


@_silu_mul_bwd_op.register_fake
def _(dy, gate, up):
    check_backward_inputs(dy, gate, up)
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


@compiled_op("kernelbench::silu_mul_bwd_into_dy", mutates_args=("dy",))
def _silu_mul_bwd_into_dy_op(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """dgate written over dy (contiguous, gate's shape; each element read before it is written),
    dup returned."""
    check_backward_inputs(dy, gate, up)
    if not dy.is_contiguous():
        raise ValueError("kernelbench::silu_mul_bwd_into_dy: dy must be contiguous (it receives dgate)")
    gate, up = flat(gate), flat(up)
    dup = torch.empty_like(up)
    numel = gate.numel()
    if numel:
        grid, meta = launch_spec(numel, gate, None)
        wrap_triton(_silu_mul_bwd_in_place_kernel)[grid](dy, gate, up, dup, numel, **meta)
    return dup


@_silu_mul_bwd_into_dy_op.register_fake
def _(dy, gate, up):
    check_backward_inputs(dy, gate, up)
    return up.new_empty(up.shape)


def _op_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _op_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    if not is_fake(dy):  # run eagerly: dy may be the caller's tensor, so it is left alone
        return torch.ops.kernelbench.silu_mul_bwd(dy, gate, up)
    # Traced (torch.compile): dgate over dy, which in a model is the down projection's fresh
    # gradient, so Inductor writes it in place and the backward holds one new [tokens,
    # intermediate] buffer (dup), not two, as with its own fused SiLU backward; where dy has
    # another use, functionalization keeps a copy and the result is the same.
    dgate = flat(dy)
    dup = torch.ops.kernelbench.silu_mul_bwd_into_dy(dgate, gate, up)
    return dgate, dup


_silu_mul_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.silu_mul_fwd.default,
    torch.ops.kernelbench.silu_mul_bwd.default,
    torch.ops.kernelbench.silu_mul_bwd_into_dy.default,
)
