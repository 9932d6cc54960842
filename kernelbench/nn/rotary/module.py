"""Rotary position embeddings on q and k in one Triton launch, forward and backward:
``apply_rotary`` and its in-place variant ``apply_rotary_``.

For each head vector x of length D, the first ``rotary_dim`` (= cos.shape[-1]) entries are split
into pairs (x1, x2) and rotated; the rest pass through unchanged:

    style "half" (Hugging Face rotate_half):  x1 = x[j],    x2 = x[j + rotary_dim/2]
    style "interleaved" (GPT-J):              x1 = x[2j],   x2 = x[2j + 1]

    out = x * cos + rotate(x) * sin

with cos / sin of shape (positions, rotary_dim) at positions position_offset (+ per-batch offset)
+ s. ``rotary_ref`` is the PyTorch reference (also the ``impl="torch"`` path).

Below this file: ``function.py`` (autograd and the ops torch.compile sees), ``host.py`` (launch
configuration, checks, ``forward`` / ``backward``), ``kernels.py`` (the Triton kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...fast_launch import fast_apply
from .._triton_support import foreign, on_input_device, require_const, runs_here
from .._triton_support import why_not_here as triton_usable
from ..autoselect import IMPLEMENTATIONS, Candidates, choose_impl
from . import host
from .function import RotaryFunction
from .host import (
    LAYOUTS,
    STYLES,
    SUPPORTED_DTYPES,
    RotaryConfig,
    bhsd_shape,
    check_inputs,
    offsets_for_kernel,
    rotary_config,
    table_2d,
    table_for_kernel,
)

__all__ = ["IMPLS", "LAYOUTS", "STYLES", "SUPPORTED_DTYPES", "RotaryConfig", "apply_rotary", "apply_rotary_",
           "rotary_config", "rotary_ref", "triton_usable"]

# Eager calls skip autograd.Function.apply's Python wrapper (host time of small calls).
_rotary_autograd = fast_apply(RotaryFunction)

IMPLS = ("auto", "triton", "torch")


# ------------------------------------------------------------------------------------------------
# Reference
# ------------------------------------------------------------------------------------------------
def _positions(offsets: torch.Tensor, seq: int, device) -> torch.Tensor:
    """(B, S) positions of per-batch ``offsets``."""
    return offsets.to(device=device, dtype=torch.long)[:, None] + torch.arange(seq, device=device)[None, :]


def _rotate(x: torch.Tensor, style: str) -> torch.Tensor:
    if style == "half":
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    style: str = "half",
    layout: str = "bhsd",
    position_offset: int | torch.Tensor = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager PyTorch rotary, the math of the module docstring (compute in the inputs' dtype)."""
    cos, sin = table_2d(cos), table_2d(sin)
    rot = cos.shape[-1]
    seq_dim, head_dim_index = (2, 1) if layout == "bhsd" else (1, 2)
    seq = q.shape[seq_dim]
    if isinstance(position_offset, torch.Tensor):
        pos = _positions(position_offset, seq, q.device)
        c, s = cos[pos].unsqueeze(head_dim_index), sin[pos].unsqueeze(head_dim_index)  # broadcast over heads
    else:
        # One offset for the whole batch: a slice of the tables, no gather (fewer ops eagerly, and
        # under torch.compile the same graph as Hugging Face's formula).
        c, s = cos[position_offset:position_offset + seq], sin[position_offset:position_offset + seq]
        if layout == "bshd":
            c, s = c.unsqueeze(1), s.unsqueeze(1)

    def one(x):
        whole = rot == x.shape[-1]  # nothing passes through: no slice, no cat
        x_rot = x if whole else x[..., :rot]
        out = x_rot * c.to(x.dtype) + _rotate(x_rot, style) * s.to(x.dtype)
        return out if whole else torch.cat((out, x[..., rot:]), dim=-1)

    return one(q), one(k)


@on_input_device
def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    style: str = "half",
    layout: str = "bhsd",
    position_offset: int | torch.Tensor = 0,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (one launch) and return new tensors ``(q_out, k_out)``.

    q (B, Hq, S, D) and k (B, Hk, S, D) for ``layout="bhsd"``, (B, S, H, D) for "bshd", any
    strides. cos / sin (positions, rotary_dim), rotary_dim <= D (the rest of each head passes
    through). ``style``: "half" (HF rotate_half) or "interleaved" (GPT-J). ``position_offset``:
    an int, or an int tensor of shape (B,), added to the positions 0..S-1 (KV cache).
    ``impl``: "triton", "torch" (``rotary_ref``) or "auto" (measured once per shape, cached;
    torch's under torch.compile, where Inductor fuses it with the copies around it).
    A tensor subclass (DTensor) takes torch's path under "auto" and is an error under "triton".
    """
    if impl not in IMPLS:
        raise ValueError(f"apply_rotary: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    # Traced too: under torch.compile a bad input then raises this same error (fullgraph=True
    # wraps it in Dynamo's "Observed exception"); valid inputs trace to shape guards only.
    cos, sin = check_inputs(q, k, cos, sin, style, layout, position_offset)
    unsafe = None if torch.compiler.is_compiling() else foreign(q, k, cos, sin)
    if impl == "auto" and unsafe:
        impl = "torch"
    if impl == "auto":
        qb, kb = bhsd_shape(q, layout), bhsd_shape(k, layout)
        shape = (qb[0], qb[1], kb[1], qb[2], qb[3], cos.shape[-1])
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        impl = choose_impl(AUTOSELECT, shape, q.dtype, q.device, requires_grad=needs_grad, variant=f"{style}-{layout}")
    if impl == "torch":
        return rotary_ref(q, k, cos, sin, style=style, layout=layout, position_offset=position_offset)
    if torch.compiler.is_compiling():
        require_const(q.is_cuda, "apply_rotary(impl='triton')")
        offsets, offset = offsets_for_kernel(position_offset, q.device)
        return torch.ops.kernelbench.rotary(q, k, table_for_kernel(cos), table_for_kernel(sin), offsets, offset,
                                            style == "interleaved", layout == "bshd", False)
    if unsafe or not runs_here(q):
        raise ValueError(f"apply_rotary(impl='triton'): {unsafe or triton_usable(q)}; use impl='torch' or impl='auto'")
    offsets, offset = offsets_for_kernel(position_offset, q.device)
    cos, sin = table_for_kernel(cos), table_for_kernel(sin)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad):
        return _rotary_autograd(q, k, cos, sin, offsets, offset, style, layout)
    # No gradient to record: skip autograd.Function's bookkeeping (host time in launch-bound calls).
    return host.forward(q, k, cos, sin, offsets, offset, style == "interleaved", layout)


@on_input_device
def apply_rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    style: str = "half",
    layout: str = "bhsd",
    position_offset: int | torch.Tensor = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-place ``apply_rotary`` (Triton only, no autograd: inference and KV-cache writes).

    A ``torch.library`` custom op (``kernelbench::rotary_``) that declares it mutates q and k, so
    torch.compile and CUDA graphs see the write. Returns q and k.
    """
    cos, sin = check_inputs(q, k, cos, sin, style, layout, position_offset)  # traced too, as in apply_rotary
    if torch.compiler.is_compiling():
        require_const(q.is_cuda, "apply_rotary_", remedy="")  # Triton only: no other impl to offer
    else:
        why_not = foreign(q, k, cos, sin) or triton_usable(q)
        if why_not is not None:
            raise ValueError(f"apply_rotary_: {why_not}")
    offsets, offset = offsets_for_kernel(position_offset, q.device)
    torch.ops.kernelbench.rotary_(q, k, table_for_kernel(cos), table_for_kernel(sin), offsets, offset,
                                  style == "interleaved", layout == "bshd")
    return q, k


# ------------------------------------------------------------------------------------------------
# What impl="auto" times
# ------------------------------------------------------------------------------------------------
def _autoselect_runners(shape: tuple, dtype: torch.dtype, device: str, mode: str,
                        variant: str) -> dict[str, Callable[[], None]]:
    batch, hq, hk, seq, dim, rot = shape
    style, layout = (variant or "half-bhsd").split("-")
    gen = torch.Generator(device=device).manual_seed(0)

    def make(heads: int) -> torch.Tensor:
        dims = (batch, heads, seq, dim) if layout == "bhsd" else (batch, seq, heads, dim)
        return torch.randn(dims, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, k = make(hq), make(hk)
    angles = torch.rand((seq, rot), generator=gen, device=device) * 6.0
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    backward = mode == "fwd+bwd"
    if backward:
        q.requires_grad_(True)
        k.requires_grad_(True)
        dq, dk = torch.randn_like(q), torch.randn_like(k)

    def runner(impl: str) -> Callable[[], None]:
        def run() -> None:
            qo, ko = apply_rotary(q, k, cos, sin, style=style, layout=layout, impl=impl)
            if backward:
                q.grad = k.grad = None
                torch.autograd.backward((qo, ko), (dq, dk))

        return run

    return {impl: runner(impl) for impl in IMPLEMENTATIONS}


def _autoselect_check_shape(shape: tuple) -> None:
    if len(shape) != 6:
        raise ValueError(f"autoselect: rotary shape is (B, Hq, Hk, S, D, rotary_dim), got {shape}")


# Traced by torch.compile, "auto" is torch's formula: Inductor fuses it into the copies beside it (a
# model's head transpose, GQA's repeat of k), which a custom op cannot join
# (results/2026-11-29-h200-compiled-rotary).
AUTOSELECT = Candidates("rotary", _autoselect_runners, check_shape=_autoselect_check_shape, traced="torch")
