"""Device facts the kernels' launch configurations depend on, looked up once per device."""

from __future__ import annotations

import functools

import torch

# Off CUDA (the Triton interpreter) a few programs, so that persistent loops run several tiles each.
INTERPRETER_SM_COUNT = 4


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device | int | None) -> int:
    """Streaming multiprocessors of a CUDA device (a device, its index, or None for the current
    one when CUDA is available); INTERPRETER_SM_COUNT for a non-CUDA device."""
    if isinstance(device, int):
        return _cuda_sm_count(device)
    if device is None:
        return _cuda_sm_count(torch.cuda.current_device()) if torch.cuda.is_available() else INTERPRETER_SM_COUNT
    device = torch.device(device)
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
