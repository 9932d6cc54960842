"""What a call of kernelbench's RMSNorm forward op costs the host beyond its Python body,
measured on a CPU with every launch made a no-op: the body (``_forward``), the same through
``torch.ops.kernelbench.rms_norm_fwd`` (what a compiled graph calls per norm), and through a
bare ``torch.library.Library`` kernel (no torch.library Python wrappers), 4096 x 256 bf16, no grad.

    python scripts/probes/op_call_cpu.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import timeit

import torch

import kernelbench.nn.rmsnorm_kernels as K
from kernelbench.nn import rmsnorm as R


def no_launch(device, *args):
    return True


def bind_no_launch(self, aligned, args):  # stands in for _Launch.first_or_fallback: no Triton
    self.direct = no_launch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    K._Launch.first_or_fallback = bind_no_launch
    K.sm_count = lambda device: 132
    K._current_device = lambda: -1
    R.runs_here = lambda t: True
    lib = torch.library.Library("kernelbench_probe", "DEF")
    lib.define("rms_norm_fwd(Tensor x, Tensor? weight, Tensor? residual, float eps) -> (Tensor, Tensor, Tensor)")

    def body(x, weight, residual, eps):
        y, h, saved = K._forward(x, weight, residual, eps)
        return y, (h if h is not None else x.new_empty(0)), saved[2]

    lib.impl("rms_norm_fwd", body, "CPU")
    x, r = (torch.randn(4096, 256, dtype=torch.bfloat16) for _ in range(2))
    w = torch.ones(256, dtype=torch.bfloat16, requires_grad=True)
    custom_op = torch.ops.kernelbench.rms_norm_fwd.default
    bare = torch.ops.kernelbench_probe.rms_norm_fwd.default
    cases = {
        "body": lambda: K._forward(x, w, r, 1e-6),
        "torch.ops.kernelbench.rms_norm_fwd": lambda: custom_op(x, w, r, 1e-6),
        "bare Library kernel": lambda: bare(x, w, r, 1e-6),
    }
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, call in cases.items():
                for _ in range(200):
                    call()
                us = min(timeit.repeat(call, number=1000, repeat=7)) / 1000 * 1e6
                print(f"{name:36s} {us:7.1f} us per call")


if __name__ == "__main__":
    main()
