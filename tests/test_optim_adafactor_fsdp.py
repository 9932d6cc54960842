"""Adafactor8bit under FSDP2 on CPU ranks (Gloo, Triton interpreter): the sharded step against the
unsharded one from the same weights and gradients (kernelbench.distributed.fsdp), shard boundaries
that cut code blocks, layouts the kernels cannot step, and DCP checkpoints saved on 2 ranks and
loaded on 3 and on 1 (kernelbench.distributed.fsdp's checkpoint runs).

Spawning ranks costs more than the steps, so each rank count runs once per module (a fixture) and
the tests read what it returned.

Tolerances. The row statistic r and the full second moment v, their 8-bit codes and ranges come
from each rank's own rows, summed in the order one device sums them, and the code ranges shared by
ranks are exact maxima: asserted bitwise. The column statistic, mean(r), RMS(p) and RMS(u) are sums
over all rows that the sharded step adds in another order (per-rank partials, then the
all-reduce), a rounding of relative 2^-24 per partial: the state and parameters that depend on
them are asserted within a relative 1e-6 (measured up to 1.5e-7). 8-bit codes made from those
values (col_q, m_q) change only where a value lies within such a rounding of a threshold of the
stochastic rounding floor(x + U), and then by one code step: asserted |code difference| <= 1
(in these runs they are all equal, so the parameters meet the fp32 bound too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

from kernelbench.distributed.fsdp import FsdpParityRequest, fsdp_parity_rank
from kernelbench.distributed.spawn import run_ranks
from kernelbench.models.llama import LlamaConfig

# tests/test_optim_fsdp.py's model: 37 vocabulary rows and 24 hidden split unevenly over 2 and 3
# ranks; every code block (64 rows, 256 elements) spans several ranks.
CONFIG = LlamaConfig(vocab_size=37, hidden=24, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=40, max_seq=16)
STEPS = 2  # the first step starts the state, the second decodes and re-encodes it
REL_TOL = 1e-6
CODES = ("row_q", "col_q", "v_q", "m_q")
EXACT = ("row", "row_q", "row_range", "v", "v_q", "v_range", "step")


@dataclass(frozen=True)
class Factory:
    """Adafactor8bit with every tensor in 8-bit state (the model is tiny), picklable for the ranks."""

    quantize: bool
    beta1: float | None

    def __call__(self, named):
        from kernelbench.optim import Adafactor8bit

        return Adafactor8bit(named, quantize=self.quantize, min_8bit_size=0, beta1=self.beta1, weight_decay=0.1)


class Blocks(torch.nn.Module):
    """Shapes whose code blocks shard boundaries cut: 150 rows (3 row blocks; 75 | 75 and
    50 | 50 | 50 rows), 2 rows of 130 columns (2 column blocks; the third rank holds none), 5000
    elements (20 flat blocks over 3 work items), 2 elements (the third rank holds none)."""

    SHAPES = {"wide": (150, 20), "few": (2, 130), "long": (5000,), "short": (2,)}

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        for name, shape in self.SHAPES.items():
            self.register_parameter(name, torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.02))


# ---------------------------------------------------------------------------------------------
# What the ranks run
# ---------------------------------------------------------------------------------------------
def _step_pair(plain, sharded, plain_opt, sharded_opt, steps):
    """fsdp_parity_rank's loop for a model it does not build."""
    from kernelbench.distributed.fsdp import compare_runs, full_grads, set_grads

    device = next(plain.parameters()).device
    rows = []
    for step in range(1, steps + 1):
        set_grads(plain, sharded, full_grads(plain.named_parameters(), step, 0, 1e-2, device))
        plain_opt.step()
        sharded_opt.step()
        rows += compare_runs(step, plain, sharded, plain_opt, sharded_opt, True)
    return rows


def _blocks_parity(world, factory):
    from torch.distributed.fsdp import fully_shard

    from kernelbench.distributed.fsdp import device_for, make_mesh
    from kernelbench.optim.adafactor import dequantize_state

    device = device_for(0)
    plain = Blocks().to(device)
    sharded = fully_shard(copy.deepcopy(plain), mesh=make_mesh(device, world))
    plain_opt, sharded_opt = factory(list(plain.named_parameters())), factory(list(sharded.named_parameters()))
    rows = _step_pair(plain, sharded, plain_opt, sharded_opt, STEPS)
    # dequantize_state gathers a sharded parameter's state: the values one device decodes
    decoded = {}
    for (name, p), q in zip(sharded.named_parameters(), plain.parameters()):
        mine, ref = dequantize_state(p, sharded_opt.state[p]), dequantize_state(q, plain_opt.state[q])
        decoded[name] = {key: float((mine[key] - ref[key]).norm() / ref[key].norm()) for key in ref}
    return rows, decoded


class TinyLM(torch.nn.Module):
    """Embedding, one hidden layer with a LayerNorm, output: real gradients from a backward through
    fully_shard (reduce-scattered shards, views into FSDP's buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(37, 24)
        self.up = torch.nn.Linear(24, 70)
        self.norm = torch.nn.LayerNorm(70)
        self.out = torch.nn.Linear(70, 37)

    def forward(self, tokens):
        return self.out(self.norm(torch.relu(self.up(self.emb(tokens)))))


def _training(world, steps=3):
    """Losses of a training run under fully_shard (each rank its own batch) and of the same run on
    the whole batch unsharded, step by step."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from kernelbench.distributed.fsdp import make_mesh

    torch.manual_seed(0)
    plain = TinyLM()
    sharded = copy.deepcopy(plain)
    mesh = make_mesh(torch.device("cpu"), world)
    fully_shard(sharded.up, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    factory = Factory(True, 0.9)
    plain_opt, sharded_opt = factory(list(plain.named_parameters())), factory(list(sharded.named_parameters()))
    gen = torch.Generator().manual_seed(1)
    losses = []
    def train_step(model, opt, batch):
        loss = torch.nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    for _ in range(steps):
        tokens = torch.randint(0, 37, (2 * world, 16), generator=gen)
        expected = train_step(plain, plain_opt, tokens)
        mean = train_step(sharded, sharded_opt, tokens[2 * dist.get_rank():2 * dist.get_rank() + 2])
        dist.all_reduce(mean)
        losses.append((float(expected), float(mean) / world))
    return losses


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _error_cases(world):
    """Layouts the kernels cannot step, each a clear error before any launch."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from kernelbench.distributed.fsdp import make_mesh
    from kernelbench.optim import Adafactor8bit

    mesh = make_mesh(torch.device("cpu"), world)

    def param(shape, placements, grad_placements=None):
        p = torch.nn.Parameter(distribute_tensor(torch.randn(shape), mesh, placements))
        p.grad = distribute_tensor(torch.randn(shape), mesh, grad_placements or placements)
        return p

    out = {
        "shard1": _error(lambda: Adafactor8bit([("tp.weight", param((6, 4), [Shard(1)]))]).step()),
        "grad_layout": _error(lambda: Adafactor8bit([param((6, 4), [Shard(0)], [Replicate()])]).step()),
        "stacked": _error(lambda: Adafactor8bit([param((2, 6, 4), [Shard(0)])]).step()),
    }
    plain_grad = param((6, 4), [Shard(0)])
    plain_grad.grad = torch.ones(plain_grad.shape)
    out["plain_grad"] = _error(lambda: Adafactor8bit([plain_grad]).step())
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 6)
    fully_shard(meta, mesh=mesh)
    for p in meta.parameters():
        p.grad = torch.zeros_like(p)
    out["meta"] = _error(lambda: Adafactor8bit(list(meta.named_parameters())).step())

    # state that is not laid out as the kernels read it: per-row state as a plain tensor, shared
    # state as a DTensor
    p = param((6, 4), [Shard(0)])
    opt = Adafactor8bit([p], min_8bit_size=0)
    opt.step()
    before = p.to_local().clone()
    state = opt.state[p]
    saved = state["row_q"], state["col_q"]
    state["row_q"] = state["row_q"].to_local()
    p.grad = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])  # new gradient: the tables are rebuilt
    out["row_state_plain"] = _error(opt.step)
    state["row_q"], state["col_q"] = saved[0], distribute_tensor(saved[1], mesh, [Replicate()])
    out["shared_state_dtensor"] = _error(opt.step)
    out["untouched"] = torch.equal(p.to_local(), before)
    return out


def _full_state_dict_format(world):
    """The sharded optimizer's full state dict (gathered) is the single-device format: same keys,
    shapes and dtypes, and it loads into an unsharded Adafactor8bit."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from kernelbench.distributed.fsdp import build_pair, device_for, make_mesh

    device = device_for(0)
    factory = Factory(True, 0.9)
    plain, sharded = build_pair(CONFIG, 0, device, make_mesh(device, world))
    plain_opt, sharded_opt = factory(list(plain.named_parameters())), factory(list(sharded.named_parameters()))
    _step_pair(plain, sharded, plain_opt, sharded_opt, 1)
    full = get_optimizer_state_dict(sharded, sharded_opt, options=StateDictOptions(full_state_dict=True))
    names = [n for n, _ in plain.named_parameters()]
    problems = []
    for name, p in plain.named_parameters():
        mine, ref = full["state"][name], plain_opt.state[p]
        for key in ref:
            a, b = mine[key], ref[key]
            if type(a) is not torch.Tensor or a.shape != b.shape or a.dtype != b.dtype:
                problems.append(f"{name}.{key}: {type(a).__name__} {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} "
                                f"{b.dtype}")
    reloaded = factory(list(plain.named_parameters()))
    reloaded.load_state_dict({"state": {names.index(n): s for n, s in full["state"].items()},
                              "param_groups": plain_opt.state_dict()["param_groups"]})
    codes_equal = all(torch.equal(reloaded.state[p][key], plain_opt.state[p][key])
                      for p in plain.parameters() for key in CODES if key in plain_opt.state[p])
    return {"problems": problems, "reloaded_codes_equal": codes_equal}


def checkpoint_request(directory):
    """kernelbench.distributed.fsdp's DCP reshard run: 8-bit state with a first moment, saved after
    STEPS steps, one more step after loading."""
    from kernelbench.distributed.fsdp import CheckpointRequest

    return CheckpointRequest(Factory(True, 0.9), CONFIG, f"{directory}/ckpt", steps_before=STEPS, steps_after=1)


# Spread over the rank counts so that each (ranks, state, first moment) case the kernels branch on
# runs once; the DCP reshard (8-bit with a first moment) is saved on 2 ranks, loaded on 3 and 1.
def _two_ranks(rank, world, request):
    from kernelbench.distributed.fsdp import checkpoint_save_rank

    out = {
        "8bit": fsdp_parity_rank(rank, world, FsdpParityRequest(Factory(True, 0.9), CONFIG, steps=STEPS)),
        "fp32": fsdp_parity_rank(rank, world, FsdpParityRequest(Factory(False, None), CONFIG, steps=STEPS)),
        "errors": _error_cases(world),
        "full_state_dict": _full_state_dict_format(world),
        "training": _training(world),
    }
    checkpoint_save_rank(rank, world, request)
    return out


def _three_ranks(rank, world, request):
    from kernelbench.distributed.fsdp import checkpoint_resume_rank

    return {
        "8bit": fsdp_parity_rank(rank, world, FsdpParityRequest(Factory(True, None), CONFIG, steps=STEPS)),
        "fp32": fsdp_parity_rank(rank, world, FsdpParityRequest(Factory(False, 0.9), CONFIG, steps=STEPS)),
        "blocks": _blocks_parity(world, Factory(True, 0.9)),
        "dcp_load": checkpoint_resume_rank(rank, world, request),
    }


def _one_rank(rank, world, request):
    from kernelbench.distributed.fsdp import checkpoint_resume_rank

    return {"dcp_load": checkpoint_resume_rank(rank, world, request)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return checkpoint_request(tmp_path_factory.mktemp("adafactor_dcp"))


@pytest.fixture(scope="module")
def two_ranks(checkpoint):  # also saves the checkpoint the others load
    return run_ranks(_two_ranks, 2, args=(checkpoint,), timeout_s=600, collective_timeout_s=120)[0]


@pytest.fixture(scope="module")
def three_ranks(two_ranks, checkpoint):
    return run_ranks(_three_ranks, 3, args=(checkpoint,), timeout_s=600, collective_timeout_s=120)[0]


@pytest.fixture(scope="module")
def one_rank(two_ranks, checkpoint):
    return run_ranks(_one_rank, 1, args=(checkpoint,), timeout_s=300)[0]


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
def _key(row) -> str:
    name = row["tensor"]
    return "param" if name.endswith(".weight") or "." not in name else name.rsplit(".", 1)[1]


def check_parity(rows, label):
    """The tolerances of the module docstring, per row; the failure names every row outside."""
    assert rows, f"{label}: no rows"
    bad = []
    for r in rows:
        key = _key(r)
        if r.get("missing") or r.get("shape_mismatch") or r.get("nan_mismatch"):
            bad.append(r)
        elif key in EXACT and not r["bitwise"]:
            bad.append(r)
        elif key in CODES and r["max_abs"] > 1:
            bad.append(r)
        elif key not in CODES and r["rel_frob"] > REL_TOL:
            bad.append(r)
    assert not bad, f"{label}: {len(bad)} of {len(rows)} rows outside the tolerances, e.g. " + "; ".join(
        f"step {r['step']} {r['tensor']}: bitwise {r['bitwise']} max_abs {r['max_abs']:.3g} rel {r['rel_frob']:.3g}"
        + (f" {r.get('missing') or r.get('shape_mismatch') or ''}") for r in bad[:5])
    keys = {_key(r) for r in rows}
    return keys


@pytest.mark.parametrize("state", ["8bit", "fp32"])
def test_two_ranks_step_as_one_device(two_ranks, state):
    keys = check_parity(two_ranks[state], f"2 ranks, {state}")
    assert ("m_q" in keys) == (state == "8bit") and ("v" in keys) == (state == "fp32")


@pytest.mark.parametrize("state", ["8bit", "fp32"])
def test_three_ranks_step_as_one_device(three_ranks, state):
    keys = check_parity(three_ranks[state], f"3 ranks, {state}")
    assert ("row_q" in keys) == (state == "8bit") and ("m" in keys) == (state == "fp32")


def test_code_blocks_cut_by_shard_boundaries(three_ranks):
    """Row blocks and flat blocks split 50 | 50 | 50 and 1667 | 1667 | 1666, ranks holding no row:
    every code, range and scale as one device writes them (see the module docstring), and the
    decoded state (dequantize_state gathers a sharded parameter's) that of one device."""
    rows, decoded = three_ranks["blocks"]
    check_parity(rows, "Blocks on 3 ranks")
    assert {r["tensor"] for r in rows} >= {"wide.row_range", "long.v_range", "long.m_scale", "few.col_q"}
    assert set(decoded) == set(Blocks.SHAPES) and all(decoded[name] for name in decoded)
    assert all(err <= REL_TOL for errors in decoded.values() for err in errors.values()), decoded


def test_unsupported_layouts_are_clear_errors(two_ranks):
    errors = two_ranks["errors"]
    assert errors["shard1"].startswith("ValueError: Adafactor8bit: parameter 'tp.weight' (6x4) is a DTensor with "
                                       "placements (Shard(dim=1),)"), errors["shard1"]
    assert "but its gradient (Replicate(),)" in errors["grad_layout"], errors["grad_layout"]
    assert "parameter 0 (2x6x4) is a 3-dim DTensor" in errors["stacked"], errors["stacked"]
    assert errors["plain_grad"].startswith("TypeError: Adafactor8bit: parameter 0 (6x4) is a DTensor but its "
                                           "gradient is a Tensor"), errors["plain_grad"]
    assert errors["meta"].startswith("ValueError: Adafactor8bit: parameter 'weight' (6x4) is a meta tensor"), \
        errors["meta"]
    assert "is a DTensor but its state 'row_q' is a Tensor" in errors["row_state_plain"], errors["row_state_plain"]
    assert "state 'col_q' of parameter 0 (6x4) is a DTensor; it is the same on every rank" in \
        errors["shared_state_dtensor"], errors["shared_state_dtensor"]
    assert errors["untouched"], "a parameter was stepped before the error"


def test_training_under_fully_shard_follows_the_unsharded_run(two_ranks):
    """Gradients from a backward through fully_shard (the issue's case: an illegal memory access on
    the GPU before DTensor support): each step's loss equals the unsharded run's up to the order of
    the sums (the batch's mean over two ranks, the optimizer's global statistics)."""
    for step, (expected, sharded) in enumerate(two_ranks["training"]):
        assert abs(sharded - expected) <= 1e-5 * abs(expected), (step, sharded, expected)


def test_full_state_dict_is_the_single_device_format(two_ranks):
    result = two_ranks["full_state_dict"]
    assert not result["problems"], result["problems"]
    assert result["reloaded_codes_equal"]


def _check_resumed(rows, label):
    loaded = [r for r in rows if r["step"] == STEPS]
    # straight after loading, the codes and ranges are those the 2-rank run saved, which equal the
    # unsharded run's: a reshard keeps every block's range
    codes = [r for r in loaded if _key(r) in CODES + ("row_range", "v_range", "step")]
    assert codes and all(r["bitwise"] for r in codes), [r["tensor"] for r in codes if not r["bitwise"]]
    check_parity(rows, label)


def test_dcp_checkpoint_of_2_ranks_loads_on_3_and_training_continues(three_ranks):
    _check_resumed(three_ranks["dcp_load"], "saved on 2 ranks, loaded on 3")


def test_dcp_checkpoint_of_2_ranks_loads_on_1_and_training_continues(one_rank):
    _check_resumed(one_rank["dcp_load"], "saved on 2 ranks, loaded on 1")
