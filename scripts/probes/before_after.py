"""One optimizer class from two module paths (e.g. a kernel file before and after a refactor),
timed interleaved in one process and checked bit for bit.

    python scripts/probes/before_after.py kernelbench.optim._before_adafactor kernelbench.optim.adafactor \
        --cls Adafactor8bit --workload model-370m [--kwargs '{"quantize": false}']

First the parity check: both optimizers start from the same params and take ``--steps`` steps on
the same seeded gradients; every param and state tensor must be equal (``torch.equal``). Then the
step time: gradients set once, ``step()`` timed by the harness's loop (CUDA events, median, L2
flushed), the two candidates alternated ``--rounds`` times. One JSON line per result; the exit
status is 1 when any tensor differs.
"""

from __future__ import annotations

import argparse
import importlib
import json

import torch

from kernelbench.ops.optim_workloads import MODEL_370M, SINGLE_4096x1024

from common import emit, interleaved_ms, require_cuda

WORKLOADS = {w.name: w for w in (MODEL_370M, SINGLE_4096x1024)}
# The ops' hyperparameters, so the timed step is the one `kernelbench run` measures.
HYPERPARAMS = {
    "Adafactor8bit": {"lr": 1e-2, "weight_decay": 0.01},
    "TritonAdamW": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
}


def make_params(shapes, device: torch.device, seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [(name, torch.nn.Parameter(torch.randn(shape, device=device, generator=gen) * 0.02))
            for name, shape in shapes]


def clone(named):
    return [(name, torch.nn.Parameter(p.detach().clone())) for name, p in named]


def set_grads(sides, gen: torch.Generator) -> None:
    for params in zip(*sides):
        g = torch.randn(params[0][1].shape, device=params[0][1].device, generator=gen) * 1e-3
        for _, p in params:
            p.grad = g.clone()


def differences(a_named, b_named, opt_a, opt_b) -> list[str]:
    out = []
    for (name, pa), (_, pb) in zip(a_named, b_named):
        if not torch.equal(pa, pb):
            out.append(f"{name}: param")
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        if set(sa) != set(sb):
            out.append(f"{name}: state keys {sorted(sa)} vs {sorted(sb)}")
            continue
        out += [f"{name}: state '{k}'" for k in sa
                if torch.is_tensor(sa[k]) and not torch.equal(sa[k], sb[k])]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="module path of the 'before' file, e.g. kernelbench.optim._before_adamw")
    parser.add_argument("after", help="module path of the 'after' file, e.g. kernelbench.optim.adamw")
    parser.add_argument("--cls", required=True, choices=sorted(HYPERPARAMS), help="optimizer class name")
    parser.add_argument("--workload", default="model-370m", choices=sorted(WORKLOADS))
    parser.add_argument("--kwargs", default="{}", help="JSON of extra constructor arguments")
    parser.add_argument("--steps", type=int, default=5, help="steps of the parity check")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    args = parser.parse_args()
    device = require_cuda("before_after")
    classes = {side: getattr(importlib.import_module(path), args.cls)
               for side, path in (("before", args.before), ("after", args.after))}
    hp = {**HYPERPARAMS[args.cls], **json.loads(args.kwargs)}
    label = dict(cls=args.cls, workload=args.workload, kwargs=json.loads(args.kwargs))

    named = make_params(WORKLOADS[args.workload].spec["shapes"], device)
    sides = {side: clone(named) for side in classes}
    opts = {side: cls([p for _, p in sides[side]], **hp) for side, cls in classes.items()}
    gen = torch.Generator(device=device).manual_seed(1)
    for _ in range(args.steps):
        set_grads(list(sides.values()), gen)
        for opt in opts.values():
            opt.step()
    torch.cuda.synchronize()
    diff = differences(sides["before"], sides["after"], opts["before"], opts["after"])
    emit(**label, check="bit-identical params and state", steps=args.steps, equal=not diff, first=diff[:5])

    times = interleaved_ms({side: opt.step for side, opt in opts.items()}, rounds=args.rounds)
    emit(**label, before_ms=times["before"], after_ms=times["after"],
         after_over_before=times["after"] / times["before"],
         gpu=torch.cuda.get_device_name(device), torch=torch.__version__)
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
