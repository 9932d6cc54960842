"""Peak memory of one call: the allocator's peak minus what was allocated before the call."""

from __future__ import annotations

from collections.abc import Callable

import torch


def peak_memory_delta(fn: Callable[[], None], prepare: Callable[[], None] | None = None) -> int:
    """Bytes the call needed beyond what was live before it (CUDA caching allocator)."""
    if prepare is not None:
        prepare()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
