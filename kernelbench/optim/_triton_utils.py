"""Helpers shared by kernelbench's Triton optimizers (TritonAdamW, AdamMini, Adafactor8bit).

Import it only from modules that define kernels themselves: ``_aligned`` is a ``triton.jit``
function, so ``TRITON_INTERPRET`` must be decided before the first import.

* Input checks that name the offending parameter.
* Launch tables: one int64 tensor per (group, dtype) holding every tensor's address and layout,
  uploaded once and reused while the set of tensors stays the same, so that a whole group is
  updated by one launch (a launch per tensor is what made FlashOptim slower than torch foreach).
* fp64 scalars passed to kernels as their int64 bit pattern: Triton hands a Python float to a
  compiled kernel as fp32 unless annotated, and its interpreter always rounds it to fp32; the bit
  pattern reaches both paths exactly and is bitcast back inside the kernel.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
from collections.abc import Iterable, Sequence

import torch
import triton
import triton.language as tl

from ._sharding import check_kernel_tensor

# Param / state dtypes of the one-launch-per-group optimizers, and their Triton element types.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
# Row of a launch table per tensor: 8 int64 = one 64-byte line, so a program's lookups cost one miss.
TABLE_STRIDE = 8
TABLE_STRIDE_C = tl.constexpr(TABLE_STRIDE)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def f64_bits(x: float) -> int:
    """The IEEE-754 bit pattern of ``x`` as a signed int64 (the kernel bitcasts it back)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def log_or_neg_inf(x: float) -> float:
    """log(x), with log(0) = -inf so that exp(step * log(beta)) gives beta**step = 0 for beta = 0."""
    return math.log(x) if x > 0.0 else -math.inf


def param_label(name: str | None, index: int, param: torch.Tensor) -> str:
    shape = "x".join(map(str, param.shape)) or "scalar"
    return f"parameter '{name}' ({shape})" if name else f"parameter {index} ({shape})"


def check_device_supported(device: torch.device, who: str) -> None:
    if device.type == "meta":
        raise ValueError(f"{who}: the parameters are meta tensors (no storage); materialise the model first "
                         "(module.to_empty(device=...) and initialise it) before step().")
    if device.type == "cuda" or interpreting():
        return
    raise RuntimeError(
        f"{who}: parameters on {device} need a CUDA GPU, or TRITON_INTERPRET=1 to run the Triton "
        "kernels in the (slow) interpreter on the CPU."
    )


def check_param_and_grad(
    label: str, param: torch.Tensor, grad: torch.Tensor, device: torch.device, dtypes: Sequence[torch.dtype], who: str
) -> None:
    """Clear errors for what the kernels cannot take. Dense non-contiguous layouts are accepted
    when grad and param share strides, since an elementwise update only needs the same element
    order in every tensor; anything else (overlapping or gapped views) is rejected. ``param`` and
    ``grad`` are the tensors the kernels will read (local shards of DTensors)."""
    if grad.is_sparse or grad.layout is not torch.strided:
        raise RuntimeError(f"{who}: {label} has a sparse gradient ({grad.layout}); only dense (strided) "
                           "gradients are supported (torch.optim.SparseAdam handles sparse ones).")
    if param.is_complex():
        raise RuntimeError(f"{who}: {label} is complex ({param.dtype}); supported dtypes: "
                           f"{', '.join(str(d) for d in dtypes)}. View it with torch.view_as_real first.")
    if param.dtype not in dtypes:
        raise RuntimeError(f"{who}: {label} has dtype {param.dtype}; supported: {', '.join(str(d) for d in dtypes)}.")
    if param.device != device:
        raise RuntimeError(f"{who}: {label} is on {param.device} but the first parameter of its group is on "
                           f"{device}; every parameter of a group must be on one device.")
    if grad.device != param.device:
        raise RuntimeError(f"{who}: {label} is on {param.device} but its gradient is on {grad.device}.")
    if grad.shape != param.shape:
        raise RuntimeError(f"{who}: {label} has a gradient of shape {tuple(grad.shape)}, expected "
                           f"{tuple(param.shape)} (the parameter's shape).")
    if grad.dtype != param.dtype:
        raise RuntimeError(f"{who}: {label} is {param.dtype} but its gradient is {grad.dtype}; they must match.")
    check_kernel_tensor(param, label, device, who)
    check_kernel_tensor(grad, f"the gradient of {label}", device, who)
    if not _is_dense(param):
        raise RuntimeError(f"{who}: {label} is a view with gaps or overlaps (strides {param.stride()}); "
                           "only dense parameters (contiguous, or a permutation of a contiguous tensor) work.")
    if param.numel() > 1 and grad.stride() != param.stride():
        raise RuntimeError(f"{who}: {label} has strides {param.stride()} but its gradient has {grad.stride()}; "
                           "they must match (call .contiguous() on both, or keep autograd's gradient layout).")


def check_same_layout(label: str, param: torch.Tensor, state: torch.Tensor, key: str, who: str) -> None:
    """``state`` (local) is laid out like ``param`` (local) and may go to a kernel."""
    check_kernel_tensor(state, f"state '{key}' of {label}", param.device, who)
    if state.shape != param.shape or (param.numel() > 1 and state.stride() != param.stride()):
        raise RuntimeError(f"{who}: state '{key}' of {label} has shape {tuple(state.shape)} / strides "
                           f"{state.stride()}, expected those of the parameter {tuple(param.shape)} / "
                           f"{param.stride()}.")
    if state.device != param.device:
        raise RuntimeError(f"{who}: state '{key}' of {label} is on {state.device}, the parameter on {param.device}.")


def _is_dense(t: torch.Tensor) -> bool:
    """True when the elements fill exactly numel consecutive slots (any stride order)."""
    if t.is_contiguous():
        return True
    sizes_strides = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1)
    expected = 1
    for stride, size in sizes_strides:
        if stride != expected:
            return False
        expected *= size
    return True


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Launches on ``device`` (kernels run on the current CUDA device, which may be another GPU)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def one_device(devices: Iterable[torch.device], who: str) -> torch.device:
    """The one device a step's launches run on; parameters on several devices are an error (the
    step counters of every launch are advanced by one kernel, which reads one device's memory)."""
    found = list(dict.fromkeys(devices))
    if len(found) > 1:
        raise RuntimeError(f"{who}: the parameters are on {' and '.join(map(str, found))}; one optimizer steps "
                           "parameters of one device (build one optimizer per device).")
    return found[0]


def upload_int64(values: Iterable[int], device: torch.device) -> torch.Tensor:
    """A host list as an int64 tensor on ``device``. On CUDA the copy goes through pinned memory
    with non_blocking=True, so a table rebuild does not wait for the GPU; the caching host
    allocator keeps the pinned buffer alive until the copy has run."""
    host = torch.tensor(list(values), dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def refuse_rebuild_while_capturing(who: str) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{who}: the set of parameters / gradients changed during CUDA-graph capture, so the launch "
            "tables would need rebuilding inside the graph. Run one step() before capturing, and keep the "
            "same gradient tensors (zero_grad(set_to_none=False)) inside the graph."
        )


@triton.jit
def _aligned(addr, ptr_ty: tl.constexpr, ALIGNED: tl.constexpr):
    """An int64 address as a pointer; with ALIGNED, marked 16-byte aligned *after* the cast (a
    hint on the int64 does not survive int-to-pointer), which lets full blocks use 16-byte vectors."""
    ptr = addr.to(ptr_ty)
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr
