"""Which tensors are alive at a training step's memory peak: the ``llama-step`` model (fwd+bwd of
the loss, bf16, the logits kept as ``llama-step`` keeps them), per layer set, eager.

    python scripts/step_memory.py [--model llama-3.2-1b-layer4] [--tokens 1x512]
        [--layers torch kernelbench] [--impl auto] [--top 15] [--cpp]

After two warm steps, the CUDA caching allocator records one step's allocations and frees
(``torch.cuda.memory._record_memory_history``). Replaying them gives the bytes allocated above the
step's start at every event, so the peak and the blocks alive at it, each with where it was
allocated: the innermost frame in kernelbench or the model, else the innermost Python frame
(``--cpp``: C++ frames too, which the autograd engine's allocations need; slower to symbolise).
The replayed peak is printed beside ``torch.cuda.max_memory_allocated`` over the same step.
Then, for every pair of layer sets, the blocks at the peak that one holds and the other does not,
by size and site: what a difference between their peaks is made of.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from kernelbench.models.grid import model_config, parse_tokens
from kernelbench.models.llama import Llama

from common import emit, require_cuda

MB = 2**20


def build_step(config, layers: str, impl: str, inputs, targets):
    torch.manual_seed(0)
    model = Llama(config, layers=layers, impl=impl).to(inputs.device, torch.bfloat16)
    kept = []

    def prepare():  # as llama-step's: the last step's logits and gradients go before the next
        kept.clear()
        model.zero_grad(set_to_none=True)

    def run():
        loss, logits = model.head_loss(model.hidden_states(inputs), targets)
        loss.backward()
        kept.append(logits)

    for _ in range(2):
        prepare()
        run()
    torch.cuda.synchronize()
    return prepare, run


def _site(frames: list[dict]) -> str:
    """Where a block was allocated: the innermost frame in kernelbench or the model's code."""
    if not frames:
        return "<no Python frame: the autograd engine or C++>"
    for f in frames:
        if "kernelbench" in f["filename"]:
            return f"{f['filename'].split('kernelbench/')[-1]}:{f['line']} {f['name']}"
    py = [f for f in frames if f["filename"].endswith(".py")]
    f = (py or frames)[0]
    return f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"


def peak_blocks(prepare, run, cpp: bool) -> tuple[int, int, list[tuple[int, str]]]:
    """(replayed peak bytes above the step's start, the allocator's own, [(size, site)] alive at the peak)."""
    prepare()
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all" if cpp else "python")
    run()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - start
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: list[tuple[int, str]] = []
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, _site(event.get("frames", [])))
            current += size
            if current > peak:
                peak, at_peak = current, list(live.values())
        elif action == "free_completed":
            live.pop(addr, None)  # a block from before the step counts against its start
            current -= size
    return peak, measured, at_peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.2-1b-layer4", help="a grid name or a model spec")
    parser.add_argument("--tokens", default="1x512", help="BxS")
    parser.add_argument("--layers", nargs="+", default=["torch", "kernelbench"])
    parser.add_argument("--impl", default="auto", choices=("auto", "triton", "torch"))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--cpp", action="store_true", help="C++ frames too (slower)")
    args = parser.parse_args()
    device = require_cuda("step_memory")
    config = model_config(args.model)
    batch, seq = parse_tokens(args.tokens)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=gen, device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    held: dict[str, Counter] = {}
    for layers in args.layers:
        prepare, run = build_step(config, layers, args.impl, inputs, targets)
        peak, measured, blocks = peak_blocks(prepare, run, args.cpp)
        held[layers] = Counter(blocks)
        print(f"== {layers} (impl={args.impl}), {args.model} {args.tokens}: peak {peak / MB:.2f} MB above the "
              f"step's start by replay, {measured / MB:.2f} MB by max_memory_allocated; {len(blocks)} blocks alive")
        emit(layers=layers, model=args.model, tokens=args.tokens, peak_replayed_bytes=peak,
             peak_measured_bytes=measured)
        by_site = Counter()
        for (size, site), n in held[layers].items():
            by_site[site] += size * n
        for site, size in by_site.most_common(args.top):
            print(f"   {size / MB:10.2f} MB  {site}")
        del prepare, run
        torch.cuda.empty_cache()
    names = list(held)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            only_a, only_b = held[a] - held[b], held[b] - held[a]
            mb_a, mb_b = (sum(s * n for (s, _), n in only.items()) / MB for only in (only_a, only_b))
            print(f"\n== alive at the peak in {a} and not in {b} (+{mb_a:.2f} MB), and the reverse (+{mb_b:.2f} MB)")
            for who, only in ((a, only_a), (b, only_b)):
                for (size, site), n in sorted(only.items(), key=lambda kv: -kv[0][0] * kv[1])[: args.top]:
                    print(f"   {who:12s} {n:3d} x {size / MB:9.3f} MB  {site}")
                    emit(only_in=who, other=b if who == a else a, size_bytes=size, count=n, site=site)


if __name__ == "__main__":
    main()
