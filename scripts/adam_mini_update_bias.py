"""Does a kernelbench AdamMini step differ from official adam-mini's with a sign? Lockstep on slow-chain.

    python scripts/adam_mini_update_bias.py --seed 5 --steps 400 --out bias.json
    TRITON_INTERPRET=1 python scripts/adam_mini_update_bias.py --device cpu --steps 100

Official adam-mini trains train's slow-chain workload (bf16 autocast on CUDA, clip 1.0). Before each
of its steps every other candidate is given official's parameters and clipped gradients and steps
from them with its own state, so each update dB is compared with official's dA from one start:
proj = <dB - dA, dA> / <dA, dA> (signed) and rel = |dB - dA| / |dA|. Rounding the state to nearest
gives proj of about -rel^2 (its error is uncorrelated with the rounded value, not the exact one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

import torch


def summarize(values: list[float]) -> dict[str, float]:
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    return {"mean": mean, "sd": sd, "t": mean / (sd / math.sqrt(n)) if sd > 0 else 0.0,
            "positive": sum(v > 0 for v in values), "n": n}


def main(argv: list[str] | None = None) -> dict:
    from kernelbench.models import Llama
    from kernelbench.train import TrainSettings, resolve
    from kernelbench.train.data import make_stream
    from kernelbench.train.loop import initial_state

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--candidates", default="triton-fp32,triton-fp8")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = TrainSettings.defaults(args.device, data="slow-chain", seed=args.seed, steps=args.steps)
    config = settings.validate()
    names = [n for n in args.candidates.split(",") if n]
    chosen = {c.name: c for c in resolve("adam-mini", config, names=names)}
    stream = make_stream("slow-chain", config.vocab_size, n_sequences=settings.steps * settings.batch,
                         seq=settings.seq, seed=settings.seed, successors=settings.successors, device=args.device)
    init = initial_state(config, settings.seed, args.device)

    def build(name: str):
        with torch.device(args.device):
            model = Llama(config)
        model.load_state_dict(init)
        named = list(model.named_parameters())
        return model, named, chosen[name].make_optimizer(named)

    model, named, official = build("official")
    others = {name: build(name) for name in names}
    order = stream.order(0, settings.batch)
    cuda = args.device == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    proj: dict[str, list[float]] = {n: [] for n in names}
    rel: dict[str, list[float]] = {n: [] for n in names}
    for step in range(settings.steps):
        seqs = stream.tokens[order[step]]
        with autocast:
            loss = model.loss(seqs[:, :-1], seqs[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], settings.clip)
        before = [p.detach().clone() for _, p in named]
        for _, other_named, opt in others.values():
            with torch.no_grad():
                for (_, p), (_, q), start in zip(named, other_named, before):
                    q.copy_(start)
                    q.grad = p.grad.detach().clone()
            opt.step()
            opt.zero_grad(set_to_none=True)
        official.step()
        official.zero_grad(set_to_none=True)
        with torch.no_grad():
            d_a = torch.cat([(p.detach() - s).flatten().double() for (_, p), s in zip(named, before)])
            ref = float(d_a @ d_a)
            for name, (_, other_named, _) in others.items():
                d_b = torch.cat([(q.detach() - s).flatten().double() for (_, q), s in zip(other_named, before)])
                diff = d_b - d_a
                proj[name].append(float(diff @ d_a) / ref)
                rel[name].append(math.sqrt(float(diff @ diff) / ref))
    result = {
        "command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "settings": {k: getattr(settings, k) for k in ("seed", "steps", "model", "seq")},
        "final_loss": float(loss.detach()),
        "candidates": {n: {"proj": summarize(proj[n]), "rel": summarize(rel[n])} for n in names},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
