"""Where the Triton kernels of kernelbench.nn can run: one answer for eager calls and one for
traced calls (torch.compile), shared by every layer; and the small helpers every layer's launch
code uses (accumulation dtype, power-of-two block checks).

Traced calls ask through ``torch.compiler.assume_constant_result`` functions: Dynamo runs them once
at trace time and bakes their answer into the graph, so no environment lookup is traced.

``compiled_op`` registers the ops torch.compile sees: ``torch.library.triton_op``s, whose bodies
launch through ``wrap_triton`` so Inductor launches the kernels from its own generated code.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable

import torch

from ..fast_launch import current_device

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch-only install: every layer's impl="auto" resolves to "torch"
    from ._no_triton import tl, triton

HAVE_TRITON = bool(getattr(triton, "available", True))
NEEDS_CUDA = "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"


@functools.lru_cache(maxsize=1)
def interpreter() -> bool:
    """TRITON_INTERPRET as the kernels were defined (read once: environ lookups cost host time)."""
    return HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


def runs_here(t: torch.Tensor) -> bool:
    """Whether the kernels can take ``t`` (eager calls: the cheap test of every call)."""
    return (t.is_cuda and HAVE_TRITON) or interpreter()


# A parameter's data_ptr() is its data; a subclass's (DTensor, a wrapper or quantized tensor) need
# not be, so the eager paths hand no subclass to a kernel.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def foreign(*tensors: torch.Tensor | None) -> str | None:
    """Why the kernels must not take these tensors' pointers (one is a tensor subclass), or None.
    Eager calls only: traced calls see fake tensors, and Inductor hands the ops plain ones."""
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TYPES:
            return (f"got a {type(t).__name__} (a tensor subclass, whose data_ptr() need not be its data); "
                    "the kernels take plain tensors and nn.Parameter (a DTensor: pass .to_local() or .full_tensor())")
    return None


def on_input_device(fn: Callable) -> Callable:
    """Runs an eager call under the device guard of its first argument's GPU where that is not the
    current device, as torch's own ops do: Triton launches on the current device, where a kernel
    reading another GPU's memory faults (or, with peer access, crawls over the link)."""
    name = next(iter(inspect.signature(fn).parameters))  # the first argument, also given by keyword

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if not torch.compiler.is_compiling():
            first = args[0] if args else kwargs.get(name)
            if isinstance(first, torch.Tensor) and first.is_cuda and first.get_device() != current_device():
                with torch.cuda.device(first.device):
                    return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return guarded


def why_not_here(t: torch.Tensor) -> str | None:
    """Why the kernels cannot take ``t`` here, or None when they can."""
    if not HAVE_TRITON:
        return "triton not installed"
    if not t.is_cuda and not interpreter():
        return NEEDS_CUDA
    return None


@torch.compiler.assume_constant_result
def why_not_here_const(is_cuda: bool) -> str:
    """For a traced call, at trace time: why the kernels cannot run on this device ("" if they can)."""
    if not HAVE_TRITON:
        return "triton not installed"
    if not is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return NEEDS_CUDA
    return ""


def runs_here_const(is_cuda: bool) -> bool:
    """For a traced call: whether the kernels can run on this device (a constant of the graph)."""
    return not why_not_here_const(is_cuda)


def require_const(is_cuda: bool, caller: str, remedy: str = "use impl='torch' or impl='auto'") -> None:
    """For a traced call of the Triton path: raise when the kernels cannot run here, with the eager
    call's message. The raise is traced, so torch.compile reports it as the caller's error, not
    as one inside Dynamo."""
    why = why_not_here_const(is_cuda)
    if why:
        raise ValueError(f"{caller}: {why}" + (f"; {remedy}" if remedy else ""))


def _identity(kernel):
    return kernel


if HAVE_TRITON and hasattr(torch.library, "triton_op") and not interpreter():
    from torch.library import wrap_triton

    def compiled_op(name: str, *, mutates_args) -> Callable:
        """``torch.library.triton_op``: under torch.compile the body is traced, so Inductor sees the
        Triton launches and makes them from its generated code, without a Python op call per launch
        (the host time that decides small compiled steps, results/2026-11-24-h100-triton-ops)."""
        return torch.library.triton_op(name, mutates_args=mutates_args)
else:
    # The Triton interpreter runs kernels on CPU tensors, which a trace cannot launch (and torch
    # before 2.6 has no triton_op): an opaque custom op with the same body, launching directly.
    wrap_triton = _identity

    def compiled_op(name: str, *, mutates_args) -> Callable:
        """An opaque ``torch.library.custom_op`` whose body launches the kernels directly."""
        return torch.library.custom_op(name, mutates_args=mutates_args)


def static_int(v) -> int:
    """A size that decides a launch configuration, as an int. In an op body traced with dynamic
    shapes a symbolic size is specialized here (a guard on its value): meant for sizes a model
    fixes (hidden size, heads, head and vocabulary dims), not batch or sequence."""
    return v if isinstance(v, int) else int(v)


def capped_power_of_two(v, cap: int) -> int:
    """min(next power of two >= v, cap), cap a power of two. A symbolic v (an op body traced with
    dynamic shapes) costs one guard when it reaches the cap, and is specialized below it."""
    if not isinstance(v, int):
        if v * 2 > cap:
            return cap
        v = int(v)
    return min(triton.next_power_of_2(v), cap)


def real_stand_ins(args: list) -> list:
    """``args`` for compiling a kernel, also while tracing: each tensor (real, fake or functional)
    as a small real one of its dtype on its device (16-byte aligned, as the launches it stands for
    are), each symbolic int as its example value. A compiled kernel depends on nothing else."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return [torch.empty(16, dtype=a.dtype, device=a.device) if isinstance(a, torch.Tensor)
                else (a.node.hint if isinstance(a, torch.SymInt) else a) for a in args]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernels accumulate in: fp64 for fp64 inputs (gradcheck), fp32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tl_acc(dtype: torch.dtype):
    """``acc_dtype`` as a Triton dtype, for a kernel's ``ACC`` constexpr."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def is_power_of_two(v: int) -> bool:
    return v >= 1 and not v & (v - 1)
