"""Where the host's time goes in a compiled ``llama-step`` fwd+bwd step, torch's layers against
kernelbench's: Inductor's generated code for each (written to ``--code-dir``, with its launch
count), then cProfile over ``--steps`` steps, the functions with the most own time per step.

    python scripts/probes/compiled_host.py [--config llama-7m] [--batch 8] [--seq 512] [--steps 50]
        [--top 25] [--code-dir DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

from kernelbench.models.llama import CONFIGS, Llama

from common import emit, require_cuda


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="llama-7m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--code-dir", default=None)
    args = parser.parse_args()
    device = require_cuda("compiled_host")
    config = CONFIGS[args.config]
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=gen, device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    for layers in ("torch", "kernelbench"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Llama(config, layers=layers, impl="triton").to(device, torch.bfloat16)

        def loss_and_logits(model=model):
            logits = model(inputs)
            return model.layer_set.loss(logits, targets), logits

        forward = torch.compile(loss_and_logits, fullgraph=True)

        def step(model=model, forward=forward):
            model.zero_grad(set_to_none=True)
            forward()[0].backward()

        _, code = run_and_get_code(step)
        code = "\n\n".join(code)
        launches = len(re.findall(r"\.run\(", code))
        print(f"== {layers}: {launches} kernel launches (.run calls) in Inductor's code")
        if args.code_dir:
            Path(args.code_dir, f"inductor-{layers}.py").write_text(code)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        profiler.disable()
        stats = pstats.Stats(profiler)
        total = stats.total_tt / args.steps * 1e3
        print(f"   host time under cProfile: {total:.2f} ms per step")
        emit(layers=layers, launches=launches, host_ms_per_step_cprofile=round(total, 3))
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.top]
        for (file, line, name), (_, calls, own, cum, _) in rows:
            where = f"{Path(file).name}:{line}({name})"
            print(f"   {own / args.steps * 1e3:7.3f} ms own {cum / args.steps * 1e3:7.3f} ms cum "
                  f"{calls / args.steps:6.0f}x  {where}")
            emit(layers=layers, function=where, own_ms_per_step=round(own / args.steps * 1e3, 4),
                 calls_per_step=calls / args.steps)


if __name__ == "__main__":
    main()
