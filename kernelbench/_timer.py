"""The one event-timing primitive: CUDA events around each timed call, read after a single
synchronisation at the end (perf_counter on the CPU, where the work is done when a call returns).

It lives in the library layer so that auto-selection (kernelbench.nn) can time candidates
without importing the harness; the harness's timing loops and the dist-adamw ranks build on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class RepTimer:
    """Times calls one by one, for loops that put their own untimed work (preparation, an L2
    flush, a barrier) between reps. ``reserve(n)`` creates the events of n reps up front, so
    that creating them costs no host time between reps."""

    def __init__(self, device: torch.device | str, reserve: int = 0) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._spare: list[tuple] = []
        self._reps: list = []
        self.reserve(reserve)

    def reserve(self, n: int) -> None:
        if self.cuda:
            self._spare += [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                            for _ in range(n)]

    def __call__(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once, timed."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            self._reps.append((time.perf_counter() - t0) * 1e3)
            return
        start, end = self._spare.pop() if self._spare else (
            torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start.record()
        fn()
        end.record()
        self._reps.append((start, end))

    def times_ms(self) -> list[float]:
        """Each rep's time in ms (device time on CUDA), in the order they ran."""
        if not self.cuda:
            return list(self._reps)
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) for start, end in self._reps]
