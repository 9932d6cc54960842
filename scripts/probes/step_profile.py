"""Where an eager Llama training step's GPU time goes: torch.profiler over fwd+bwd of the
``llama-step`` model, per layer set, kernels grouped by name (top N by total CUDA time).

    python scripts/probes/step_profile.py [--config llama-1b-layer4] [--layers torch kernelbench] [--top 25]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from kernelbench.models.llama import CONFIGS, Llama

from common import emit, require_cuda


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="llama-1b-layer4")
    parser.add_argument("--layers", nargs="+", default=["torch", "kernelbench"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    device = require_cuda("step_profile")
    config = CONFIGS[args.config]
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=gen, device=device)
    for layers in args.layers:
        torch.manual_seed(0)
        model = Llama(config, layers=layers).to(device, torch.bfloat16)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            model.loss(tokens[:, :-1], tokens[:, 1:]).backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        totals: dict[str, list[float]] = {}
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                entry = totals.setdefault(evt.name[:90], [0.0, 0])
                entry[0] += evt.device_time / 3 / 1e3  # ms per step
                entry[1] += 1 / 3
        total = sum(v[0] for v in totals.values())
        print(f"== layers={layers}: {total:.2f} ms of kernels per step")
        for name, (ms, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"{ms:8.3f} ms {count:5.0f}x  {name}")
            emit(layers=layers, kernel=name, ms_per_step=round(ms, 4), calls_per_step=round(count, 1))


if __name__ == "__main__":
    main()
