"""The SwiGLU kernels (kernelbench.nn.swiglu) under several launch configurations, timed
interleaved by the harness's loop beside torch.compile's fused kernel, to check or re-pick
``default_config`` on a new GPU.

    python scripts/tune_swiglu.py [--shape 8192x8192] [--dtype bf16] [--rounds 3]

Forward (3 x numel x s bytes) and backward (5 x numel x s) alone, each configuration checked
bit for bit against the default's results first. One JSON line per (direction, config): median ms,
GB/s of the bytes model, and the share of this process's device-to-device copy bandwidth.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from kernelbench.harness.ceilings import measure_ceilings
from kernelbench.nn.swiglu import SiluMulConfig, default_config, host

from common import emit, interleaved_ms, require_cuda

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CONFIGS = [SiluMulConfig(block, warps) for block, warps in
           ((1024, 4), (2048, 4), (4096, 4), (2048, 8), (4096, 8), (8192, 8), (4096, 16), (8192, 16))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x8192")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = require_cuda("tune_swiglu")
    shape, dtype = tuple(int(d) for d in args.shape.split("x")), DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    gate, up, dy = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(3))
    numel, size = gate.numel(), gate.element_size()
    copy_gbps = measure_ceilings(device.index or 0).copy_gbps
    default = default_config(size)

    want_fwd, want_bwd = host.forward(gate, up), host.backward(dy, gate, up)
    for cfg in CONFIGS:
        same = torch.equal(host.forward(gate, up, config=cfg), want_fwd) and all(
            torch.equal(a, b) for a, b in zip(host.backward(dy, gate, up, config=cfg), want_bwd))
        if not same:
            raise SystemExit(f"tune_swiglu: {cfg} computes something else than {default}")

    # Inductor's fused forward: the anchor the op's fwd rows compare against.
    compiled = torch.compile(lambda g, u: F.silu(g) * u, dynamic=False)
    for direction, passes, cases in (
        ("fwd", 3, {**{str(c): (lambda c=c: host.forward(gate, up, config=c)) for c in CONFIGS},
                    "torch-compile": lambda: compiled(gate, up)}),
        ("bwd", 5, {str(c): (lambda c=c: host.backward(dy, gate, up, config=c)) for c in CONFIGS}),
    ):
        for label, ms in interleaved_ms(cases, rounds=args.rounds).items():
            gbps = passes * numel * size / ms / 1e6
            emit(direction=direction, case=label, default=label == str(default),
                 shape=args.shape, dtype=args.dtype, median_ms=round(ms, 4), gbps=round(gbps, 1),
                 pct_copy=round(100 * gbps / copy_gbps, 1))


if __name__ == "__main__":
    main()
