"""The device's own ceilings, measured in the same process: copy bandwidth and bf16 matmul rate.

A candidate's GB/s and TFLOP/s are quoted as a percentage of these, and a figure above them
(by more than the ceiling's own noise) is flagged as a measurement error, never shown as a win.
Measured once per device per process (functools.cache), with the same timing loop as candidates.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from .stats import summarize
from .timing import TimingConfig, time_cuda

COPY_BYTES = 2 * 2**30  # a 2 GiB device-to-device copy: far past any L2, so HBM is what is timed
MATMUL_N = 8192  # bf16 matmul 8192^3: large enough for cuBLAS to reach the tensor cores' rate
# A result may exceed a ceiling by this much before it is called a measurement error
# (both are medians of noisy loops; the copy is not a perfect roofline).
CEILING_SLACK = 1.05


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    matmul_tflops: float
    copy_bytes: int = COPY_BYTES
    matmul_n: int = MATMUL_N

    def as_dict(self) -> dict:
        return asdict(self)


def _copy_gbps(config: TimingConfig) -> float:
    src = torch.empty(COPY_BYTES // 2 // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    copy = summarize(time_cuda(lambda: dst.copy_(src), config=config).times)
    return COPY_BYTES / (copy.median * 1e-3) / 1e9  # bytes read + written


def _matmul_tflops(config: TimingConfig) -> float:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.empty_like(a)
    mm = summarize(time_cuda(lambda: torch.matmul(a, b, out=out), config=config).times)
    return 2 * MATMUL_N**3 / (mm.median * 1e-3) / 1e12


@functools.cache
def measure_ceilings(device_index: int = 0) -> Ceilings:
    config = TimingConfig(warmup_ms=50, rep_ms=200)
    with torch.cuda.device(device_index):
        copy_gbps = _copy_gbps(config)  # its buffers are freed on return, before the matmul's
        matmul_tflops = _matmul_tflops(config)
        torch.cuda.empty_cache()
    return Ceilings(copy_gbps=copy_gbps, matmul_tflops=matmul_tflops)
