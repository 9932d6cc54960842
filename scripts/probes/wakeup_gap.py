"""Whether a launch-bound forward + backward's host time (8 x 4096 bf16) depends on how long the
host was busy elsewhere between calls: the autograd engine hands a CUDA backward to its device
thread and back, and a thread that slept longer may take longer to wake. Each call is timed
alone, after an untimed busy wait of ``gap`` microseconds; with the engine's threads (default)
and with the backward on the calling thread (``set_multithreading_enabled(False)``).

Every case is timed in each of several interleaved rounds; the median of the rounds is printed.

    python scripts/probes/wakeup_gap.py [--calls 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch.nn.functional as F
from host_breakdown import per_call_us

from kernelbench.nn.rmsnorm import rms_norm

from common import fwd_bwd, print_rounds, rmsnorm_host_inputs

GAPS_US = (0, 25, 50, 100, 200, 400)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    x, w, dy = rmsnorm_host_inputs()

    def prepare_with(gap_us: float):
        def prepare():
            x.grad = w.grad = None
            end = time.perf_counter() + gap_us * 1e-6
            while time.perf_counter() < end:
                pass
        return prepare

    layers = {"F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
              "ours": lambda: rms_norm(x, w, 1e-6, impl="triton")}
    cases = {}
    for single in (False, True):
        for gap in GAPS_US:
            for name, layer in layers.items():
                label = f"{'single-threaded' if single else 'engine threads'}, gap {gap:3d} us, {name}"
                cases[label] = (fwd_bwd(layer, dy, single), prepare_with(gap))
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, (fn, prepare) in cases.items():
            results.setdefault(label, []).append(per_call_us(fn, args.calls, prepare=prepare))
    print_rounds(results, width=52)


if __name__ == "__main__":
    main()
