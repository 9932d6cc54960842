"""Whether a launch-bound RMSNorm's host time per call changes once the process has built and run
compiled models (as ``configs/model.toml`` does before its host workloads), and what in that
process state matters: the cyclic garbage collector over the objects the compiles leave alive.

Cases, each timed in interleaved rounds: ``F.rms_norm`` and kernelbench's ``rms_norm`` (Triton),
forward without grad and forward + backward, on 8 x 4096 bf16. Phases: a fresh process; after two
compiled Llama steps (torch's layers and kernelbench's); the same with ``gc.freeze()``; with the
collector disabled.

    python scripts/probes/host_after_model.py [--calls 1500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics

import torch
import torch.nn.functional as F
from host_breakdown import per_call_us

from kernelbench.models.llama import CONFIGS, Llama
from kernelbench.nn.rmsnorm import rms_norm

from common import emit


def run_compiled_models(config_name: str) -> None:
    config = CONFIGS[config_name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (4, 2049), generator=gen, device="cuda")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    for layers in ("torch", "kernelbench"):
        model = Llama(config, layers=layers).to("cuda", torch.bfloat16)

        def loss_and_logits(model=model):
            logits = model(inputs)
            return model.layer_set.loss(logits, targets), logits

        loss_and_logits()[0].backward()
        step = torch.compile(loss_and_logits, fullgraph=True)
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            step()[0].backward()
        del model, step
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--config", default="llama-1b-layer4")
    args = parser.parse_args()
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)

    def clear():
        x.grad = w.grad = None

    def no_grad(f):
        def run():
            with torch.no_grad():
                f()
        return run

    f_rms = lambda: F.rms_norm(x, (4096,), w, 1e-6)
    ours = lambda: rms_norm(x, w, 1e-6, impl="triton")
    cases = {
        "fwd F.rms_norm": no_grad(f_rms),
        "fwd ours": no_grad(ours),
        "fwd+bwd F.rms_norm": lambda: torch.autograd.backward(f_rms(), dy),
        "fwd+bwd ours": lambda: torch.autograd.backward(ours(), dy),
    }

    def measure(phase: str) -> None:
        results: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                results.setdefault(name, []).append(per_call_us(fn, args.calls, prepare=clear))
        small = ours().grad_fn.small is not None
        print(f"== {phase} (gc objects tracked: {len(gc.get_objects())}; small call taken: {small})")
        for name, values in results.items():
            print(f"{name:22s} {statistics.median(values):8.1f} us  (rounds: {', '.join(f'{v:.1f}' for v in values)})")
            emit(phase=phase, case=name, median_us=round(statistics.median(values), 2))

    measure("fresh process")
    run_compiled_models(args.config)
    measure("after two compiled Llama steps")
    gc.freeze()
    measure("after, gc.freeze()")
    gc.unfreeze()
    gc.disable()
    measure("after, collector disabled")
    gc.enable()


if __name__ == "__main__":
    main()
