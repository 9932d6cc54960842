"""Timing loops: CUDA events (optionally replaying a CUDA graph) and a host clock on the CPU.

What every loop does: warm up by time and convert that to a count; time each rep on
its own, with untimed preparation (``prepare``) and, on CUDA, an L2 flush before it; return every
per-rep time (so interleaved rounds can be merged) and a label of the mode; the statistics are
computed once, in :mod:`kernelbench.harness.stats`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from .._timer import RepTimer
from .settings import TimingConfig

# do_bench flushes with a 256 MB write; the flush is never smaller than that, so that when the
# host is slower to enqueue a call than the GPU is to run it, both loops give the host the same
# head start and agree (a smaller flush lets launch latency leak into the timed interval).
MIN_FLUSH_BYTES = 256 * 2**20


class Sample(NamedTuple):
    """Per-rep device (or host-clock) times in ms, the mode, and the median host time spent
    enqueueing one call (ms): when that approaches the device time, the GPU waited for the host
    and the figure includes launch overhead (the runner flags such rows ``host-bound``). On CUDA
    it is measured from an empty launch queue (:func:`issue_ms`)."""

    times: list[float]
    mode: str
    host_ms: float


def _no_prep() -> None:
    pass


class L2Flusher:
    """Writes a buffer larger than the device's L2 cache, so each rep starts cold: twice the L2
    the device reports, and at least MIN_FLUSH_BYTES (do_bench's size)."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        self.nbytes = max(2 * l2, MIN_FLUSH_BYTES)
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _estimate_count(total_ms: float, per_call_ms: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, total_ms / max(per_call_ms, 1e-6))))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def time_cuda(fn: Callable[[], None], prepare: Callable[[], None] = _no_prep,
              config: TimingConfig = TimingConfig()) -> Sample:
    """Per-rep times of ``fn`` in ms by CUDA events (cold L2 unless disabled), and the mode."""
    if config.cuda_graph:
        return _time_cuda_graph(fn, prepare, config)
    flush = L2Flusher() if config.flush_l2 else _no_prep
    # First call: compilation, autotuning, lazy state; then estimate one call's time over 5.
    prepare()
    fn()
    torch.cuda.synchronize()
    def five_calls() -> None:
        for _ in range(5):
            prepare()
            flush()
            fn()

    probe = RepTimer("cuda")
    probe(five_calls)
    estimate = probe.times_ms()[0] / 5
    n_warmup = _estimate_count(config.warmup_ms, estimate, 1, config.max_reps)
    n_reps = _estimate_count(config.rep_ms, estimate, config.min_reps, config.max_reps)
    for _ in range(n_warmup):
        prepare()
        fn()
    timer = RepTimer("cuda", reserve=n_reps)
    for _ in range(n_reps):
        prepare()
        flush()
        timer(fn)
    times = timer.times_ms()
    return Sample(times, "cuda-events" + (", L2 flushed" if config.flush_l2 else ", warm L2"),
                  issue_ms(fn, prepare, flush))


ISSUE_REPS = 3


def issue_ms(fn: Callable[[], None], prepare: Callable[[], None] = _no_prep,
             flush: Callable[[], None] = _no_prep) -> float:
    """Median host time (ms) to issue one call, each of ISSUE_REPS calls started from an empty
    launch queue. Back to back, a call of many launches soon finds the queue full and waits there
    for the GPU, which would read as host time (a model step would look host-bound)."""
    times = []
    for _ in range(ISSUE_REPS):
        prepare()
        flush()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return _median(times)


def _time_cuda_graph(fn: Callable[[], None], prepare: Callable[[], None], config: TimingConfig) -> Sample:
    """Replays a graph of one call (plus the L2 flush, captured too), and subtracts the median of a
    second graph that only flushes, as tritonbench does, so launch gaps vanish but L2 stays cold.
    ``prepare`` runs before the warm-up and again right before capture, so the captured call starts
    from the state every rep of the eager loop starts from: after the warm-up's backward passes a
    leaf's ``.grad`` exists, and a graph captured then would accumulate into it (an extra
    read-modify-write kernel per leaf) instead of writing it. Work that must be redone each rep
    can't be graphed."""
    flush = L2Flusher() if config.flush_l2 else None
    prepare()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    prepare()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if flush is not None:
            flush()
        fn()
    flush_graph = None
    if flush is not None:
        flush_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(flush_graph):
            flush()

    def replay_times(g: torch.cuda.CUDAGraph) -> list[float]:
        g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        estimate = start.elapsed_time(end) / 5
        for _ in range(_estimate_count(config.warmup_ms, estimate, 1, config.max_reps)):
            g.replay()
        n = _estimate_count(config.rep_ms, estimate, config.min_reps, config.max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    times = replay_times(graph)
    if flush_graph is None:
        return Sample(times, "cuda-graph, warm L2", 0.0)
    flush_times = sorted(replay_times(flush_graph))
    flush_ms = flush_times[len(flush_times) // 2]
    return Sample([max(t - flush_ms, 0.0) for t in times],
                  f"cuda-graph, L2 flush graph ({flush_ms:.4f} ms) subtracted", 0.0)


def time_cpu(fn: Callable[[], None], prepare: Callable[[], None] = _no_prep,
             config: TimingConfig = TimingConfig()) -> Sample:
    """Host-clock timing for CPU candidates (perf_counter around each call)."""
    prepare()
    fn()
    t0 = time.perf_counter()
    prepare()
    fn()
    estimate = (time.perf_counter() - t0) * 1e3
    for _ in range(_estimate_count(config.warmup_ms, estimate, 1, config.max_reps)):
        prepare()
        fn()
    n_reps = _estimate_count(config.rep_ms, estimate, config.min_reps, config.max_reps)
    times = []
    for _ in range(n_reps):
        prepare()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Sample(times, "cpu perf_counter", _median(times))


# Host timing: calls between two device synchronisations. Small enough that tiny workloads never
# fill the launch queue (a full queue would make the host wait for the GPU).
HOST_SYNC_EVERY = 32
HOST_MODE = "host perf_counter per call, device not waited for"


def time_host(fn: Callable[[], None], prepare: Callable[[], None] = _no_prep,
              config: TimingConfig = TimingConfig()) -> Sample:
    """Per-call host time in ms: ``perf_counter`` around each call, the device not waited for
    (it is synchronised every HOST_SYNC_EVERY calls, outside the timed calls). Meant for inputs
    so small that the GPU finishes each call before the host has issued the next: then this is
    what a call costs the host (argument checks, allocation, launches, autograd bookkeeping)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    sync = torch.cuda.synchronize if cuda else _no_prep
    prepare()
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(5):
        prepare()
        fn()
    sync()
    estimate = (time.perf_counter() - t0) * 1e3 / 5
    for _ in range(_estimate_count(config.warmup_ms, estimate, 1, config.max_reps)):
        prepare()
        fn()
    sync()
    n_reps = _estimate_count(config.rep_ms, estimate, config.min_reps, config.max_reps)
    times = []
    for i in range(n_reps):
        prepare()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if i % HOST_SYNC_EVERY == HOST_SYNC_EVERY - 1:
            sync()
    sync()
    return Sample(times, HOST_MODE, _median(times))
