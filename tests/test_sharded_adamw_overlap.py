"""ShardedAdamW's overlapped gradient reduction and bf16 gradient traffic on the CPU.

One process for the argument checks; 2 Gloo ranks (``run_ranks``, one spawn for every scenario)
for the rest. The launches are observed through a counting wrapper around the reduce-scatter
collective, never through timing.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks

LR, WEIGHT_DECAY, STEPS = 1e-3, 0.05, 4
# 128 elements a bucket: (w0, b0), (w1, b1), (w2, unused), (rank1_only) with the unused params;
# (w0, b0), (w1, b1), (w2) without. Several params share a bucket, so a bucket waits for two hooks.
BUCKET_BYTES = 512
USED = [("w0", (6, 5)), ("b0", (6,)), ("w1", (7, 6)), ("b1", (7,)), ("w2", (3, 7))]
WITH_UNUSED = [*USED, ("unused", (5,)), ("rank1_only", (3,))]


def _params(shapes) -> list[tuple[str, torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(0)
    return [(name, torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.3)) for name, shape in shapes]


def _copy(named):
    return [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]


def _loss(named, step: int, rank: int, micro: int = 0) -> torch.Tensor:
    """A 3-layer MLP in order of the params; ``rank1_only`` joins the output on rank 1 only."""
    p = dict(named)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(100 * step + 10 * micro + rank))
    h = torch.tanh(x @ p["w0"].T + p["b0"])
    h = torch.tanh(h @ p["w1"].T + p["b1"])
    out = h @ p["w2"].T
    if rank == 1 and "rank1_only" in p:
        out = out + p["rank1_only"]
    return (out**2).mean()


def _optimizer(named, **kwargs):
    from kernelbench.optim import ShardedAdamW

    return ShardedAdamW([p for _, p in named], lr=LR, weight_decay=WEIGHT_DECAY, bucket_bytes=BUCKET_BYTES, **kwargs)


def _train(opt, named, rank: int, steps: int = STEPS) -> None:
    for step in range(steps):
        _loss(named, step, rank).backward()
        opt.step()
        if step % 2:
            opt.zero_grad()
        else:  # as model.zero_grad() does: the next backward makes new grads, the hooks copy them in
            for _, p in named:
                p.grad = None


def _differences(named, other, tag: str) -> list[str]:
    return [f"{tag}: {n} differs ({(p - q).abs().max().item():.3g})" for (n, p), (_, q) in zip(named, other)
            if not torch.equal(p, q)]


class _CountingReduceScatter:
    """Wraps the module's reduce-scatter collective: records which bucket each call sends."""

    def __init__(self, module) -> None:
        self.module, self.original = module, module._reduce_scatter_single
        self.flats: list[int] = []
        module._reduce_scatter_single = self._factory

    def _factory(self):
        collective = self.original()

        def counted(output, input, **kwargs):
            self.flats.append(input.data_ptr())
            return collective(output, input, **kwargs)

        return counted

    def buckets(self, opt) -> list[int]:
        index = {}
        for b in opt._buckets:
            index[b.grad_flat.data_ptr()] = b.index
            if b.comm_flat is not None:
                index[b.comm_flat.data_ptr()] = b.index
        return [index[ptr] for ptr in self.flats]


# -- two Gloo ranks ----------------------------------------------------------------------------
def _scenarios(rank: int, world: int) -> dict:
    import torch.distributed as dist

    import kernelbench.optim.sharded_adamw as sharded_adamw

    report: dict = {"bitwise": [], "launches": {}, "no_sync": [], "bf16": {}, "unused": []}

    # Overlapped == non-overlapped, bit for bit, over STEPS steps, in both comm dtypes.
    for comm_dtype in (None, torch.bfloat16):
        for shapes, tag in ((USED, "used"), (WITH_UNUSED, "unused")):
            plain_named, overlap_named = _params(shapes), _params(shapes)
            plain = _optimizer(plain_named, grad_comm_dtype=comm_dtype)
            overlapped = _optimizer(overlap_named, grad_comm_dtype=comm_dtype, overlap_grad_reduce=True)
            _train(plain, plain_named, rank)
            _train(overlapped, overlap_named, rank)
            report["bitwise"] += _differences(overlap_named, plain_named, f"[{comm_dtype}, {tag}]")
            overlapped.remove_hooks()
            if comm_dtype is None and tag == "unused":
                # A zero gradient: Adam's step is 0, the weight decay alone moves the param.
                decayed = _params(shapes)[5][1].detach() * (1 - LR * WEIGHT_DECAY) ** STEPS
                if not torch.allclose(dict(overlap_named)["unused"], decayed, rtol=1e-6, atol=0):
                    report["unused"].append("the unused param is not its start value times the decay")

    # The launches: during the backward, in reverse bucket order, none left for step().
    counter = _CountingReduceScatter(sharded_adamw)
    named = _params(USED)
    opt = _optimizer(named, overlap_grad_reduce=True)
    counter.flats.clear()  # the constructor's probe of the backend's collectives
    seen_at_first_layer: list[int] = []
    # A plain grad hook on w0 runs before w0's grad is accumulated: the last grads of the backward.
    dict(named)["w0"].register_hook(lambda grad: seen_at_first_layer.append(len(counter.flats)) or grad)
    _loss(named, 0, rank).backward()
    after_backward = counter.buckets(opt)
    opt.step()
    report["launches"] = {
        "at_first_layer": seen_at_first_layer,
        "after_backward": after_backward,
        "after_step": counter.buckets(opt),
        "buckets": len(opt._buckets),
    }
    opt.remove_hooks()

    # no_sync: two micro-batches accumulated locally, reduced once == one backward on their sum.
    accumulated_named, summed_named = _params(USED), _params(USED)
    accumulated = _optimizer(accumulated_named, overlap_grad_reduce=True)
    summed = _optimizer(summed_named)
    counts = []
    for step in range(STEPS):
        counter.flats.clear()
        with accumulated.no_sync():
            _loss(accumulated_named, step, rank, micro=0).backward()
        counts.append(len(counter.flats))
        _loss(accumulated_named, step, rank, micro=1).backward()
        counts.append(len(counter.flats))
        accumulated.step()
        accumulated.zero_grad()
        (_loss(summed_named, step, rank, micro=0) + _loss(summed_named, step, rank, micro=1)).backward()
        summed.step()
        summed.zero_grad()
    report["no_sync"] += _differences(accumulated_named, summed_named, "no_sync vs summed loss")
    report["no_sync_counts"] = counts
    # A second backward outside no_sync, into buckets already launched, is refused.
    try:
        _loss(accumulated_named, 0, rank).backward()
        _loss(accumulated_named, 1, rank).backward()
        report["second_backward"] = "no error"
    except RuntimeError as error:
        report["second_backward"] = str(error)
    accumulated.zero_grad()  # waits for and drops the first backward's reductions
    _loss(accumulated_named, 0, rank).backward()
    accumulated.step()
    accumulated.remove_hooks()

    # bf16 traffic == a hand-rounded average fed to a single-process ShardedAdamW (same kernel).
    singletons = [dist.new_group([r]) for r in range(world)]
    bf16_named, fp32_named, ref_named = _params(WITH_UNUSED), _params(WITH_UNUSED), _params(WITH_UNUSED)
    bf16 = _optimizer(bf16_named, overlap_grad_reduce=True, grad_comm_dtype=torch.bfloat16)
    fp32 = _optimizer(fp32_named, overlap_grad_reduce=True)
    ref = _optimizer(ref_named, process_group=singletons[rank])
    for step in range(STEPS):
        for opt, opt_named in ((bf16, bf16_named), (fp32, fp32_named)):
            _loss(opt_named, step, rank).backward()
            opt.step()
            opt.zero_grad()
        rank_grads = []
        for r in range(world):
            scratch = _copy(ref_named)
            _loss(scratch, step, r).backward()
            rank_grads.append([torch.zeros_like(p) if p.grad is None else p.grad for _, p in scratch])
        for (_, p), *gs in zip(ref_named, *rank_grads):
            wire_sum = torch.stack([g.bfloat16().float() for g in gs]).sum(0).bfloat16().float()
            p.grad.copy_(wire_sum * (1.0 / world))
        ref.step()
        ref.zero_grad()
    report["bf16"] = {
        "vs_hand_reference": _differences(bf16_named, ref_named, "bf16 comm vs hand-rounded reference"),
        "max_abs_vs_fp32": max((p - q).abs().max().item() for (_, p), (_, q) in zip(bf16_named, fp32_named)),
        "differs_from_fp32": any(not torch.equal(p, q) for (_, p), (_, q) in zip(bf16_named, fp32_named)),
        "comm_buffer_dtype": str(bf16._buckets[0].comm_flat.dtype),
    }
    return report


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_ranks(_scenarios, 2, timeout_s=240, collective_timeout_s=30)


def test_overlapped_equals_non_overlapped_bit_for_bit(two_ranks):
    problems = [p for r in two_ranks for p in r["bitwise"]]
    assert not problems, "\n".join(problems)


def test_reductions_are_launched_during_the_backward_in_reverse_bucket_order(two_ranks):
    for r in two_ranks:
        launches = r["launches"]
        assert launches["buckets"] == 3, launches
        # When w0's grad is computed the buckets of w2 and of (w1, b1) are already on the wire.
        assert launches["at_first_layer"] == [2], launches
        assert launches["after_backward"] == [2, 1, 0], launches
        assert launches["after_step"] == [2, 1, 0], launches  # step() launched nothing more


def test_no_sync_accumulation_equals_one_backward_on_the_summed_loss(two_ranks):
    problems = [p for r in two_ranks for p in r["no_sync"]]
    assert not problems, "\n".join(problems)
    for r in two_ranks:
        assert r["no_sync_counts"] == [0, 3] * STEPS, r["no_sync_counts"]  # nothing sent under no_sync
        assert "already being reduced" in r["second_backward"] and "no_sync" in r["second_backward"], r


def test_unused_params_are_stepped_with_a_zero_gradient(two_ranks):
    # Covered bitwise against the non-overlapped path above (its "unused" cases, including a param
    # that only rank 1 uses); here the unused param's value itself.
    problems = [p for r in two_ranks for p in r["unused"]]
    assert not problems, "\n".join(problems)


def test_bf16_gradient_traffic_matches_the_hand_rounded_reference(two_ranks):
    for r in two_ranks:
        bf16 = r["bf16"]
        assert bf16["comm_buffer_dtype"] == "torch.bfloat16"
        assert not bf16["vs_hand_reference"], "\n".join(bf16["vs_hand_reference"])
        assert bf16["differs_from_fp32"], "bf16 traffic gave fp32's result: the cast did not happen"
        # Adam's step is m / sqrt(v) * lr, about lr whatever the gradient's scale, and bf16's 2^-9
        # relative rounding of the gradient changes that ratio by about as much: 1% of lr a step
        # leaves room for cancelling sums (seen: 7.0e-6 after 4 steps, the bound 4e-5).
        assert bf16["max_abs_vs_fp32"] <= 0.01 * LR * STEPS, bf16


# -- one process -------------------------------------------------------------------------------
def test_bad_grad_comm_dtype_and_missing_hooks_are_refused():
    from kernelbench.optim import ShardedAdamW

    with pytest.raises(ValueError, match=r"grad_comm_dtype=torch.float16 is not supported"):
        ShardedAdamW([torch.nn.Parameter(torch.zeros(3))], grad_comm_dtype=torch.float16)


def test_overlap_needs_post_accumulate_grad_hooks(monkeypatch):
    from kernelbench.optim import ShardedAdamW

    monkeypatch.delattr(torch.Tensor, "register_post_accumulate_grad_hook")
    with pytest.raises(RuntimeError, match=r"overlap_grad_reduce=True needs torch >= 2.1"):
        ShardedAdamW([torch.nn.Parameter(torch.zeros(3))], overlap_grad_reduce=True)


def test_params_hooked_by_another_optimizer_are_refused_until_it_removes_its_hooks():
    named = _params(USED)
    first = _optimizer(named, overlap_grad_reduce=True)
    with pytest.raises(ValueError, match=r"param 0 already carries the grad hooks of another ShardedAdamW"):
        _optimizer(named, overlap_grad_reduce=True)
    first.remove_hooks()
    second = _optimizer(named, overlap_grad_reduce=True)
    _loss(named, 0, 0).backward()
    assert sorted(second._reductions) == [0, 1, 2]  # the second optimizer's hooks fired
    assert not first._reductions  # and the first's are gone
    second.remove_hooks()


def test_single_process_overlap_equals_plain_and_a_skipped_step_is_dropped_by_zero_grad():
    plain_named, overlap_named = _params(WITH_UNUSED), _params(WITH_UNUSED)
    plain = _optimizer(plain_named)
    overlapped = _optimizer(overlap_named, overlap_grad_reduce=True)
    _loss(overlap_named, 99, 0).backward()  # a backward whose step is skipped (e.g. a NaN loss)
    overlapped.zero_grad()
    _train(plain, plain_named, 0)
    _train(overlapped, overlap_named, 0)
    assert not (problems := _differences(overlap_named, plain_named, "one process")), "\n".join(problems)
    overlapped.remove_hooks()
    # Here rank1_only's bucket, first in launch order, never completes, so nothing is launched and
    # a second backward just accumulates; with every param used it is refused.
    used_named = _params(USED)
    used = _optimizer(used_named, overlap_grad_reduce=True)
    with pytest.raises(RuntimeError, match=r"a second backward reached param 4, whose bucket 2"):
        _loss(used_named, 0, 0).backward()
        _loss(used_named, 1, 0).backward()
    used.remove_hooks()
