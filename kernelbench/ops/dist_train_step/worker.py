"""dist-train-step's worker, on every rank: each candidate's whole training step, round by round.

    python -m torch.distributed.run --standalone --nproc_per_node 4 -m kernelbench.ops.dist_train_step.worker \\
        --workload llama-1b-1x2048 --rounds 3 --warmup-ms 25 --rep-ms 1500 --budget-s 1400 --output out.json

Per round, per candidate (in the op's order): build the model from the workload's seed, wrap it,
(round 1: the loss check), warm up, time the steps, time the comm-free steps where there are any,
free everything. ``--profile-dir DIR``: after the last round's timing, one rep per candidate under
torch.profiler, a Chrome trace per rank (the profiler slows the step; the timings are taken before).
Counts are rank 0's and broadcast, so every rank runs the same steps; rank 0 also
decides, before each candidate's round, whether the budget leaves time for it. A candidate that
raises on every rank is recorded as an error and left out of later rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernelbench.distributed.worker import RankTimer, environment, init_ranks
from kernelbench.ops.dist_train_step import CHECK_STEPS, LR, MAX_GRAD_NORM, OP, WORKER

HYPERPARAMS = {"lr": LR, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
WARMUP_MIN_STEPS = 2  # the first step allocates grads and state; the second runs as every later one
# A timed rep is this many steps back to back, as training runs them: work a step leaves in flight
# for the next one (parameter all-gathers under the next forward) overlaps there as it would, and
# only the last step's leftover is waited for inside the rep. Times are per step (rep / STEPS_PER_REP).
STEPS_PER_REP = 4


@dataclass
class Setup:
    """What a candidate's factory needs: the model's config, this rank's device and the world."""

    config: Any
    seed: int
    device: torch.device
    world: int
    backend: str
    bucket_bytes: int | None = None  # --bucket-mb: every ShardedAdamW candidate's buckets

    def model(self) -> torch.nn.Module:
        from kernelbench.distributed.fsdp import build_model

        return build_model(self.config, self.seed, self.device)


@dataclass
class TrainStep:
    """One candidate's step. ``wrapped(tokens)`` -> logits; ``step_optimizer`` None: the update runs
    inside backward; ``no_sync`` / ``update_only``: the same step with gradient communication off."""

    wrapped: Callable[[torch.Tensor], torch.Tensor]
    model: torch.nn.Module
    optimizer: Any
    what: str
    clipping: str  # "torch" (clip_grad_norm_ on the step's grads), "optimizer", or "none: why"
    step_optimizer: Callable[[], Any] | None
    no_sync: Callable[[], Any] | None = None
    update_only: Callable[[], Any] | None = None
    comm_free_how: str = ""
    comm_free_reason: str = ""
    warmup_iterations: int = 0  # iterations the wrapper needs before its step updates anything
    params: list[torch.Tensor] = field(default_factory=list)
    finish: Callable[[], Any] | None = None  # waits for what a step leaves in flight (prefetched gathers)

    @property
    def has_comm_free(self) -> bool:
        """Whether the same step can run with its gradient communication switched off."""
        return self.no_sync is not None and self.update_only is not None

    def run(self, tokens: torch.Tensor, targets: torch.Tensor, *, communicate: bool = True,
            marks: list[list[Any]] | None = None) -> torch.Tensor:
        """One step; ``marks`` (CUDA) gets the step's events: start, forward and loss done, backward
        done, end, as the compute stream reaches them."""
        events = _events(tokens.device, marks)
        quiet = contextlib.nullcontext() if communicate or self.no_sync is None else self.no_sync()
        with quiet:
            _mark(events)
            with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
                logits = self.wrapped(tokens)
            loss = self.model.layer_set.loss(logits, targets)
            _mark(events)
            loss.backward()
            _mark(events)
        if self.clipping == "torch":
            torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
        update = self.step_optimizer if communicate else self.update_only
        if update is not None:
            update()
        self.optimizer.zero_grad()
        _mark(events)
        return loss.detach()

    def run_rep(self, tokens: torch.Tensor, targets: torch.Tensor, *, communicate: bool = True,
                marks: list[list[Any]] | None = None) -> None:
        """STEPS_PER_REP steps back to back, then whatever the last one left in flight."""
        for _ in range(STEPS_PER_REP):
            self.run(tokens, targets, communicate=communicate, marks=marks)
        if self.finish is not None:
            self.finish()

    def state_bytes(self) -> int:
        if hasattr(self.optimizer, "state_bytes"):
            return int(self.optimizer.state_bytes())
        inner = getattr(self.optimizer, "optim", self.optimizer)  # ZeroRedundancyOptimizer's local one
        total = 0
        for state in inner.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor):
                    local = t.to_local() if hasattr(t, "to_local") else t
                    total += local.numel() * local.element_size()
        return total


STEP_PHASES = ("forward", "backward", "optimizer")  # the spans between a step's four marks


def _events(device: torch.device, marks: list[list[Any]] | None) -> list[Any] | None:
    if marks is None or device.type != "cuda":
        return None
    marks.append([])
    return marks[-1]


def _mark(events: list[Any] | None) -> None:
    if events is not None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append((event, time.perf_counter()))


def step_phase_ms(marks: list[list[Any]]) -> dict[str, float]:
    """Median ms per phase over the marked steps: the compute stream's (waits on communication land
    in the phase that waits; work a step leaves in flight, in the next step's forward), and the
    host's (``host_<phase>``: a GPU phase no longer than its host phase ran dry behind the host)."""
    if not marks:
        return {}
    torch.cuda.synchronize()
    gpu = [[a.elapsed_time(b) for (a, _), (b, _) in zip(events, events[1:])] for events in marks]
    host = [[(tb - ta) * 1e3 for (_, ta), (_, tb) in zip(events, events[1:])] for events in marks]
    out = {phase: round(statistics.median(step[i] for step in gpu), 3) for i, phase in enumerate(STEP_PHASES)}
    out.update({f"host_{phase}": round(statistics.median(step[i] for step in host), 3)
                for i, phase in enumerate(STEP_PHASES)})
    return out


def _fused() -> dict[str, Any]:
    return {"fused": True}


def ddp_step(setup: Setup, *, bf16_comm: bool = False) -> TrainStep | str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    if bf16_comm and setup.backend != "nccl":
        return "skipped: DDP's bf16 compression hook all-reduces bf16 buckets, which runs on NCCL only"
    model = setup.model()
    ids = [setup.device.index] if setup.device.type == "cuda" else None
    ddp = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
    what = "DDP all-reduce in backward, torch fused AdamW on every parameter"
    if bf16_comm:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(None, bf16_compress_hook)
        what += ", gradients all-reduced in bf16 (bf16_compress_hook)"
    opt = torch.optim.AdamW(model.parameters(), **HYPERPARAMS, **_fused())
    return TrainStep(ddp, model, opt, what, "torch",
                     opt.step, no_sync=ddp.no_sync, update_only=opt.step, comm_free_how="DDP no_sync",
                     params=list(model.parameters()))


def fsdp_step(setup: Setup, *, reshard_after_forward: bool, optimizer: str, bf16_params: bool = False) -> TrainStep:
    from kernelbench.distributed.fsdp import make_mesh, shard_model

    model = shard_model(setup.model(), make_mesh(setup.device, setup.world), reshard_after_forward, bf16_params)
    params = list(model.parameters())
    if optimizer == "triton":
        from kernelbench.optim import TritonAdamW

        opt = TritonAdamW(params, **HYPERPARAMS)
    else:
        opt = torch.optim.AdamW(params, **HYPERPARAMS, **_fused())
    policy = ", bf16 parameters, fp32 reduction" if bf16_params else ", fp32 parameters"
    what = (f"FSDP2 (reshard_after_forward={reshard_after_forward}{policy}) all-gather / reduce-scatter, "
            f"{'TritonAdamW' if optimizer == 'triton' else 'torch fused AdamW'} on the local shards")
    return TrainStep(model, model, opt, what, "torch", opt.step, params=params,
                     comm_free_reason="not measured: FSDP2's all-gathers are part of its forward and backward")


def zero_overlap_step(setup: Setup) -> TrainStep | str:
    if setup.backend != "nccl":
        return "skipped: torch's hook_with_zero_step runs on NCCL only (Gloo may hang)"
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = setup.model()
    ddp = DDP(model, device_ids=[setup.device.index])
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, overlap_with_ddp=True,
                                   **HYPERPARAMS, foreach=True)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    return TrainStep(ddp, model, zero, "DDP all-reduce with ZeroRedundancyOptimizer's foreach AdamW stepped in the "
                     "comm hook (overlap_with_ddp)", "none: the update runs inside backward, before a norm exists",
                     None, comm_free_reason="not measured: the update runs in DDP's comm hook",
                     warmup_iterations=2, params=list(model.parameters()))


def sharded_step(setup: Setup, *, overlap: bool, prefetch: bool = False, gather_group: bool = False,
                 bf16_comm: bool = False, bf16_params: bool = False) -> TrainStep | str:
    from kernelbench.optim.sharded_adamw import ShardedAdamW

    accepted = inspect.signature(ShardedAdamW).parameters
    if overlap and "overlap_grad_reduce" not in accepted:
        return "skipped: the installed ShardedAdamW has no overlap_grad_reduce argument"
    if prefetch and "prefetch_params" not in accepted:
        return "skipped: the installed ShardedAdamW has no prefetch_params argument"
    if bf16_params and "param_comm_dtype" not in accepted:
        return "skipped: the installed ShardedAdamW has no param_comm_dtype argument"
    model = setup.model()
    params: list[Any] = list(model.named_parameters())
    if bf16_params:
        # In the model's order: the embedding (read in fp32, tied to the head) gathered in fp32, the
        # layers in bf16, which their linears read through autocast's cast anyway.
        embedding = "model.embed_tokens.weight"
        params = [{"params": [(n, p) for n, p in params if n == embedding]},
                  {"params": [(n, p) for n, p in params if n != embedding], "param_comm_dtype": torch.bfloat16}]
    kwargs: dict[str, Any] = {}
    if overlap:
        # ZeRO-2: the backward holds a few buckets of full gradient, not the model's.
        kwargs = {"overlap_grad_reduce": True, "grad_comm_dtype": None}
        if "free_grads" in accepted:
            kwargs["free_grads"] = True
    if setup.bucket_bytes is not None:
        kwargs["bucket_bytes"] = setup.bucket_bytes
    if prefetch:
        kwargs.update(prefetch_params=True, module=model)
    if gather_group:  # the all-gathers on a communicator of their own, beside the reduce-scatters
        kwargs["gather_group"] = dist.new_group(list(range(setup.world)))
    if bf16_comm:
        kwargs["grad_comm_dtype"] = torch.bfloat16
    clipping = "torch"
    if "max_grad_norm" in accepted:
        kwargs["max_grad_norm"], clipping = MAX_GRAD_NORM, "optimizer"
    opt = ShardedAdamW(params, **HYPERPARAMS, **kwargs)
    no_sync = getattr(opt, "no_sync", None) if overlap else contextlib.nullcontext
    what = "ShardedAdamW after backward: reduce-scatter, Triton update, all-gather, pipelined"
    if overlap:
        what = "ShardedAdamW, reduce-scatters issued during backward"
    if kwargs.get("free_grads"):
        what += ", full gradient buckets released once reduced (ZeRO-2)"
    if prefetch:
        what += ", parameter all-gathers left to overlap the next forward (prefetch_params)"
    if gather_group:
        what += ", all-gathers on a second communicator (gather_group)"
    if bf16_comm:
        what += ", gradients reduce-scattered in bf16 (grad_comm_dtype)"
    if bf16_params:
        what += ", the layers' parameters all-gathered in bf16 (param_comm_dtype), the embedding in fp32"
    what += f", {opt.bucket_bytes / 2**20:g} MiB buckets"
    if clipping == "torch":
        clipping = "torch (clip_grad_norm_ on ShardedAdamW's gradient views before step(): this rank's grads)"
    return TrainStep(model, model, opt, what, clipping, opt.step, no_sync=no_sync, update_only=opt.update_only,
                     comm_free_how="ShardedAdamW no_sync + update_only" if overlap else "ShardedAdamW update_only",
                     params=list(model.parameters()), finish=opt.wait_params if prefetch else None)


# ------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER}", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="one of " + ", ".join(sorted(OP.workloads)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-ms", type=float, default=None, help="warm-up time per candidate and round")
    parser.add_argument("--rep-ms", type=float, default=None, help="timed time per candidate over all rounds")
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--max-reps", type=int, default=1000)
    parser.add_argument("--warmup-steps", type=int, default=None, help="fixed warm-up steps (instead of --warmup-ms)")
    parser.add_argument("--reps", type=int, default=None, help="fixed timed steps per round (instead of --rep-ms)")
    parser.add_argument("--budget-s", type=float, default=1e9, help="no candidate's round starts past this")
    parser.add_argument("--bucket-mb", type=float, default=None, help="every ShardedAdamW candidate's bucket size")
    parser.add_argument("--candidates", default=None, help="comma-separated subset, in the op's order")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="process group timeout")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="after the last round's timing, one rep per candidate under torch.profiler: "
                             "a Chrome trace per rank here")
    args = parser.parse_args(argv)
    if args.workload not in OP.workloads:
        parser.error(f"unknown workload {args.workload}")
    if args.rounds < 1 or args.budget_s <= 0 or (args.bucket_mb is not None and args.bucket_mb <= 0):
        parser.error("--rounds must be >= 1, --budget-s > 0 and --bucket-mb > 0")
    return args


def step_counts(args: argparse.Namespace, est_ms: float | None, warmup_iterations: int,
                steps_per_rep: int = 1) -> tuple[int, int]:
    """(warm-up steps, timed reps) per round: fixed ones as given, else from the time budgets and a
    step's estimated ``est_ms`` (a rep is ``steps_per_rep`` steps); the wrapper's own warm-up
    iterations come first either way."""
    if args.warmup_steps is not None and args.reps is not None:
        return warmup_iterations + args.warmup_steps, args.reps
    est_ms = max(est_ms or 0.0, 1e-3)
    warm = math.ceil((args.warmup_ms or 0) / est_ms)
    per_round = math.ceil((args.rep_ms or 0) / (est_ms * steps_per_rep) / args.rounds)
    reps = min(max(per_round, math.ceil(args.min_reps / args.rounds)), max(1, args.max_reps // args.rounds))
    return warmup_iterations + max(WARMUP_MIN_STEPS, warm), max(1, reps)


def _tokens(workload, device: torch.device, rank: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(workload.seed * 7919 + 131 * rank + salt)
    spec, vocab = workload.spec, workload.spec["config"]["vocab_size"]
    tokens = torch.randint(0, vocab, (spec["batch"], spec["seq"] + 1), generator=gen).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decide(rank: int, value: Any) -> Any:
    """Rank 0's value on every rank (counts and go / stop decisions must agree)."""
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _profile(trainer: TrainStep, tokens: torch.Tensor, targets: torch.Tensor, stem: Path) -> None:
    """One rep, and one comm-free rep where there is one, under torch.profiler: a Chrome trace each
    (``<stem>-step.json.gz``, ``<stem>-comm_free.json.gz``) to see which stream waits for which."""
    from torch.profiler import ProfilerActivity, profile

    stem.parent.mkdir(parents=True, exist_ok=True)
    modes = [("step", True)] + ([("comm_free", False)] if trainer.has_comm_free else [])
    for label, communicate in modes:
        _sync(tokens.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            trainer.run_rep(tokens, targets, communicate=communicate)
            _sync(tokens.device)
        prof.export_chrome_trace(f"{stem}-{label}.json.gz")


def run_candidate_round(name: str, setup: Setup, args, workload, rank: int, est: dict[str, float],
                        first_round: bool, last_round: bool = False) -> dict[str, Any]:
    """One round of one candidate on this rank: its times, memory and (first round) losses."""
    device = setup.device
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    phases: dict[str, float] = {}  # seconds per phase of this round: where a slow round spends its time
    mark = time.monotonic()

    def lap(phase: str) -> None:
        nonlocal mark
        _sync(device)
        now = time.monotonic()
        phases[phase] = round(now - mark, 3)
        mark = now

    trainer = OP.get_candidate(name).build(setup)
    if isinstance(trainer, str):
        return {"skipped": trainer}
    lap("build")
    out: dict[str, Any] = {"what": trainer.what, "clipping": trainer.clipping,
                           "comm_free_how": trainer.comm_free_how, "comm_free_reason": trainer.comm_free_reason}
    if first_round:
        tokens, targets = _tokens(workload, device, rank, salt=1)
        for _ in range(trainer.warmup_iterations):  # no update happens in these (torch's ZeRO overlap)
            trainer.run(tokens, targets)
        out["losses"] = [float(trainer.run(tokens, targets)) for _ in range(CHECK_STEPS)]
        lap("loss_check")
    tokens, targets = _tokens(workload, device, rank, salt=2)
    fixed = args.warmup_steps is not None and args.reps is not None
    done = 0
    if name not in est and not fixed:  # the first round: a few steps, then one timed to size the rest
        for _ in range(trainer.warmup_iterations + WARMUP_MIN_STEPS):
            trainer.run(tokens, targets)
        _sync(device)
        t0 = time.perf_counter()
        trainer.run(tokens, targets)
        _sync(device)
        est[name] = _decide(rank, (time.perf_counter() - t0) * 1e3)
        done = trainer.warmup_iterations + WARMUP_MIN_STEPS + 1
    warm, reps = step_counts(args, est.get(name), trainer.warmup_iterations, STEPS_PER_REP)
    for _ in range(max(0, warm - done)):
        trainer.run(tokens, targets)
    if trainer.finish is not None:
        trainer.finish()
    lap("warmup")
    timer = RankTimer(device, ["step", "comm_free"])
    marks: dict[str, list[list[Any]]] = {"step": [], "comm_free": []}
    step = functools.partial(trainer.run_rep, tokens, targets, marks=marks["step"])
    for _ in range(reps):
        timer.rep("step", step, record=True)
    if trainer.has_comm_free:
        quiet_step = functools.partial(trainer.run_rep, tokens, targets, communicate=False)
        for _ in range(min(warm, 1)):
            timer.rep("comm_free", quiet_step, record=False)
        quiet_step = functools.partial(quiet_step, marks=marks["comm_free"])
        for _ in range(reps):
            timer.rep("comm_free", quiet_step, record=True)
    lap("timed")
    out["phase_ms"] = {metric: step_phase_ms(steps) for metric, steps in marks.items() if steps}
    if args.profile_dir is not None and last_round:
        _profile(trainer, tokens, targets, args.profile_dir / f"{name}-rank{rank}")
        lap("profile")
    times = {metric: [t / STEPS_PER_REP for t in reps_ms] for metric, reps_ms in timer.results_ms().items()}
    timing = f"{timer.describe()}; a rep is {STEPS_PER_REP} steps back to back, its time divided by {STEPS_PER_REP}"
    out.update(phase_s=phases, step_ms=times["step"], comm_free_ms=times["comm_free"], timing=timing,
               state_bytes=trainer.state_bytes())
    out["peak_bytes"] = None if before is None else torch.cuda.max_memory_allocated(device) - before
    del trainer, timer, step
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    start = time.monotonic()
    device, backend, rank, world = init_ranks(args.timeout_s)
    from kernelbench.models import LlamaConfig

    workload = OP.workloads[args.workload]
    bucket_bytes = None if args.bucket_mb is None else int(args.bucket_mb * 2**20)
    setup = Setup(LlamaConfig(**workload.spec["config"]), workload.seed, device, world, backend, bucket_bytes)
    names = list(OP.candidates) if args.candidates is None else args.candidates.split(",")
    spec = workload.spec
    result: dict[str, Any] = {
        "op": OP.name, "workload": workload.name, "world_size": world, "backend": backend,
        "tokens_per_rank": spec["batch"] * spec["seq"], "config": spec["config"], "hyperparams": HYPERPARAMS,
        "rounds": args.rounds, "complete": False, "timing": "",
        "candidates": {n: {"status": "pending", "reason": "not reached before the run ended"} for n in names},
        "environment": environment(device, backend),
        "command": " ".join([Path(sys.executable).name, "-m", WORKER, *sys.argv[1:]]),
    }
    est: dict[str, float] = {}
    round_s: dict[str, float] = {}
    failed: set[str] = set()
    for r in range(args.rounds):
        for name in names:
            if name in failed:
                continue
            elapsed = time.monotonic() - start
            go = _decide(rank, elapsed + round_s.get(name, 0.0) < args.budget_s)
            if not go:
                entry = result["candidates"][name]
                if entry["status"] == "pending":
                    entry.update(status="skipped", reason=f"time budget ({args.budget_s:.0f} s) spent before it ran")
                continue
            if rank == 0:  # what the launcher watches: a round that never ends is a hung candidate
                result["running"] = {"candidate": name, "round": r + 1, "since_unix": time.time()}
                _write(args.output, result)
            t0 = time.monotonic()
            try:
                mine: dict[str, Any] = run_candidate_round(name, setup, args, workload, rank, est, r == 0,
                                                           r == args.rounds - 1)
            except Exception as exc:  # every rank raising (OOM, a missing API) leaves the others in step
                mine = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
                # in the ranks' log at once: where only some ranks raise, the gather below never returns
                print(f"[rank {rank}] {name}, round {r + 1}: {mine['error']}", file=sys.stderr, flush=True)
            _free(device)
            round_s[name] = time.monotonic() - t0
            mine["round_s"] = [round(t0 - start, 3), round(round_s[name], 3)]  # (started at, took), rank's clock
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, mine)
            if rank == 0:
                result.pop("running", None)
                _merge(result["candidates"][name], gathered, r)
                result["timing"] = next((g["timing"] for g in gathered if "timing" in g), result["timing"])
                _write(args.output, result)
            if any("error" in g or "skipped" in g for g in gathered):
                failed.add(name)
    if rank == 0:
        result["complete"] = True
        _write(args.output, result)
    dist.barrier()
    dist.destroy_process_group()
    return result if rank == 0 else None


def _merge(entry: dict[str, Any], gathered: list[dict[str, Any]], round_index: int) -> None:
    """One round's per-rank results into the candidate's entry (times appended, peaks maxed)."""
    errors = [f"rank {i}: {g['error']}" for i, g in enumerate(gathered) if "error" in g]
    skipped = [g["skipped"] for g in gathered if "skipped" in g]
    if errors:
        entry.update(status="error", reason="; ".join(errors)[:2000])
        return
    if skipped:
        entry.update(status="skipped", reason=skipped[0])
        return
    if entry["status"] != "ok":
        entry.clear()
        entry.update(status="ok", step_ms=[[] for _ in gathered], comm_free_ms=[[] for _ in gathered],
                     peak_bytes=[None] * len(gathered), rounds_done=0)
        for key in ("what", "clipping", "comm_free_how", "comm_free_reason"):
            entry[key] = gathered[0][key]
    for i, g in enumerate(gathered):
        entry["step_ms"][i] += g["step_ms"]
        entry["comm_free_ms"][i] += g["comm_free_ms"]
        if g["peak_bytes"] is not None:
            entry["peak_bytes"][i] = max(entry["peak_bytes"][i] or 0, g["peak_bytes"])
    entry["state_bytes"] = [g["state_bytes"] for g in gathered]
    entry.setdefault("phase_s", []).append(gathered[0].get("phase_s", {}))  # the round's parts: rank 0's
    entry.setdefault("phase_ms", []).append([g.get("phase_ms", {}) for g in gathered])  # a step's: per rank
    entry.setdefault("round_s", []).append([g.get("round_s") for g in gathered])  # per round, per rank
    if "losses" in gathered[0]:
        entry["losses"] = [g["losses"] for g in gathered]
    entry["rounds_done"] = round_index + 1


if __name__ == "__main__":
    main()
