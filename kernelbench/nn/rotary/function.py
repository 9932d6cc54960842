"""Rotary's autograd: the eager ``RotaryFunction`` (``host.forward`` / ``host.backward``), and
the ops torch.compile sees (``compiled_op``: triton_ops, so Inductor launches the kernel from its
generated code): ``kernelbench::rotary`` with its fake and autograd formula, and the in-place
``kernelbench::rotary_``, which declares that it mutates q and k. Their bodies make eager's
launch traceably (``wrap_triton`` with ``host.launch_spec``'s default config).
"""

from __future__ import annotations

import torch

from .. import _inductor_fallbacks
from .._triton_support import compiled_op, static_int, wrap_triton
from . import host
from .host import bhsd_shape, check_inputs, launch_args, launch_spec
from .kernels import _rotary_kernel


class RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, offsets, position_offset, style, layout):
        interleaved = style == "interleaved"
        ctx.save_for_backward(cos, sin, offsets)
        ctx.position_offset, ctx.interleaved, ctx.layout = position_offset, interleaved, layout
        return host.forward(q, k, cos, sin, offsets, position_offset, interleaved, layout)

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        cos, sin, offsets = ctx.saved_tensors
        dq, dk = host.backward(dq_out, dk_out, cos, sin, offsets, ctx.position_offset, ctx.interleaved, ctx.layout)
        return dq, dk, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------------
# The ops torch.compile sees
# ------------------------------------------------------------------------------------------------
def _traced_launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, *, interleaved, backward, copy_pass,
                   layout):
    """``host.launch``'s default launch as a traceable ``wrap_triton`` call (the ops' bodies); the
    inputs checked first, as the fakes check them, since the ops may be called directly."""
    check_inputs(q, k, cos, sin, "interleaved" if interleaved else "half", layout,
                 offsets if offsets is not None else position_offset)
    batch, hq, seq, dim = bhsd_shape(q, layout)
    hk = bhsd_shape(k, layout)[1]
    # Heads and dims are the model's (specialized under dynamic shapes); batch and seq may vary.
    grid, meta = launch_spec(batch, static_int(hq), static_int(hk), seq, static_int(dim),
                             static_int(cos.shape[-1]), q.dtype, None, interleaved, backward, copy_pass,
                             offsets is not None, None)
    wrap_triton(_rotary_kernel)[grid](
        *launch_args(q, k, q_out, k_out, cos, sin, offsets, position_offset, layout, (hq, hk, seq, dim)), **meta)


@compiled_op("kernelbench::rotary", mutates_args=())
def _rotary_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offsets: torch.Tensor | None,
    position_offset: int, interleaved: bool, bshd: bool, backward: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k), new tensors; ``backward`` rotates by the transposed matrix (gradients)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _traced_launch(q, k, q_out, k_out, cos, sin, offsets, position_offset, interleaved=interleaved,
                   backward=backward, copy_pass=True, layout="bshd" if bshd else "bhsd")
    return q_out, k_out


@_rotary_op.register_fake
def _(q, k, cos, sin, offsets, position_offset, interleaved, bshd, backward):
    _inductor_fallbacks.ensure_registered()
    # Tracing runs this on every call: bad input fails here with the eager error's text (a
    # per-batch offsets tensor is checked for its shape; its values are unknown while tracing).
    check_inputs(q, k, cos, sin, "interleaved" if interleaved else "half", "bshd" if bshd else "bhsd",
                 offsets if offsets is not None else position_offset)
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_op_setup_context(ctx, inputs, output):
    _, _, cos, sin, offsets, position_offset, interleaved, bshd, _ = inputs
    ctx.save_for_backward(cos, sin, offsets)
    ctx.args = (position_offset, interleaved, bshd)


def _rotary_op_backward(ctx, dq_out, dk_out):
    cos, sin, offsets = ctx.saved_tensors
    dq, dk = torch.ops.kernelbench.rotary(dq_out, dk_out, cos, sin, offsets, *ctx.args, True)
    return dq, dk, None, None, None, None, None, None, None


_rotary_op.register_autograd(_rotary_op_backward, setup_context=_rotary_op_setup_context)


@compiled_op("kernelbench::rotary_", mutates_args=("q", "k"))
def _rotary_inplace_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    offsets: torch.Tensor | None, position_offset: int, interleaved: bool, bshd: bool,
) -> None:
    # In place: each program loads its x1 / x2 before storing them; pass-through dims stay as they are.
    _traced_launch(q, k, q, k, cos, sin, offsets, position_offset, interleaved=interleaved, backward=False,
                   copy_pass=False, layout="bshd" if bshd else "bhsd")


@_rotary_inplace_op.register_fake
def _(q, k, cos, sin, offsets, position_offset, interleaved, bshd) -> None:
    check_inputs(q, k, cos, sin, "interleaved" if interleaved else "half", "bshd" if bshd else "bhsd",
                 offsets if offsets is not None else position_offset)
    return None


# Inductor runs these ops through fallbacks registered up front (see _inductor_fallbacks).
_inductor_fallbacks.declare(
    torch.ops.kernelbench.rotary.default,
)
