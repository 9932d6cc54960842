"""The optimizers under FSDP2 on N local GPUs: parity against the unsharded step, and the optimizer
step of each beside ``torch.optim.AdamW(fused=True)`` on the same sharded model.

    python -m kernelbench.distributed.fsdp_bench --nproc 4 --out fsdp-4.json

Parity: ``fsdp.fsdp_parity_rank`` for every optimizer (``--parity-steps`` steps on ``--parity-model``).
Speed: one sharded model (``--model``), one optimizer per candidate over its parameters, the
gradients set once as DTensors of the parameters' layout; rounds interleave the candidates (the
order rotates every round), each round times ``--steps`` calls of ``step()`` with CUDA events
after a barrier; the figure of a round is the slowest rank's, the row's the median over rounds.
State per rank: device memory an optimizer holds after its first step (allocated after minus
before it was built), on the rank that holds the most. Official adam-mini runs on its own, under
a deadline, since it may not finish under FSDP2; where it stops, every rank's stack is printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from kernelbench.distributed.fsdp import (
    FsdpParityRequest,
    build_model,
    device_for,
    fsdp_parity_rank,
    make_mesh,
    shard_model,
)
from kernelbench.models.llama import CONFIGS, LlamaConfig

# Parity model: a Hugging Face-shaped Llama with grouped-query attention whose key heads (64 rows)
# 4 ranks cut in half, and a vocabulary no rank count divides.
PARITY_CONFIG = LlamaConfig(vocab_size=32003, hidden=512, n_layers=4, n_heads=8, n_kv_heads=2, intermediate=1376,
                            max_seq=512)
MODELS = {"parity-512": PARITY_CONFIG, **CONFIGS}
HYPER = dict(lr=1e-3, weight_decay=0.1)


def torch_adamw_fused(named, config):
    return torch.optim.AdamW([p for _, p in named], fused=True, **HYPER)


def triton_adamw(named, config):
    from kernelbench.optim import TritonAdamW

    return TritonAdamW([p for _, p in named], **HYPER)


def adam_mini(named, config, state_dtype="fp32"):
    from kernelbench.optim import AdamMini

    return AdamMini(named, dim=config.hidden, n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, verbose=False,
                    state_dtype=state_dtype, **HYPER)


def adafactor(named, config, quantize=True):
    from kernelbench.optim import Adafactor8bit

    return Adafactor8bit([p for _, p in named], lr=1e-2, quantize=quantize)


def muon(named, config):
    from kernelbench.optim import Muon
    from kernelbench.optim.muon import muon_param_groups

    return Muon(muon_param_groups(named), lr=0.02, adamw_lr=HYPER["lr"])


def official_adam_mini(named, config):
    from adam_mini import Adam_mini

    return Adam_mini(named, dim=config.hidden, n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, verbose=False,
                     **HYPER)


CANDIDATES = {
    "torch-adamw-fused": torch_adamw_fused,
    "triton-adamw": triton_adamw,
    "adam-mini-fp32": functools.partial(adam_mini, state_dtype="fp32"),
    "adam-mini-bf16": functools.partial(adam_mini, state_dtype="bf16"),
    "adam-mini-fp8": functools.partial(adam_mini, state_dtype="fp8"),
    "adafactor-8bit": functools.partial(adafactor, quantize=True),
    "adafactor-fp32": functools.partial(adafactor, quantize=False),
    "muon": muon,
}


def _bound(name: str, config: LlamaConfig):
    return functools.partial(_build, name, config)


def _build(name: str, config: LlamaConfig, named):
    factory = official_adam_mini if name == "official-adam-mini" else CANDIDATES[name]
    return factory(named, config)


@dataclass(frozen=True)
class StepBenchRequest:
    config: LlamaConfig
    candidates: tuple[str, ...]
    rounds: int = 7
    steps: int = 5
    warmup: int = 3
    seed: int = 0
    deadline_s: float = 0.0  # > 0: print every rank's stack and stop after this long (official adam-mini)


def _local_bytes(optimizer: torch.optim.Optimizer) -> int:
    from kernelbench.optim._sharding import local_tensor

    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                t = local_tensor(value)
                if t.numel() and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


def _slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def step_bench_rank(rank: int, world: int, request: StepBenchRequest) -> list[dict[str, Any]]:
    from torch.distributed.tensor import DTensor

    if request.deadline_s > 0:
        import faulthandler

        faulthandler.dump_traceback_later(request.deadline_s, exit=True)
    device = device_for(rank)
    model = shard_model(build_model(request.config, request.seed, device), make_mesh(device, world))
    gen = torch.Generator(device=device).manual_seed(request.seed + 1)
    for p in model.parameters():
        local = p.to_local()
        g = torch.randn(local.shape, generator=gen, device=device, dtype=local.dtype) * 1e-2
        p.grad = DTensor.from_local(g, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
    optimizers, state_bytes, errors, first_ms = {}, {}, {}, {}
    for name in request.candidates:
        try:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            opt = _build(name, request.config, list(model.named_parameters()))
            t0 = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            first_ms[name] = (time.perf_counter() - t0) * 1e3
            state_bytes[name] = {"allocated": int(_slowest(torch.cuda.memory_allocated() - before, device)),
                                 "tensors": int(_slowest(_local_bytes(opt), device))}
            optimizers[name] = opt
        except Exception as error:  # one failing candidate keeps the others' rows
            errors[name] = f"{type(error).__name__}: {error}"
            print(f"[rank {rank}] {name}: {errors[name]}", file=sys.stderr, flush=True)
    for opt in optimizers.values():
        for _ in range(request.warmup):
            opt.step()
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    names = list(optimizers)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(request.rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for name in order:
            opt = optimizers[name]
            torch.cuda.synchronize()
            dist.barrier()
            start.record()
            for _ in range(request.steps):
                opt.step()
            end.record()
            end.synchronize()
            times[name].append(_slowest(start.elapsed_time(end) / request.steps, device))
    rows = []
    anchor = statistics.median(times["torch-adamw-fused"]) if times.get("torch-adamw-fused") else None
    for name in request.candidates:
        if name in errors:
            rows.append({"candidate": name, "world": world, "status": "error", "message": errors[name]})
            continue
        ms = sorted(times[name])
        median = statistics.median(ms)
        rows.append({"candidate": name, "world": world, "status": "ok", "median_ms": median,
                     "p25_ms": ms[len(ms) // 4], "p75_ms": ms[(3 * len(ms)) // 4], "rounds": len(ms),
                     "steps_per_round": request.steps, "first_step_ms": first_ms[name],
                     "ratio_to_torch_fused": median / anchor if anchor else None,
                     "state_bytes_per_rank": state_bytes[name]["allocated"],
                     "state_tensor_bytes_per_rank": state_bytes[name]["tensors"]})
    return rows


def _summarise_parity(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    worst = max(rows, key=lambda r: r["rel_frob"]) if rows else {}
    params = [r for r in rows if r["tensor"].endswith((".weight", ".bias"))]
    return {"candidate": name, "tensors": len(rows), "bitwise": sum(r["bitwise"] for r in rows),
            "params_bitwise": sum(r["bitwise"] for r in params), "params": len(params),
            "worst_tensor": worst.get("tensor"), "worst_step": worst.get("step"),
            "worst_rel_frob": worst.get("rel_frob"), "worst_max_abs": worst.get("max_abs"),
            "nan_mismatch": sum(r.get("nan_mismatch", 0) for r in rows)}


def parity_all_rank(rank: int, world: int, names: tuple[str, ...], config: LlamaConfig,
                    steps: int) -> dict[str, Any]:
    """Every candidate's sharded-against-unsharded rows (or its error, raised alike on every rank)."""
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = fsdp_parity_rank(rank, world, FsdpParityRequest(_bound(name, config), config, steps=steps))
        except Exception as error:
            results[name] = f"{type(error).__name__}: {error}"[-2000:]
        torch.cuda.empty_cache()
    return results


@dataclass
class Report:
    nproc: int
    device: str = ""
    parity: list[dict[str, Any]] = field(default_factory=list)
    speed: list[dict[str, Any]] = field(default_factory=list)
    official: dict[str, Any] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    from kernelbench.distributed.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default="llama-1b-layer4", choices=sorted(MODELS))
    parser.add_argument("--parity-model", default="parity-512", choices=sorted(MODELS))
    parser.add_argument("--parity-steps", type=int, default=10)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--official-deadline-s", type=float, default=90.0)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: parity, speed, official")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    report = Report(args.nproc, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    names = [n for n in args.candidates.split(",") if n]

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(report.__dict__, f, indent=1)

    if "parity" not in skip:
        config = MODELS[args.parity_model]
        checked = [n for n in names if n != "torch-adamw-fused"]  # the anchor is torch's own optimizer
        t0 = time.time()
        results = run_ranks(parity_all_rank, args.nproc, backend=backend, timeout_s=900,
                            args=(tuple(checked), config, args.parity_steps))[0]
        for name, rows in results.items():
            summary = ({"candidate": name, "error": rows} if isinstance(rows, str)
                       else _summarise_parity(name, rows))
            report.parity.append(summary)
            print(json.dumps(summary), flush=True)
        report.parity.append({"seconds": time.time() - t0})
        save()
    if "speed" not in skip:
        request = StepBenchRequest(MODELS[args.model], tuple(names), rounds=args.rounds, steps=args.steps)
        report.speed = run_ranks(step_bench_rank, args.nproc, backend=backend, timeout_s=600, args=(request,))[0]
        for row in report.speed:
            print(json.dumps(row), flush=True)
        save()
    if "official" not in skip:
        request = StepBenchRequest(MODELS[args.model], ("official-adam-mini",), rounds=2, steps=2, warmup=1,
                                   deadline_s=args.official_deadline_s)
        t0 = time.time()
        try:
            report.official = {"rows": run_ranks(step_bench_rank, args.nproc, backend=backend,
                                                 timeout_s=args.official_deadline_s + 60, args=(request,))[0]}
        except Exception as error:
            report.official = {"error": str(error)[-6000:]}
        report.official["seconds"] = time.time() - t0
        print(json.dumps(report.official)[-3000:], flush=True)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
