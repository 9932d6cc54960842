"""Where a Llama training step's GPU time goes: torch.profiler over fwd+bwd of the
``llama-step`` model, per layer set, eager or (``--compile``) under torch.compile(fullgraph=True)
as ``llama-step``'s compiled candidates run it, kernels grouped by name (top N by total CUDA time),
with the step's elapsed time beside the kernels' sum.

    python scripts/probes/step_profile.py [--config llama-1b-layer4] [--layers torch kernelbench] [--top 25]
        [--compile] [--impl triton]

``--impl`` is kernelbench's layers' ``impl``; its default is the one ``llama-step``'s candidates use.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from kernelbench.models.llama import CONFIGS, Llama
from kernelbench.ops.llama_step import StepSpec

from common import emit, require_cuda


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="llama-1b-layer4")
    parser.add_argument("--layers", nargs="+", default=["torch", "kernelbench"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--compile", action="store_true", help="the step under torch.compile(fullgraph=True)")
    parser.add_argument("--impl", default=StepSpec("kernelbench").impl, choices=("auto", "triton", "torch"))
    args = parser.parse_args()
    device = require_cuda("step_profile")
    config = CONFIGS[args.config]
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=gen, device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    for layers in args.layers:
        torch.manual_seed(0)
        model = Llama(config, layers=layers, impl=args.impl).to(device, torch.bfloat16)

        def loss_and_logits(model=model):  # what llama-step times: the logits stay alive
            logits = model(inputs)
            return model.layer_set.loss(logits, targets), logits

        forward = loss_and_logits
        if args.compile:
            if args.impl == "auto":
                loss_and_logits()[0].backward()  # an eager step first: impl="auto" measures its shapes
            forward = torch.compile(loss_and_logits, fullgraph=True)

        def step(model=model, forward=forward):
            model.zero_grad(set_to_none=True)
            forward()[0].backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            step()
        end.record()
        torch.cuda.synchronize()
        elapsed = start.elapsed_time(end) / 3
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
        kind = "compiled" if args.compile else "eager"
        print(f"== layers={layers} impl={args.impl} ({kind}): {total:.2f} ms of kernels per step, "
              f"{elapsed:.2f} ms elapsed")
        for name, (ms, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"{ms:8.3f} ms {count:5.0f}x  {name}")
            emit(layers=layers, compiled=args.compile, kernel=name, ms_per_step=round(ms, 4),
                 calls_per_step=round(count, 1))


if __name__ == "__main__":
    main()
