"""ShardedAdamW's parameter all-gathers in bf16 (``param_comm_dtype``) on the CPU.

A small model in the shape of a Llama's parameter list: an embedding read in fp32 (its own param
group, gathered in fp32), then linear layers read only through autocast's bf16 cast (a group
gathered in bf16). Trained on 2 Gloo ranks beside the same model with every gather in fp32, the
losses and the owned shards must be equal bit for bit in every mode of the optimizer, and the rest
of each replica must be the owners' values rounded to bf16. The gathers' dtypes are observed
through a wrapper around the all-gather collective.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks

STEPS = 4
BUCKET_BYTES = 512  # 128 elements: the linears span several buckets, each padded to 2 shards
MODES = {
    "after-backward": {},
    "overlap+free-grads+clip": {"overlap_grad_reduce": True, "free_grads": True, "max_grad_norm": 0.05},
    "overlap+prefetch": {"overlap_grad_reduce": True, "prefetch_params": True},
    "list-all-gather": {"comm": "all-reduce"},  # old Gloo builds: the list all-gather path
}


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(11, 6)
        self.up = torch.nn.Linear(6, 17)
        self.down = torch.nn.Linear(17, 5, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.down(torch.tanh(self.up(x)))


def _groups(model: _Model, param_comm_dtype: torch.dtype | None) -> list[dict]:
    return [{"params": [model.embed.weight]},
            {"params": [model.up.weight, model.up.bias, model.down.weight], "param_comm_dtype": param_comm_dtype}]


def _train(model: _Model, opt, rank: int, prefetch: bool) -> list[float]:
    losses = []
    for step in range(STEPS):
        tokens = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(10 * step + rank))
        loss = model(tokens).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if prefetch:
        opt.wait_params()
    return losses


class _GatherDtypes:
    """Wraps the module's all-gather collectives: records the dtype of every parameter gather."""

    def __init__(self, module) -> None:
        self.dtypes: list[str] = []
        original_single, original_list = module._all_gather_single, module.dist.all_gather

        def single():
            collective = original_single()

            def recorded(output, input, **kwargs):
                self.dtypes.append(str(output.dtype))
                return collective(output, input, **kwargs)

            return recorded

        def listed(outputs, input, **kwargs):
            self.dtypes.append(str(input.dtype))
            return original_list(outputs, input, **kwargs)

        module._all_gather_single, module.dist.all_gather = single, listed


def _scenarios(rank: int, world: int) -> dict:
    import kernelbench.optim.sharded_adamw as sharded_adamw
    from kernelbench.optim import ShardedAdamW

    report: dict = {"problems": [], "gathered": {}}
    gathers = _GatherDtypes(sharded_adamw)
    for mode, kwargs in MODES.items():
        prefetch = bool(kwargs.get("prefetch_params"))
        runs = {}
        for dtype in (None, torch.bfloat16):
            model = _Model()
            extra = {"module": model} if prefetch else {}
            opt = ShardedAdamW(_groups(model, dtype), lr=1e-2, weight_decay=0.1, bucket_bytes=BUCKET_BYTES,
                               **kwargs, **extra)
            gathers.dtypes.clear()
            losses = _train(model, opt, rank, prefetch)
            report["gathered"][f"{mode} {dtype}"] = sorted(set(gathers.dtypes))
            runs[dtype] = (model, opt, losses)
        (exact, exact_opt, exact_losses), (half, half_opt, half_losses) = runs[None], runs[torch.bfloat16]
        if half_losses != exact_losses:
            report["problems"].append(f"{mode}: losses {half_losses} against fp32 gathers' {exact_losses}")
        for b, e in zip(half_opt._buckets, exact_opt._buckets):
            lo, hi = rank * b.shard_numel, (rank + 1) * b.shard_numel
            rounded = e.param_flat.to(torch.bfloat16).float() if b.gather_dtype is not None else e.param_flat
            expected = torch.cat([rounded[:lo], e.param_flat[lo:hi], rounded[hi:]])
            if not torch.equal(b.param_flat, expected):
                report["problems"].append(f"{mode}: bucket {b.index} ({b.gather_dtype}) is not the owned fp32 "
                                          "shard beside the others' values rounded to bf16")
        report.setdefault("rounded", []).append(
            any(not torch.equal(p, q) for p, q in zip(half.parameters(), exact.parameters())))
        half_opt.gather_params_fp32()
        for (name, p), (_, q) in zip(half.named_parameters(), exact.named_parameters()):
            if not torch.equal(p, q):
                report["problems"].append(f"{mode}: {name} differs after gather_params_fp32()")
        if half_opt.state_bytes() != exact_opt.state_bytes():
            report["problems"].append(f"{mode}: state {half_opt.state_bytes()} B against {exact_opt.state_bytes()}")

    # Ranks that disagree on a group's param_comm_dtype are refused on every rank, before any step.
    model = _Model()
    try:
        ShardedAdamW(_groups(model, torch.bfloat16 if rank == 0 else None))
        report["disagreement"] = "accepted"
    except ValueError as error:
        report["disagreement"] = str(error)
    return report


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_ranks(_scenarios, 2, timeout_s=240, collective_timeout_s=30)


def test_bf16_parameter_gathers_train_bit_for_bit_like_fp32_ones_in_every_mode(two_ranks):
    problems = [p for r in two_ranks for p in r["problems"]]
    assert not problems, "\n".join(problems)
    # Before gather_params_fp32() the replicas held rounded values: the bf16 gathers did round.
    assert all(all(r["rounded"]) for r in two_ranks) and len(two_ranks[0]["rounded"]) == len(MODES)


def test_the_linears_group_is_gathered_in_bf16_and_the_embedding_group_in_fp32(two_ranks):
    for r in two_ranks:
        for mode in MODES:
            assert r["gathered"][f"{mode} None"] == ["torch.float32"], r["gathered"]
            assert r["gathered"][f"{mode} torch.bfloat16"] == ["torch.bfloat16", "torch.float32"], r["gathered"]


def test_ranks_that_disagree_on_param_comm_dtype_are_refused(two_ranks):
    for r in two_ranks:
        assert "ranks disagree" in r["disagreement"] and "param_comm_dtype" in r["disagreement"], r


def test_unsupported_param_comm_dtype_is_refused():
    from kernelbench.optim import ShardedAdamW

    with pytest.raises(ValueError, match=r"param group 0 has param_comm_dtype=torch.float16"):
        ShardedAdamW([torch.nn.Parameter(torch.zeros(3))], param_comm_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"param group 1 has param_comm_dtype='bf16'.*torch.bfloat16"):
        ShardedAdamW([{"params": [torch.nn.Parameter(torch.zeros(3))]},
                      {"params": [torch.nn.Parameter(torch.zeros(2))], "param_comm_dtype": "bf16"}])


def test_single_process_gathers_nothing_and_gather_params_fp32_is_a_no_op():
    from kernelbench.optim import ShardedAdamW

    model, reference = _Model(), _Model()
    opt = ShardedAdamW(_groups(model, torch.bfloat16), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    losses = _train(model, opt, 0, prefetch=False)
    torch.testing.assert_close(losses, _train(reference, ref_opt, 0, prefetch=False), rtol=1e-5, atol=0)
    opt.gather_params_fp32()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
