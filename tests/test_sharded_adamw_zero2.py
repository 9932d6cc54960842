"""ShardedAdamW's ZeRO-2 gradient release (free_grads) and parameter prefetch on the CPU.

One process for the argument checks; 2 Gloo ranks (``run_ranks``, one spawn for every scenario)
for the rest. Each option is held to the default path bit for bit; what the optimizer still holds
is read from the objects reachable from it and from weak references, the prefetch's waits from a
counting wrapper and from probe hooks, never from timing.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

# The toy model, its losses and the training loop: the overlap tests' (one definition).
from test_sharded_adamw_overlap import (
    BUCKET_BYTES,
    LR,
    STEPS,
    USED,
    WEIGHT_DECAY,
    WITH_UNUSED,
    _differences,
    _loss,
    _params,
    _train,
)

from kernelbench.distributed.spawn import run_ranks


def _optimizer(params, **kwargs):
    from kernelbench.optim import ShardedAdamW

    return ShardedAdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, bucket_bytes=BUCKET_BYTES, **kwargs)


def _full_size_held(opt) -> list[str]:
    """Tensors reachable from ``opt`` (attributes, dicts, lists) of at least a whole bucket's
    elements, other than the parameter buckets themselves."""
    full = min(b.param_flat.numel() for b in opt._buckets)
    param_storages = {b.param_flat.untyped_storage().data_ptr() for b in opt._buckets}
    seen, held, stack = set(), [], [opt]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, weakref.ref, torch.nn.Module)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            elements = storage.nbytes() // obj.element_size()
            if storage.data_ptr() not in param_storages and elements >= full:
                held.append(f"{obj.dtype} storage of {elements} elements")
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set)):
            stack += list(obj)
        elif hasattr(obj, "__dict__"):
            stack += list(vars(obj).values())
    return held


class _Model(torch.nn.Module):
    """USED's MLP as modules: bucket 0 is layer 0's, bucket 1 layer 1's, bucket 2 layer 2's."""

    def __init__(self) -> None:
        super().__init__()
        named = dict(_params(USED))
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(5, 6), torch.nn.Linear(6, 7), torch.nn.Linear(7, 3, bias=False)])
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.weight.copy_(named[f"w{i}"])
                if layer.bias is not None:
                    layer.bias.copy_(named[f"b{i}"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.layers[0](x))
        h = torch.tanh(self.layers[1](h))
        return self.layers[2](h)


def _model_loss(model, step: int, rank: int) -> torch.Tensor:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(100 * step + rank))
    return (model(x) ** 2).mean()


# -- two Gloo ranks ----------------------------------------------------------------------------
def _free_grads_scenarios(rank: int) -> dict:
    report: dict = {"bitwise": [], "held_after_step": [], "alive_after_step": [], "grads_after_step": [],
                    "reallocated": [], "control_held": [], "adopted": []}
    # The all-reduce fallback (old Gloo builds) leaves the sum in the full bucket: its own copy-out.
    cases = [(None, USED, None, "auto"), (None, WITH_UNUSED, None, "auto"), (torch.bfloat16, WITH_UNUSED, None, "auto"),
             (None, WITH_UNUSED, 0.05, "auto"), (None, WITH_UNUSED, None, "all-reduce")]
    for comm_dtype, shapes, max_norm, comm in cases:
        tag = f"[{comm_dtype}, {len(shapes)} params, clip {max_norm}, {comm}]"
        plain_named, free_named = _params(shapes), _params(shapes)
        kwargs = dict(grad_comm_dtype=comm_dtype, overlap_grad_reduce=True, max_grad_norm=max_norm, comm=comm)
        plain = _optimizer([p for _, p in plain_named], **kwargs)
        freeing = _optimizer([p for _, p in free_named], free_grads=True, **kwargs)
        _train(plain, plain_named, rank)
        _train(freeing, free_named, rank)
        report["bitwise"] += _differences(free_named, plain_named, tag)
        # One more step, watching the full buffers the backward brought back.
        _loss(free_named, STEPS, rank).backward()
        buffers = [b.grad_flat for b in freeing._buckets] + [b.comm_flat for b in freeing._buckets]
        refs = [weakref.ref(t) for t in buffers if t is not None]
        del buffers
        freeing.step()
        gc.collect()
        report["alive_after_step"] += [f"{tag}: {sum(r() is not None for r in refs)} of {len(refs)}"] if any(
            r() is not None for r in refs) else []
        report["held_after_step"] += [f"{tag}: {h}" for h in _full_size_held(freeing)]
        report["grads_after_step"] += [f"{tag}: {n}.grad is not None" for n, p in free_named if p.grad is not None]
        if max_norm is None:
            report["control_held"].append(bool(_full_size_held(plain)))
        # The next backward allocates each bucket again and the grads it made are its views, but
        # for the buckets whose reduction it already retired (released: grad None).
        _loss(free_named, STEPS + 1, rank).backward()
        for b in freeing._buckets:
            retired = b.index in freeing._retired
            storage = b.grad_flat.untyped_storage().data_ptr() if b.grad_flat is not None else None
            for i, p in zip(b.param_indices, b.params):
                used = i < len(USED) or (rank == 1 and i == len(WITH_UNUSED) - 1)
                if retired and (p.grad is not None or b.grad_flat is not None):
                    report["reallocated"].append(f"{tag}: param {i}'s retired bucket still holds a grad")
                elif not retired and used and (p.grad is None or p.grad.untyped_storage().data_ptr() != storage):
                    report["reallocated"].append(f"{tag}: param {i} is not a view of its bucket after a backward")
        freeing.step()  # not zero_grad(): a bucket unused on this rank is launched by step() only
        freeing.zero_grad()
        report["grads_after_step"] += [f"{tag}: {n}.grad survived zero_grad" for n, p in free_named
                                       if p.grad is not None]
        plain.remove_hooks()
        freeing.remove_hooks()

    # During the backward: the oldest reductions are waited for and their buckets released once
    # REDUCTIONS_IN_FLIGHT later ones are on the wire (USED: buckets 2, 1, 0 in launch order).
    from kernelbench.optim import sharded_adamw

    named = _params(USED)
    freeing = _optimizer([p for _, p in named], overlap_grad_reduce=True, free_grads=True)
    # Built without grads: no full grad bucket until a backward makes one.
    report["held_after_construction"] = _full_size_held(freeing) + [
        f"{n}.grad is not None" for n, p in named if p.grad is not None]
    _train(freeing, named, rank, steps=1)
    _loss(named, 1, rank).backward()
    report["held_after_backward"] = [b.grad_flat is not None for b in freeing._buckets]
    report["shards_during_backward"] = [b.grad_shard is not None for b in freeing._buckets]
    report["in_flight"] = sharded_adamw.REDUCTIONS_IN_FLIGHT
    freeing.step()
    report["shards_after_step"] = [b.grad_shard is not None for b in freeing._buckets] + [
        freeing._shard_flat is not None]
    # The measuring split (communicate_only, then update_only) releases them like a step.
    _loss(named, 2, rank).backward()
    freeing.communicate_only()
    report["shards_after_split"] = [freeing._shard_flat is not None]
    freeing.update_only()
    report["shards_after_split"].append(freeing._shard_flat is not None)
    freeing.remove_hooks()

    # A bucket of one parameter whose grad autograd made at the bucket's exact size (16 x 8 = 128
    # elements = 64 * world) takes that tensor as its buffer.
    gen = torch.Generator().manual_seed(3)
    a = torch.nn.Parameter(torch.randn(16, 8, generator=gen))
    h = torch.nn.Parameter(torch.randn(3, 16, generator=gen))
    freeing = _optimizer([a, h], overlap_grad_reduce=True, free_grads=True)
    made: list[int] = []
    a.register_hook(lambda g: made.append(g.data_ptr()))
    for step in range(2):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + 10 * rank))
        ((x @ a.T @ h.T) ** 2).mean().backward()
        bucket = freeing._buckets[0]
        report["adopted"].append((len(bucket.params), bucket.grad_flat.data_ptr() == made[-1]))
        freeing.step()
    freeing.remove_hooks()

    # no_sync accumulation: the micro-batch grads autograd makes while the bucket is released are
    # copied into it by the first hook outside no_sync.
    plain_named, free_named = _params(USED), _params(USED)
    plain = _optimizer([p for _, p in plain_named], overlap_grad_reduce=True)
    freeing = _optimizer([p for _, p in free_named], overlap_grad_reduce=True, free_grads=True)
    for step in range(STEPS):
        for opt, named in ((plain, plain_named), (freeing, free_named)):
            with opt.no_sync():
                _loss(named, step, rank).backward()
            _loss(named, step + STEPS, rank).backward()
            opt.step()
            opt.zero_grad()
    report["bitwise"] += _differences(free_named, plain_named, "[no_sync accumulation]")
    plain.remove_hooks()
    freeing.remove_hooks()
    return report


def _prefetch_run(rank: int, tag: str, common: dict, extra: dict, report: dict) -> None:
    plain_model, model = _Model(), _Model()
    plain = _optimizer(plain_model.parameters(), **common)
    opt = _optimizer(model.parameters(), **common, **extra, module=model)
    waits: list[str] = []
    original_wait = opt._wait
    opt._wait = lambda work, what, b: waits.append(what) or original_wait(work, what, b)
    gathered: list[int] = []
    original_gather = opt._start_all_gather
    opt._start_all_gather = lambda b: gathered.append(b.index) or original_gather(b)
    pending: list[list[int]] = []
    for layer in model.layers:  # after attach's hooks, so they see the state those left
        layer.register_forward_pre_hook(lambda module, args: pending.append(sorted(opt._gathers)))
    for step in range(STEPS):
        _model_loss(plain_model, step, rank).backward()
        plain.step()
        plain.zero_grad()
        pending.clear()
        waits.clear()
        loss = _model_loss(model, step, rank)
        report["forward_waits"].append(waits.count("all-gather"))
        report["pending_at_forward"].append(list(pending))
        loss.backward()
        opt.step()
        report["pending_after_step"].append(sorted(opt._gathers))
        report["gather_order"].append(list(gathered))
        gathered.clear()
        opt.zero_grad()
    opt.wait_params()
    report["bitwise"] += _differences(list(model.named_parameters()), list(plain_model.named_parameters()), tag)
    if common.get("overlap_grad_reduce"):
        plain.remove_hooks()
        opt.remove_hooks()


def _prefetch_scenarios(rank: int) -> dict:
    report: dict = {"bitwise": [], "pending_after_step": [], "pending_at_forward": [], "forward_waits": [],
                    "gather_order": []}
    _prefetch_run(rank, "prefetch", {}, {"prefetch_params": True}, report)
    _prefetch_run(rank, "prefetch + free_grads, bf16, clipped",
                  {"overlap_grad_reduce": True, "grad_comm_dtype": torch.bfloat16, "max_grad_norm": 0.05},
                  {"prefetch_params": True, "free_grads": True}, report)
    return report


def _scenarios(rank: int, world: int) -> dict:
    return {"free_grads": _free_grads_scenarios(rank), "prefetch": _prefetch_scenarios(rank)}


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_ranks(_scenarios, 2, timeout_s=240, collective_timeout_s=30)


def test_free_grads_equals_the_default_bit_for_bit(two_ranks):
    problems = [p for r in two_ranks for p in r["free_grads"]["bitwise"]]
    assert not problems, "\n".join(problems)


def test_free_grads_leaves_no_full_grad_buffer_after_step(two_ranks):
    for r in two_ranks:
        report = r["free_grads"]
        assert not report["alive_after_step"], report["alive_after_step"]  # nothing anywhere keeps them
        assert not report["held_after_step"], report["held_after_step"]
        assert not report["grads_after_step"], report["grads_after_step"]
        assert report["control_held"] == [True] * 4, "the default path's buckets were not seen"


def test_free_grads_reallocates_the_bucket_at_the_next_backward(two_ranks):
    problems = [p for r in two_ranks for p in r["free_grads"]["reallocated"]]
    assert not problems, "\n".join(problems)


def test_free_grads_releases_buckets_during_the_backward(two_ranks):
    for r in two_ranks:
        report = r["free_grads"]
        assert report["held_after_construction"] == [], report["held_after_construction"]
        assert report["in_flight"] == 2
        # bucket 2 was launched first; with 1 and 0 launched after it, its reduction is retired
        assert report["held_after_backward"] == [True, True, False], report["held_after_backward"]
        # the shards live from the step's first reduction to its updates
        assert report["shards_during_backward"] == [True] * 3 and report["shards_after_step"] == [False] * 4
        assert report["shards_after_split"] == [True, False], report["shards_after_split"]


def test_free_grads_takes_an_exact_size_grad_as_the_bucket(two_ranks):
    for r in two_ranks:
        # every step (none allocated at construction, released at each step): autograd's own tensor
        assert r["free_grads"]["adopted"] == [(1, True), (1, True)], r["free_grads"]["adopted"]


def test_prefetch_equals_the_default_bit_for_bit(two_ranks):
    problems = [p for r in two_ranks for p in r["prefetch"]["bitwise"]]
    assert not problems, "\n".join(problems)


def test_prefetch_leaves_the_gathers_to_each_layers_forward(two_ranks):
    configs = 2
    for r in two_ranks:
        report = r["prefetch"]
        # step() returned with every bucket's all-gather in flight
        assert report["pending_after_step"] == [[0, 1, 2]] * STEPS * configs, report["pending_after_step"]
        # layer k's pre-hook finds its own bucket k gathered and the later ones still in flight
        first_step = [[], [], []]
        later = [[1, 2], [2], []]
        assert report["pending_at_forward"] == ([first_step] + [later] * (STEPS - 1)) * configs, report
        assert report["forward_waits"] == ([0] + [3] * (STEPS - 1)) * configs, report["forward_waits"]
        # issued in the forward's order (the reductions and updates run last bucket first)
        assert report["gather_order"] == [[0, 1, 2]] * STEPS * configs, report["gather_order"]


# -- one process -------------------------------------------------------------------------------
def test_free_grads_needs_overlap_and_module_needs_prefetch():
    with pytest.raises(ValueError, match=r"free_grads=True needs overlap_grad_reduce=True"):
        _optimizer([torch.nn.Parameter(torch.zeros(3))], free_grads=True)
    model = _Model()
    with pytest.raises(ValueError, match=r"module= is for prefetch_params=True"):
        _optimizer(model.parameters(), module=model)
    with pytest.raises(ValueError, match=r"attach\(\) is for prefetch_params=True"):
        _optimizer(model.parameters()).attach(model)


def test_prefetch_needs_the_model_that_owns_every_param():
    model = _Model()
    opt = _optimizer(model.parameters(), prefetch_params=True)
    _model_loss(model, 0, 0).backward()
    with pytest.raises(RuntimeError, match=r"prefetch_params=True needs the model.*attach\(model\)"):
        opt.step()
    stranger = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"param 5 is not a parameter of any module of the attached model"):
        _optimizer([*model.parameters(), stranger], prefetch_params=True, module=model)
    opt.attach(model)
    opt.step()  # one process: nothing to gather, nothing left pending
    assert opt._gathers == {}
