"""One training run: a Llama-style model, one optimizer, one data order, losses kept on the device.

Per step: the batch is gathered from the stream on the device, the loss computed under bf16
autocast (CUDA), gradients clipped to ``clip`` (their total norm logged), one optimizer step.
Losses and norms are written into device tensors and copied to the host once at the end; the
only mid-run synchronisation is a finiteness check every ``check_every`` steps, so that a
diverged run stops early. Step times come from CUDA events (read after the run), or
``perf_counter`` on the CPU.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models import Llama, LlamaConfig
from ..ops.base import Requires
from .data import MarkovStream

OptimizerFactory = Callable[..., torch.optim.Optimizer]

ROLE_REFERENCE, ROLE_CANDIDATE, ROLE_ANCHOR = "reference", "candidate", "anchor"


@dataclass(frozen=True)
class TrainCandidate:
    """What one run trains: the model's layer set (with ``layer_fns`` replacing single layers) and
    the optimizer ``build(named_params, **hyperparams)``.

    role: ``reference`` (its seeds make the band), ``candidate`` (judged against the band) or
    ``anchor`` (another algorithm trained for comparison, e.g. AdamW beside Adam-mini: not judged).
    """

    name: str
    build: OptimizerFactory
    hyperparams: Mapping[str, Any]
    layers: str = "torch"
    impl: str = "auto"
    requires: Requires = field(default_factory=Requires)
    role: str = ROLE_CANDIDATE
    order_seed: int = 0
    doc: str = ""
    # Single layers replaced in the layer set, by slot (see kernelbench.models.llama.LAYER_SLOTS):
    # factories called once per run, each returning the layer's function.
    layer_fns: Mapping[str, Callable[[], Callable]] = field(default_factory=dict)
    source: str = "kernelbench"

    def make_optimizer(self, named_params: list) -> torch.optim.Optimizer:
        return self.build(named_params, **self.hyperparams)


@dataclass
class RunLog:
    candidate: str
    order_seed: int
    losses: np.ndarray  # (steps,), NaN after an early stop
    grad_norms: np.ndarray
    step_ms: np.ndarray | None  # None when the time means nothing (Triton interpreter)
    state_bytes: int
    wall_s: float
    tokens_per_step: int

    @property
    def median_step_ms(self) -> float | None:
        if self.step_ms is None:
            return None
        # The first steps compile kernels and warm allocators: the median ignores them.
        valid = self.step_ms[np.isfinite(self.step_ms)]
        return float(np.median(valid[min(len(valid) - 1, 2):])) if len(valid) else None

    @property
    def tokens_per_s(self) -> float | None:
        ms = self.median_step_ms
        return self.tokens_per_step / (ms * 1e-3) if ms else None


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer holds in ``state``, each storage counted once, including
    optimizers it owns (Muon's AdamW for embeddings): views into one buffer are not double-counted;
    plus what it keeps between steps outside ``state`` when it says so (``workspace_bytes()``)."""
    seen: set[tuple[int, str]] = set()
    total = 0
    pending, visited = [optimizer], set()
    while pending:
        opt = pending.pop()
        if id(opt) in visited:
            continue
        visited.add(id(opt))
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value = value.to_local() if hasattr(value, "to_local") else value  # this rank's share
                    storage = value.untyped_storage()
                    key = (storage.data_ptr(), str(value.device))
                    if key not in seen:
                        seen.add(key)
                        total += storage.nbytes()
        pending += [v for v in vars(opt).values() if isinstance(v, torch.optim.Optimizer)]
    workspace = getattr(optimizer, "workspace_bytes", None)  # Muon's Newton-Schulz graph buffers
    return total + (workspace() if callable(workspace) else 0)


def initial_state(config: LlamaConfig, seed: int, device: str) -> dict[str, torch.Tensor]:
    """The weights every run starts from (built once, loaded into each run's model)."""
    with torch.device(device):
        model = Llama(config)
    model.reset_parameters(seed=seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_run(candidate: TrainCandidate, config: LlamaConfig, init: Mapping[str, torch.Tensor],
              stream: MarkovStream, *, steps: int, batch: int, device: str, clip: float = 1.0,
              order_seed: int | None = None, check_every: int = 50,
              on_step: Callable[[int], None] | None = None, shard_over: int | None = None) -> RunLog:
    """One run. ``shard_over``: inside a process group of that many ranks, the model is sharded by
    ``fully_shard`` (FSDP2) and each rank takes an equal share of every batch; the logged loss is
    the mean over all of them, so the run computes what one device would."""
    order_seed = candidate.order_seed if order_seed is None else order_seed
    with torch.device(device):
        model = Llama(config, candidate.layers, impl=candidate.impl,
                      overrides={slot: make() for slot, make in candidate.layer_fns.items()})
    model.load_state_dict(init)
    model.train()
    share = slice(None)
    if shard_over:
        import torch.distributed as dist

        from ..distributed.fsdp import make_mesh, shard_model

        if batch % shard_over:
            raise ValueError(f"a batch of {batch} sequences does not split over {shard_over} ranks; pass --batch "
                             f"a multiple of {shard_over}")
        per_rank = batch // shard_over
        share = slice(dist.get_rank() * per_rank, (dist.get_rank() + 1) * per_rank)
        model = shard_model(model, make_mesh(torch.device(device), shard_over))
    named = list(model.named_parameters())
    params = [p for _, p in named]
    optimizer = candidate.make_optimizer(named)
    order = stream.order(order_seed, batch)
    if order.shape[0] < steps:
        raise ValueError(f"the stream holds {order.shape[0]} batches of {batch}, {steps} steps asked")
    cuda = device == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    losses = torch.full((steps,), math.nan, device=device)
    norms = torch.full((steps,), math.nan, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else None
    host_times = np.full(steps + 1, np.nan)
    max_norm = clip if clip > 0 else math.inf
    wall = time.perf_counter()
    done = 0
    for step in range(steps):
        if cuda:
            starts[step].record()
        else:
            host_times[step] = time.perf_counter()
        seqs = stream.tokens[order[step]][share]
        with autocast:
            loss = model.loss(seqs[:, :-1], seqs[:, 1:])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged = loss.detach()
        if shard_over:
            dist.all_reduce(logged)  # the mean over every rank's equal share of the batch
            logged = logged / shard_over
        losses[step] = logged
        norms[step] = norm.full_tensor() if hasattr(norm, "full_tensor") else norm.detach()
        done = step + 1
        if on_step is not None:
            on_step(step)
        if done % check_every == 0 and not bool(torch.isfinite(losses[:done]).all()):
            break  # diverged: the rest of the run would only repeat NaN
    if cuda:
        starts[done].record()
        torch.cuda.synchronize()
        step_ms = np.full(steps, np.nan)
        step_ms[:done] = [starts[i].elapsed_time(starts[i + 1]) for i in range(done)]
    else:
        host_times[done] = time.perf_counter()
        step_ms = np.full(steps, np.nan)
        step_ms[:done] = np.diff(host_times[: done + 1]) * 1e3
    wall = time.perf_counter() - wall
    interpreted = candidate.requires.interpreted(device)
    return RunLog(candidate.name, order_seed, losses.float().cpu().numpy().astype(np.float64),
                  norms.float().cpu().numpy().astype(np.float64), None if interpreted else step_ms,
                  optimizer_state_bytes(optimizer), wall, batch * stream.seq)
