"""The ranks of ``kernelbench parity OP --fsdp`` and ``kernelbench train OP --fsdp``.

Started by torch's launcher, one process per GPU (or CPU ranks on Gloo with the Triton
interpreter), through :mod:`kernelbench.distributed.launch`:

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m kernelbench.train.fsdp_worker \\
        parity --op adam-mini --model llama-tiny --steps 3 --candidates triton-fp32 --output parity.json

``parity``: every named candidate of an optimizer op (built as ``train`` builds it, with the model's
shape) under ``fully_shard`` against itself on the unsharded model, from the same weights and
gradients (:func:`kernelbench.distributed.fsdp.run_pair`); every parameter and state tensor is
gathered after each step and compared with the op's tolerances by the harness's parity tracker,
giving the rows ``kernelbench parity`` writes. ``train``: the training runs of ``kernelbench train``
(:func:`kernelbench.train.loop.train_run`) with the model sharded over the ranks, each rank taking
its share of every batch; the logs come back to the parent, which judges them as for one device.
Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernelbench.distributed.fsdp import FsdpParityRequest, named_tensors, run_pair
from kernelbench.distributed.worker import init_ranks
from kernelbench.harness.runner import CandidateTracker, parity_rows
from kernelbench.models import CONFIGS
from kernelbench.ops import get_op
from kernelbench.ops.base import Workload

MODULE = __name__
REFERENCE_NAME = "itself unsharded"


def mode_name(world: int) -> str:
    return f"fsdp, {world} ranks"


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("verb", choices=("parity", "train"))
    parser.add_argument("--op", required=True)
    parser.add_argument("--model", required=True, choices=sorted(CONFIGS))
    parser.add_argument("--candidates", required=True, help="comma-separated candidate names")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detail", default="worst")
    parser.add_argument("--atol", type=float, default=None)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--settings", default="{}", help="train: TrainSettings as JSON")
    parser.add_argument("--runs", default="", help="train: candidate:order_seed,... to run")
    parser.add_argument("--unsharded", action="store_true", help="train: the model whole on one rank")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--output", required=True)
    return parser.parse_args(argv)


def parity(args: argparse.Namespace, rank: int, world: int) -> list[dict[str, Any]]:
    from kernelbench.ops.base import Tolerance
    from kernelbench.train.candidates import resolve

    op = get_op(args.op)
    config = CONFIGS[args.model]
    names = args.candidates.split(",")
    built = {c.name: c for c in resolve(args.op, config, names=names)}
    workload = Workload(args.model, "cpu" if config.hidden <= 256 else "gpu", {})
    override = (Tolerance(args.atol if args.atol is not None else 0.0, args.rtol if args.rtol is not None else 0.0)
                if args.atol is not None or args.rtol is not None else None)
    rows: list[dict[str, Any]] = []
    for name in names:
        tracker = CandidateTracker(op, op.candidates[name], override)

        def observe(step, plain, sharded, plain_opt, sharded_opt, tracker=tracker) -> None:
            reference = named_tensors(plain, plain_opt)
            tracker.update(step, reference, named_tensors(sharded, sharded_opt, like=reference))

        request = FsdpParityRequest(built[name].make_optimizer, config, steps=args.steps, seed=args.seed)
        try:
            run_pair(rank, world, request, observe)
        except Exception as exc:  # raised alike on every rank: its own error row, the others still run
            rows.append({"candidate": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows += [{"candidate": name, "row": r.as_dict()} for r in
                 parity_rows(op, workload, mode_name(world), name, REFERENCE_NAME, tracker, args.steps, args.detail)]
    return rows


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> list[dict[str, Any]]:
    from kernelbench.train.candidates import resolve
    from kernelbench.train.data import make_stream
    from kernelbench.train.loop import initial_state, train_run
    from kernelbench.train.run import TrainSettings

    settings = TrainSettings(**json.loads(args.settings))
    config = settings.validate()
    built = {c.name: c for c in resolve(args.op, config, lr=settings.lr, names=args.candidates.split(","))}
    stream = make_stream(settings.data, config.vocab_size, n_sequences=settings.steps * settings.batch,
                         seq=settings.seq, seed=settings.seed, successors=settings.successors, device=device.type)
    init = initial_state(config, settings.seed, device.type)
    logs = []
    for item in filter(None, args.runs.split(",")):
        name, order_seed = item.rsplit(":", 1)
        try:
            log = train_run(built[name], config, init, stream, steps=settings.steps, batch=settings.batch,
                            device=device.type, clip=settings.clip, order_seed=int(order_seed),
                            shard_over=None if args.unsharded else world)
        except Exception as exc:
            logs.append({"candidate": name, "order_seed": int(order_seed), "error": f"{type(exc).__name__}: {exc}"})
            continue
        logs.append({"candidate": name, "order_seed": int(order_seed), "log": _log_json(log)})
    return logs


def _log_json(log) -> dict[str, Any]:
    out = asdict(log)
    for key in ("losses", "grad_norms", "step_ms"):
        if out[key] is not None:
            out[key] = [None if v != v else float(v) for v in out[key]]  # NaN as null: strict JSON
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    device, _, rank, world = init_ranks(args.timeout_s)
    try:
        result = parity(args, rank, world) if args.verb == "parity" else train(args, rank, world, device)
        dist.barrier()
        if rank == 0:
            Path(args.output).write_text(json.dumps({"world": world, "results": result}))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
