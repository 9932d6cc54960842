"""How far any layer implementation can take a host-bound training step: the ``llama-step`` model
(fwd+bwd of the loss, bf16) with torch's layers, kernelbench's, and with the layers made free.

    python scripts/layer_floor.py [--model llama-7m] [--tokens 8x512] [--modes eager compile]
        [--rounds 15] [--steps 20] [--slots none|eager|all|swap]

"Free" layers do the least a layer can: the norm returns its input (the residual add before it
stays), rotary returns q and k, the SwiGLU activation is ``gate + up`` (one elementwise launch, so
both projections still get their gradients); the loss is torch's. No implementation of those
slots launches less, so the step with every slot free is a floor: ``free / torch`` is the lowest
ratio to torch's layers that any RMSNorm, rotary and SwiGLU could reach on this model, and a target
below it cannot be met by the layers. One slot freed at a time, torch's and kernelbench's, gives
what each slot costs the step in each set (``torch - torch-free-<slot>``). ``--slots swap`` instead
puts one of kernelbench's layers (impl="auto"; the loss too) into torch's model at a time
(``torch+ours-<slot>``), and runs kernelbench's model on torch's formulas (``kernelbench-torch``,
impl="torch": what the layers' wrappers cost alone), so a whole-model ratio can be split by slot.

Each variant's steps run back to back, ``--steps`` of them between two synchronisations, timed
by CUDA events (for a host-bound step that is the host's time to issue it; ``enqueue_ms`` is
the host's own clock over the same steps); the variants take turns ``--rounds`` times and each
variant's median round is kept. ``--slots all`` compiles the per-slot variants too (about 30 s of
compile each). ``kernelbench-auto`` is the layers' default, ``impl="auto"``: each layer measures
Triton against torch at its shapes once (an eager step before compiling); the choices are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernelbench.models.grid import GRID, model_config, parse_tokens
from kernelbench.models.llama import Llama
from kernelbench.nn import autoselect_report
from kernelbench.nn.autoselect import choices_made
from kernelbench.ops.llama_step import STATIC_LAUNCH_OPTIONS
from kernelbench.ops.model_step import compile_step

from common import emit, require_cuda

SLOTS = ("norm", "rotary", "silu_mul")
SWAPPED = (*SLOTS, "loss")


def _free_norm(x, weight, eps):
    return x


def _free_rotary(q, k, cos, sin):
    return q, k


def _free_silu_mul(gate, up):
    return gate + up


FREE = {"norm": _free_norm, "rotary": _free_rotary, "silu_mul": _free_silu_mul}


def _ours(slot: str):
    """kernelbench's layer for ``slot`` at impl="auto", as a plain function a torch model takes."""
    from kernelbench.nn import apply_rotary, cross_entropy, rms_norm, silu_mul

    return {"norm": lambda x, weight, eps: rms_norm(x, weight, eps, impl="auto"),
            "rotary": lambda q, k, cos, sin: apply_rotary(q, k, cos, sin, impl="auto"),
            "silu_mul": lambda gate, up: silu_mul(gate, up, impl="auto"),
            "loss": lambda logits, targets: cross_entropy(logits, targets, impl="auto")}[slot]


def variants(modes: list[str], slots: str) -> list[tuple[str, str, str, str, dict]]:
    """(name, mode, layer set, impl, overrides) of every variant measured."""
    out = []
    for mode in modes:
        per_slot = slots == "all" or (slots == "eager" and mode == "eager")
        out.append(("torch", mode, "torch", "triton", {}))
        if slots == "swap":
            # One slot of torch's model taken by ours at a time, and our layers all on torch's
            # formulas (what our wrappers cost alone).
            out.append(("kernelbench-auto", mode, "kernelbench", "auto", {}))
            out.append(("kernelbench-torch", mode, "kernelbench", "torch", {}))
            out += [(f"torch+ours-{slot}", mode, "torch", "auto", {slot: _ours(slot)}) for slot in SWAPPED]
            continue
        out.append(("kernelbench", mode, "kernelbench", "triton", {}))
        out.append(("kernelbench-auto", mode, "kernelbench", "auto", {}))
        if mode == "compile":
            out.append(("kernelbench+static-launch", mode, "kernelbench", "triton", {}))
            out.append(("kernelbench-auto+static-launch", mode, "kernelbench", "auto", {}))
        out.append(("free", mode, "torch", "triton", dict(FREE)))
        if per_slot:
            for slot in SLOTS:
                out.append((f"torch-free-{slot}", mode, "torch", "triton", {slot: FREE[slot]}))
                out.append((f"kernelbench-free-{slot}", mode, "kernelbench", "triton", {slot: FREE[slot]}))
    return out


def build(config, layers: str, impl: str, overrides: dict, mode: str, static: bool, inputs, targets):
    torch.manual_seed(0)
    model = Llama(config, layers=layers, impl=impl, overrides=overrides).to(inputs.device, torch.bfloat16)

    def loss_and_logits(tokens, labels):
        return model.head_loss(model.hidden_states(tokens), labels)

    forward = loss_and_logits
    if mode == "compile":
        if impl == "auto":
            loss_and_logits(inputs, targets)[0].backward()  # impl="auto" measures its shapes eagerly
        options = STATIC_LAUNCH_OPTIONS if static else None
        forward = compile_step(loss_and_logits, "cuda", options=options)

    def step():
        model.zero_grad(set_to_none=True)
        loss, logits = forward(inputs, targets)
        loss.backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-7m")
    parser.add_argument("--tokens", default=None, help="BxS; default: the grid row's")
    parser.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=("eager", "compile"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slots", choices=("none", "eager", "all", "swap"), default="eager",
                        help="the one-slot-free variants: none, eager only, or eager and compiled; or "
                             "(swap) torch's model with one slot ours at a time, in every mode")
    args = parser.parse_args()
    row = next((r for r in GRID if r.name == args.model), None)
    if row is None and args.tokens is None:
        parser.error(f"--model {args.model}: a model outside the grid needs --tokens BxS")
    config = model_config(args.model)
    batch, seq = parse_tokens(args.tokens) if args.tokens else (row.batch, row.seq)
    device = require_cuda("layer_floor")
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=gen, device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    steps: dict[tuple[str, str], object] = {}
    for name, mode, layers, impl, overrides in variants(args.modes, args.slots):
        t0 = time.perf_counter()
        steps[(mode, name)] = build(config, layers, impl, overrides, mode, name.endswith("static-launch"),
                                    inputs, targets)
        print(f"built {mode:8s} {name:28s} {time.perf_counter() - t0:6.1f} s", flush=True)

    for (op, shape, dtype, _device, mode, variant), choice in choices_made().items():
        times = autoselect_report(op, shape, dtype, mode=mode, variant=variant)["times_ms"]
        print(f"impl='auto' chose {choice} for {op} {variant} {'x'.join(map(str, shape))} {mode} "
              f"(ms: {', '.join(f'{k} {v:.4f}' for k, v in times.items() if v is not None)})")
        emit(model=args.model, autoselect_op=op, variant=variant, shape=list(shape), mode=mode, choice=choice,
             times_ms=times)

    elapsed: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
    enqueue: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
    for _ in range(args.rounds):
        for key, step in steps.items():
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(args.steps):
                step()
            end.record()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            elapsed[key].append(start.elapsed_time(end) / args.steps)
            enqueue[key].append((t1 - t0) * 1e3 / args.steps)

    print(f"\n{args.model} {batch}x{seq}, {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"median of {args.rounds} rounds of {args.steps} steps")
    for mode in args.modes:
        anchor = elapsed[(mode, "torch")]
        print(f"\n| {mode} variant | ms / step | enqueue ms | vs torch (rounds min-max) |\n|---|---|---|---|")
        for (m, name), times in elapsed.items():
            if m != mode:
                continue
            ratios = [t / a for t, a in zip(times, anchor)]
            median = statistics.median(times)
            ratio = median / statistics.median(anchor)
            print(f"| {name} | {median:.3f} | {statistics.median(enqueue[(m, name)]):.3f} | "
                  f"{ratio:.3f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
            emit(model=args.model, tokens=f"{batch}x{seq}", mode=mode, variant=name, ms=round(median, 4),
                 enqueue_ms=round(statistics.median(enqueue[(m, name)]), 4), ratio_to_torch=round(ratio, 4),
                 round_ms=[round(t, 4) for t in times])
        for layers in ("torch", "kernelbench"):
            costs = []
            for slot in SLOTS:
                freed = elapsed.get((mode, f"{layers}-free-{slot}"))
                if freed:
                    costs.append(f"{slot} {statistics.median(elapsed[(mode, layers)]) - statistics.median(freed):+.3f}")
            if costs:
                print(f"{mode}: what each slot costs the step with {layers}'s layers (ms): {', '.join(costs)}")


if __name__ == "__main__":
    main()
