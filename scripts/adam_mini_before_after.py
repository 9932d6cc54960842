"""Step time of two AdamMini classes, imported from two module names, interleaved in one process.

Each class gets its own copy of the same parameters and gradients (the workload's seed); rounds
alternate A B A B ..., each round timing ``step()`` with the harness's ``time_cuda`` (CUDA events,
L2 flushed, median of per-rep times). Before timing, both are checked from the same start: the
max relative difference of the parameters after one step, and whether parameters and every
state tensor are bit-identical after ``--check-steps`` steps on the same fresh gradients. One
JSON line per state dtype. On the CPU (``--device cpu``, the Triton interpreter) the check is
real but the times mean nothing.

    # on the GPU machine, with the old module placed beside the new one:
    git show 5985a35:kernelbench/optim/adam_mini.py > kernelbench/optim/_adam_mini_before.py
    python scripts/adam_mini_before_after.py --before kernelbench.optim._adam_mini_before \\
        --after kernelbench.optim.adam_mini --workload llama-468m --out $OUT/adam-mini-before-after.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelbench.harness.timing import TimingConfig, time_cpu, time_cuda
from kernelbench.ops import optim_workloads

WORKLOADS = {"llama-468m": optim_workloads.LLAMA_468M, "llama-tiny": optim_workloads.LLAMA_TINY}
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def build(cls, workload, device: str, state_dtype: str):
    gen = torch.Generator(device=device).manual_seed(workload.seed)
    params = [(n, torch.nn.Parameter(torch.randn(s, generator=gen, device=device) * 0.02))
              for n, s in workload.spec["shapes"]]
    for _, p in params:
        p.grad = torch.randn(p.shape, generator=gen, device=device)
    kwargs = dict(HP, **workload.spec["hyperparams"], state_dtype=state_dtype)
    if "verbose" in inspect.signature(cls).parameters:
        kwargs["verbose"] = False
    return params, cls(params, **kwargs)


def first_step_difference(cls_a, cls_b, workload, device: str, state_dtype: str) -> float:
    (pa, oa), (pb, ob) = build(cls_a, workload, device, state_dtype), build(cls_b, workload, device, state_dtype)
    oa.step()
    ob.step()
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for (_, a), (_, b) in zip(pa, pb))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that fp8 and NaNs compare bit for bit."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def identical_after_steps(cls_a, cls_b, workload, device: str, state_dtype: str, steps: int) -> dict[str, bool]:
    """Both from the same start, ``steps`` steps on the same fresh gradients: are the parameters
    and every state tensor (same keys, dtypes, shapes, bytes) identical?"""
    (pa, oa), (pb, ob) = build(cls_a, workload, device, state_dtype), build(cls_b, workload, device, state_dtype)
    gen = torch.Generator(device=device).manual_seed(workload.seed + 1)
    for _ in range(steps):
        for (_, a), (_, b) in zip(pa, pb):
            g = torch.randn(a.shape, generator=gen, device=device)
            a.grad.copy_(g)  # in place, as a training loop does: the cached launch plans are reused
            b.grad.copy_(g)
        oa.step()
        ob.step()
    params_identical = all(torch.equal(_bits(a), _bits(b)) for (_, a), (_, b) in zip(pa, pb))
    state_identical = True
    for (_, a), (_, b) in zip(pa, pb):
        sa, sb = oa.state[a], ob.state[b]
        if sa.keys() != sb.keys():
            state_identical = False
            continue
        for key, va in sa.items():
            vb = sb[key]
            if isinstance(va, torch.Tensor):
                same = (va.dtype == vb.dtype and va.shape == vb.shape and torch.equal(_bits(va), _bits(vb)))
            else:
                same = va == vb
            state_identical &= bool(same)
    return {"params_identical": params_identical, "state_identical": state_identical}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="module holding the AdamMini class to compare against")
    parser.add_argument("--after", default="kernelbench.optim.adam_mini")
    parser.add_argument("--workload", default="llama-468m", choices=sorted(WORKLOADS))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--state", default="fp32,bf16,fp8", help="comma-separated state dtypes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check-steps", type=int, default=3, help="steps before the bit-identity check")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    classes = {"before": importlib.import_module(args.before).AdamMini,
               "after": importlib.import_module(args.after).AdamMini}
    workload = WORKLOADS[args.workload]
    config = TimingConfig() if args.device == "cuda" else TimingConfig(warmup_ms=1.0, rep_ms=1.0, min_reps=2)
    timer = time_cuda if args.device == "cuda" else time_cpu
    lines = []
    for state_dtype in args.state.split(","):
        diff = first_step_difference(classes["before"], classes["after"], workload, args.device, state_dtype)
        identical = identical_after_steps(classes["before"], classes["after"], workload, args.device, state_dtype,
                                          args.check_steps)
        built = {}
        for label, cls in classes.items():
            built[label] = build(cls, workload, args.device, state_dtype)
        medians: dict[str, list[float]] = {label: [] for label in classes}
        for _ in range(args.rounds):
            for label, (_, opt) in built.items():
                sample = timer(opt.step, config=config)
                medians[label].append(statistics.median(sample.times))
        line = dict(workload=workload.name, device=args.device, state=state_dtype, rounds=args.rounds,
                    before_ms=statistics.median(medians["before"]), after_ms=statistics.median(medians["after"]),
                    before_rounds_ms=medians["before"], after_rounds_ms=medians["after"],
                    first_step_max_rel_diff=diff,
                    check_steps=args.check_steps, **identical,
                    gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)
        line["after_over_before"] = line["after_ms"] / line["before_ms"]
        lines.append(line)
        print(json.dumps(line), flush=True)
        del built
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
