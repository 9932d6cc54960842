"""kernelbench train: the band logic, the token stream, a tiny training run, the CLI's files and exit codes."""

import dataclasses
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.harness.rows import ROW_FIELDS
from kernelbench.models import CONFIGS
from kernelbench.ops import get_op
from kernelbench.ops.base import Requires
from kernelbench.train import (
    MarkovStream,
    TrainSettings,
    make_band,
    optimizer_state_bytes,
    resolve,
    step_band,
    tail_window,
    train,
    with_changes,
)
from kernelbench.train.band import first_nonfinite, first_step_leaving, first_step_outside, judge, running_loss
from kernelbench.train.data import SlowChainStream, make_stream
from kernelbench.train.run import LOSS_COLUMNS

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


# -- band -----------------------------------------------------------------------------------------

def _curve(final: float, steps: int = 50, start: float = 5.0) -> np.ndarray:
    return np.linspace(start, final, steps)


def test_band_is_the_seed_spread_widened_by_rtol():
    refs = [_curve(2.00), _curve(2.02), _curve(2.04)]
    window = tail_window(50)
    band = make_band(refs, rtol=0.01, window=window)
    finals = [float(np.mean(r[-window:])) for r in refs]
    assert band.mean == pytest.approx(np.mean(finals))
    assert band.spread == pytest.approx(max(abs(f - band.mean) for f in finals))
    assert band.half_width == pytest.approx(band.spread + 0.01 * band.mean)
    for f in finals:  # every reference seed is inside its own band
        assert band.contains(f) and abs(band.gap(f)) <= 1
    assert band.contains(band.high) and not band.contains(band.high + 1e-9)
    # two-sided: ending far below the reference is not training like it either
    assert not band.contains(band.low - 1e-3) and band.gap(band.low - 1e-3) < -1
    assert band.gap(band.mean + 2 * band.half_width) == pytest.approx(2.0)
    assert math.isnan(band.gap(float("nan"))) and not band.contains(float("inf"))


def test_band_refuses_a_diverged_reference_and_a_negative_rtol():
    bad = _curve(2.0)
    bad[30:] = np.nan
    with pytest.raises(ValueError, match="finite"):
        make_band([_curve(2.0), bad], rtol=0.01)
    with pytest.raises(ValueError, match="rtol"):
        make_band([_curve(2.0)], rtol=-0.1)


def test_running_loss_is_a_trailing_mean_and_nan_sticks():
    x = np.arange(10, dtype=float)
    expected = pd.Series(x).rolling(3, min_periods=1).mean().to_numpy()
    np.testing.assert_allclose(running_loss(x, 3), expected)
    x[4] = np.inf
    run = running_loss(x, 3)
    assert np.isfinite(run[:4]).all() and np.isnan(run[4:]).all()
    assert first_nonfinite(x) == 4 and first_nonfinite(np.ones(3)) is None


def test_first_step_outside_and_the_verdict():
    refs = [_curve(2.0), _curve(2.0) + 0.01, _curve(2.0) - 0.01]
    window = tail_window(50)
    band, per_step = make_band(refs, 0.01, window), step_band(refs, 0.01, window)
    inside = judge(_curve(2.0) + 0.005, band, per_step, window)
    assert inside.passed and inside.first_outside is None and inside.nonfinite_step is None
    drift = _curve(2.0).copy()
    drift[25:] += 0.5  # a jump half-way: the running loss leaves the band at once
    late = judge(drift, band, per_step, window)
    assert not late.passed and late.first_outside == 25 and late.gap > 1
    blown = _curve(2.0).copy()
    blown[40] = np.nan
    v = judge(blown, band, per_step, window)
    assert not v.passed and v.nonfinite_step == 40 and first_step_outside(blown, per_step, window) == 40


def test_one_noisy_step_stays_and_a_sustained_excursion_fails_with_the_final_loss_inside():
    refs = [_curve(2.0), _curve(2.0) + 0.01, _curve(2.0) - 0.01]
    window = tail_window(50)  # 5 steps
    band, per_step = make_band(refs, 0.01, window), step_band(refs, 0.01, window)
    spike = _curve(2.0).copy()
    spike[20] += 1.0  # one noisy step: the running loss is outside for `window` steps, then back
    v = judge(spike, band, per_step, window)
    assert v.first_outside == 20 and v.steps_outside == window and v.left_band is None and v.passed
    detour = _curve(2.0).copy()
    detour[10:30] += 0.5  # 20 steps off course, then back on the reference's curve
    v = judge(detour, band, per_step, window)
    assert band.contains(v.final) and abs(v.gap) <= 1  # the final loss alone would pass
    assert v.left_band == 10 == first_step_leaving(detour, per_step, window) and not v.passed
    late = _curve(2.0).copy()
    late[-3:] += 0.5  # outside at the end, shorter than the window: still leaves (the final loss is out)
    assert first_step_leaving(late, per_step, window) == 47


# -- data -----------------------------------------------------------------------------------------

def test_markov_stream_floor_determinism_and_data_orders():
    a = MarkovStream(64, n_sequences=256, seq=48, seed=3, successors=4)
    b = MarkovStream(64, n_sequences=256, seq=48, seed=3, successors=4)
    assert torch.equal(a.tokens, b.tokens)
    assert a.tokens.min() >= 0 and a.tokens.max() < 64 and a.tokens.shape == (256, 49)
    # every transition is one of the chain's successors, and the true chain's loss on the
    # samples is its entropy rate (the floor), up to sampling noise
    nxt_ok = (a.successors[a.tokens[:, :-1]] == a.tokens[:, 1:, None]).any(-1)
    assert nxt_ok.all()
    assert a.empirical_loss_floor() == pytest.approx(a.stats.entropy_rate, rel=0.03)
    assert 0 < a.stats.entropy_rate < math.log(4) < a.stats.unigram_entropy <= math.log(64) + 1e-9
    assert torch.allclose(a.pi @ torch.zeros(64, 64, dtype=torch.float64).index_put_(
        (torch.arange(64).repeat_interleave(4), a.successors.flatten()), a.probs.flatten(), accumulate=True), a.pi)
    identity, shuffled = a.order(0, 8), a.order(1, 8)
    assert identity.shape == (32, 8) and torch.equal(identity.flatten(), torch.arange(256))
    assert not torch.equal(shuffled, identity) and torch.equal(shuffled.flatten().sort().values, torch.arange(256))
    assert torch.equal(shuffled, a.order(1, 8))


def test_slow_chain_copies_through_a_permutation_and_its_floor():
    s = SlowChainStream(32, n_sequences=64, seq=12, seed=2, lag=5)
    assert torch.equal(s.tokens[:, 5:], s.perm[s.tokens[:, :-5]])
    assert torch.equal(s.perm.sort().values, torch.arange(32))
    assert s.stats.entropy_rate == pytest.approx(4 / 12 * math.log(32)) and "slow chain" in s.stats.describe()
    made = make_stream("slow-chain", 32, n_sequences=64, seq=12, seed=2, successors=8, device="cpu")
    assert torch.equal(made.tokens[:, :6], SlowChainStream(32, n_sequences=64, seq=12, seed=2).tokens[:, :6])
    assert s.order(3, 8).shape == (8, 8)
    with pytest.raises(ValueError, match="unknown data set"):
        make_stream("nope", 32, n_sequences=4, seq=4, seed=0, successors=2, device="cpu")


def test_state_bytes_count_each_storage_once():
    p = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(6, 4))]
    opt = torch.optim.AdamW(p, foreach=False)
    for q in p:
        q.grad = torch.randn_like(q)
    opt.step()
    assert optimizer_state_bytes(opt) == 2 * (2 * 24 * 4 + 4)  # exp_avg, exp_avg_sq, a 0-d step each
    # two views of one buffer (Muon's stacked momentum) are one storage
    stack = torch.zeros(2, 6, 4)
    opt.state[p[0]] = {"momentum_buffer": stack[0]}
    opt.state[p[1]] = {"momentum_buffer": stack[1]}
    assert optimizer_state_bytes(opt) == stack.numel() * 4


# -- a training run -------------------------------------------------------------------------------

def test_band_passes_another_data_order_and_fails_a_10x_learning_rate(tmp_path):
    """The reference under another data order is inside the band; with its learning rate 10x
    too high it is not. Both judged in one run of llama-tiny with torch's AdamW."""
    settings = TrainSettings.defaults("cpu", steps=16)
    cands = resolve("adamw", CONFIGS[settings.model], names=["torch-fused"])
    ref = cands[0]
    assert ref.name == "torch-forloop" and ref.role == "reference"
    cands += [with_changes(ref, "forloop-order-7", order_seed=7), with_changes(ref, "forloop-lr-10x", lr_factor=10)]
    sink = Rows()
    result = train("adamw", cands, settings, sink, tmp_path)
    status = {o.name: o.status for o in result.outcomes}
    assert status == {"torch-forloop": "pass", "torch-fused": "pass", "forloop-order-7": "pass",
                      "forloop-lr-10x": "fail"}, [o.message for o in result.outcomes]
    assert result.failures == ["forloop-lr-10x"]
    lr10 = next(o for o in result.outcomes if o.name == "forloop-lr-10x")
    assert abs(lr10.verdict.gap) > 1 and lr10.verdict.first_outside is not None
    # the same weights and batches: torch's fused AdamW tracks the for-loop one to rounding
    fused = next(o for o in result.outcomes if o.name == "torch-fused")
    assert fused.verdict.final == pytest.approx(result.band.seed_finals[0], abs=1e-3)

    losses = pd.read_csv(tmp_path / "losses.csv")
    assert tuple(losses.columns) == LOSS_COLUMNS
    runs = losses.groupby(["candidate", "seed"]).size()
    assert set(runs.index) == {("torch-forloop", 0), ("torch-forloop", 1), ("torch-forloop", 2),
                               ("torch-fused", 0), ("forloop-order-7", 7), ("forloop-lr-10x", 0)}
    assert (runs == 16).all() and np.isfinite(losses["loss"]).all() and (losses["grad_norm"] > 0).all()
    doc = json.loads((tmp_path / "train.json").read_text())
    assert doc["band"]["mean"] == pytest.approx(result.band.mean)
    assert doc["data"]["entropy_rate"] < doc["band"]["low"]  # 16 steps are far from the floor
    assert {c["name"] for c in doc["candidates"]} == set(status)
    rows = pd.DataFrame(sink.rows)
    parity = rows[rows.metric == "parity"].set_index("candidate")["status"].to_dict()
    assert parity == status
    state = rows[rows.metric == "state_bytes"].set_index("candidate")["value"]
    n_params = CONFIGS[settings.model].n_params()
    assert (state >= 8 * n_params).all() and (state <= 8 * n_params + 4 * 64).all()


@pytest.mark.slow
def test_slow_chain_trajectory_band_order_stays_10x_lr_leaves(tmp_path):
    """On the slow chain the reference is still on its plateau after 120 steps. Another data order
    stays in the band at every step; a 10x learning rate leaves the band early and fails although
    its final loss is inside the band."""
    settings = TrainSettings.defaults("cpu", steps=120, batch=8, ref_seeds=2, data="slow-chain")
    ref = resolve("adamw", CONFIGS[settings.model], names=["torch-fused"])[0]
    cands = [ref, with_changes(ref, "order-7", order_seed=7), with_changes(ref, "lr-10x", lr_factor=10)]
    sink = Rows()
    result = train("adamw", cands, settings, sink, tmp_path)
    out = {o.name: o for o in result.outcomes}
    assert {n: o.status for n, o in out.items()} == {"torch-forloop": "pass", "order-7": "pass", "lr-10x": "fail"}
    assert result.band.mean > 0.95 * math.log(CONFIGS[settings.model].vocab_size)  # not learnt in 120 steps
    assert out["order-7"].verdict.left_band is None
    lr10 = out["lr-10x"].verdict
    assert lr10.left_band is not None and lr10.left_band < 60 and "left the band at step" in out["lr-10x"].message
    rows = pd.DataFrame(sink.rows)
    left = rows[rows.metric == "step_left_band"].set_index("candidate")["value"]
    assert left["lr-10x"] == lr10.left_band and pd.isna(left["order-7"])
    doc = json.loads((tmp_path / "train.json").read_text())
    assert doc["settings"]["data"] == "slow-chain" and doc["data"]["lag"] == settings.seq // 2
    assert next(c for c in doc["candidates"] if c["name"] == "lr-10x")["step_left_band"] == lr10.left_band


# -- the CLI --------------------------------------------------------------------------------------

def _junit_cases(folder):
    return {c.get("name"): c for c in ET.parse(folder / "junit.xml").getroot().iter("testcase")}


def _is_png(path) -> bool:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.ndim == 3 and min(image.shape[:2]) > 100


def test_cli_train_writes_the_report_files_and_plot(tmp_path):
    out = tmp_path / "t"
    result = invoke("train", "adamw", "-c", "torch-fused", "--steps", "8", "--ref-seeds", "2",
                    "--device", "cpu", "-o", out)
    assert result.exit_code == 0, result.output
    assert "loss floor" in result.output and "band: reference final loss" in result.output
    assert {p.name for p in out.iterdir()} == {"results.csv", "run.json", "summary.md", "junit.xml",
                                              "losses.csv", "train.json", "losses.png"}
    rows = pd.read_csv(out / "results.csv")
    assert list(rows.columns) == list(ROW_FIELDS)
    for metric in ("final_loss", "band_gap", "first_step_outside_band", "nonfinite_step", "time_median_ms",
                   "tokens_per_s", "state_bytes", "parity"):
        assert set(rows.loc[rows.metric == metric, "candidate"]) == {"torch-forloop", "torch-fused"}, metric
    assert (rows.loc[rows.metric == "time_median_ms", "value"] > 0).all()
    cases = _junit_cases(out)
    assert set(cases) == {"llama-tiny/train/torch-forloop", "llama-tiny/train/torch-fused"}
    assert all(c.find("failure") is None for c in cases.values())
    assert json.loads((out / "run.json").read_text())["outcome"] == "complete"
    assert "![losses](losses.png)" in (out / "summary.md").read_text()
    assert _is_png(out / "losses.png")


def test_cli_train_exit_1_names_the_candidate_that_does_not_train_alike(tmp_path, monkeypatch):
    """A candidate registered on the op (as any new one is) with a 10x learning rate fails."""
    op = get_op("adamw")

    def too_fast(named_params, **hp):
        return torch.optim.AdamW([p for _, p in named_params], **{**hp, "lr": hp["lr"] * 10})

    monkeypatch.setitem(op.candidates, "lr-10x", dataclasses.replace(op.candidates["torch-fused"], name="lr-10x",
                                                                      build=too_fast))
    result = invoke("train", "adamw", "-c", "lr-10x", "--steps", "10", "--ref-seeds", "2", "--device", "cpu",
                    "-o", tmp_path)
    assert result.exit_code == 1, result.output
    assert "did not train like the reference: lr-10x" in result.output
    failure = _junit_cases(tmp_path)["llama-tiny/train/lr-10x"].find("failure")
    assert failure is not None and "band" in failure.get("message")


def test_cli_train_exit_4_when_the_reference_cannot_run(tmp_path, monkeypatch):
    op = get_op("adamw")
    monkeypatch.setitem(op.candidates, "torch-forloop",
                        dataclasses.replace(op.candidates["torch-forloop"], requires=Requires(cuda=True)))
    result = invoke("train", "adamw", "-c", "torch-fused", "--steps", "2", "--device", "cpu", "-o", tmp_path)
    assert result.exit_code == 4, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    assert rows.loc[rows.candidate == "torch-forloop", "message"].str.contains("needs CUDA").all()


@pytest.mark.parametrize("args, match", [
    (["muon-ns"], "neither an optimizer op nor a model layer"),
    (["adamw", "--seq", "65"], "at most 64 positions"),
    (["adamw", "--model", "llama-huge"], "unknown model 'llama-huge'"),
    (["adamw", "--steps", "0"], "--steps 0"),
    (["adamw", "--data", "nope"], "unknown data set 'nope'"),
    (["adamw", "-c", "nope"], "unknown candidate of op 'adamw' 'nope'"),
    (["rmsnorm", "-c", "nope"], "Valid: auto, kernelbench, liger,"),  # the layer sets and the op's candidates
    (["adam-mini", "--state", "fp4"], "accepted: fp32, bf16, fp8"),
])
def test_cli_train_usage_errors(args, match, tmp_path):
    result = invoke("train", *args, "--device", "cpu", "-o", tmp_path / "x")
    assert result.exit_code == 2, result.output
    assert match in " ".join(result.output.split())
    assert not (tmp_path / "x").exists()


def test_cli_train_layers_in_the_triton_interpreter(tmp_path):
    """The model with kernelbench's RMSNorm and rotary (interpreted) trains like torch's layers;
    its time is not a number in the interpreter."""
    result = invoke("train", "rmsnorm", "--steps", "3", "--ref-seeds", "2",
                    "--batch", "2", "--seq", "16", "--device", "cpu", "-o", tmp_path)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv").set_index(["candidate", "metric"])
    assert rows.loc[("kernelbench", "parity"), "status"] == "pass"
    assert rows.loc[("kernelbench", "time_median_ms"), "status"] == "not-measured"
    assert rows.loc[("liger", "parity"), "status"] == "skipped"
    gap = rows.loc[("kernelbench", "final_loss"), "value"] - rows.loc[("torch", "final_loss"), "value"]
    assert abs(gap) < 1e-4  # fp32 on the CPU: the same model to rounding


def test_layer_ops_come_from_the_registry_one_per_model_slot():
    """Every slot the model swaps is one registered op's, and a new op naming a slot is trained
    as a layer op without a change elsewhere."""
    from kernelbench.models import LAYER_SLOTS
    from kernelbench.ops.base import REGISTRY, Workload
    from kernelbench.ops.function_op import FunctionOp
    from kernelbench.train import layer_ops

    ops = layer_ops()
    assert sorted(op.model_layer for op in ops.values()) == sorted(LAYER_SLOTS)
    assert set(ops) == {"rmsnorm", "rotary", "swiglu", "cross-entropy"}
    op = FunctionOp("scratch-norm", doc="a second norm", model_layer="norm", make_inputs=lambda w, d, g: {},
                    workloads=[Workload("w", "cpu", {})], reference=lambda: None, outputs=("y",))
    try:
        names = [c.name for c in resolve("scratch-norm", CONFIGS["llama-tiny"])]
        assert names == ["torch", "kernelbench", "liger"]
    finally:
        del REGISTRY[op.name]


def test_slow_chain_defaults_on_cuda_to_a_model_whose_reference_learns_within_the_run():
    from kernelbench.train.run import SLOW_CHAIN_GPU_MODEL

    chain = TrainSettings.defaults("cuda", data="slow-chain")
    assert (chain.model, chain.steps, chain.seq) == (SLOW_CHAIN_GPU_MODEL, 800, 64)
    assert chain.validate().vocab_size == 512
    assert TrainSettings.defaults("cuda", data="slow-chain", steps=50, model="llama-7m").model == "llama-7m"
    assert TrainSettings.defaults("cuda").model == "llama-7m"
    assert TrainSettings.defaults("cpu", data="slow-chain").model == "llama-tiny"
