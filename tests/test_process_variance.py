"""Verdicts across processes: a process that sits at its own level is not a difference between the
sides. A replay of the same-commit comparison of an H100 record (a synthetic fixture: the record kept
only its summaries), two processes at different levels, a true 5% slowdown over several processes a
side, and the floor that holds a side of one process."""

import numpy as np
import pytest
from test_compare_verdicts import ENV

from kernelbench.harness.rows import RoundSamples
from kernelbench.report.compare import PROCESS_NOISE, RANK_TEST, compare_reports, judge_rows
from kernelbench.report.significance import INCONCLUSIVE, SAME, SLOWER, bootstrap_medians, judge
from kernelbench.report.writer import ReportWriter


def _process(rng, level, *, rounds=3, reps=120, noise=0.01, drift=0.002):
    """One process's per-rep times of a row at ``level``: (times, round of each)."""
    offsets = drift * rng.standard_normal(rounds)
    times = np.concatenate([level * (1 + o) * (1 + noise * rng.standard_normal(reps)) for o in offsets])
    return times, np.repeat(np.arange(1, rounds + 1), reps)


def _side(rng, levels, **kwargs):
    """Several processes, one per level: (times, (process, round) cluster, process) per rep."""
    parts = [(*_process(rng, level, **kwargs), p) for p, level in enumerate(levels)]
    times = np.concatenate([t for t, _, _ in parts])
    clusters = np.concatenate([p * 1000 + r for _, r, p in parts])
    processes = np.concatenate([np.full(len(t), p) for t, _, p in parts])
    return times, clusters, processes


def test_nested_bootstrap_widens_with_processes_that_disagree():
    rng = np.random.default_rng(0)
    times, clusters, processes = _side(rng, np.linspace(0.9, 1.1, 6))
    rounds_only = bootstrap_medians(times, clusters, resamples=500)
    nested = bootstrap_medians(times, clusters, processes, resamples=500)
    # 18 rounds drawn alone average the process levels out; 6 processes drawn keep them apart.
    assert nested.std() > 1.3 * rounds_only.std()
    assert np.array_equal(nested, bootstrap_medians(times, clusters, processes, resamples=500))
    # Round numbers repeat across processes; each (process, round) stays its own cluster.
    assert np.array_equal(bootstrap_medians(times, clusters % 1000, processes, resamples=500), nested)
    # One process: the two-stage resample, unchanged.
    one = np.zeros(len(times), dtype=int)
    assert np.array_equal(bootstrap_medians(times, clusters, one, resamples=50),
                          bootstrap_medians(times, clusters, resamples=50))
    with pytest.raises(ValueError, match="process labels"):
        bootstrap_medians(times, clusters, processes[:-1])


@pytest.mark.parametrize("seed", range(4))
def test_processes_at_different_levels_with_no_true_difference_are_not_slower(seed):
    """Each process sits at its own level, drawn from the same distribution on both sides (SD 3%,
    more than the threshold): the rounds of one process look precise; the processes do not."""
    rng = np.random.default_rng(seed)
    base = _side(rng, 1 + 0.03 * rng.standard_normal(4))
    new = _side(rng, 1 + 0.03 * rng.standard_normal(4))
    nested = judge(base[0], new[0], base[1], new[1], base_processes=base[2], new_processes=new[2], threshold=0.02)
    assert nested.verdict != SLOWER, nested


def test_a_process_at_another_level_fools_the_round_bootstrap_but_not_the_nested_one():
    rng = np.random.default_rng(5)
    base = _side(rng, [1.0, 1.0, 1.0])
    new = _side(rng, [1.0, 1.0, 1.25])  # one process of the same code sits 25% higher
    flat = judge(base[0], new[0], base[1], new[1], threshold=0.02)
    nested = judge(base[0], new[0], base[1], new[1], base_processes=base[2], new_processes=new[2], threshold=0.02)
    assert nested.verdict == INCONCLUSIVE and nested.high > 1.2 and nested.low < 1.02
    assert flat.high - flat.low < nested.high - nested.low


def test_a_true_five_percent_slowdown_over_several_processes_a_side_is_slower():
    """As ab times it: 3 processes a side, each at its own level (SD 0.5%), 3 rounds each."""
    rng = np.random.default_rng(11)
    base = _side(rng, 1.0 + 0.005 * rng.standard_normal(3), noise=0.005)
    new = _side(rng, 1.05 * (1 + 0.005 * rng.standard_normal(3)), noise=0.005)
    j = judge(base[0], new[0], base[1], new[1], base_processes=base[2], new_processes=new[2], threshold=0.02)
    assert j.verdict == SLOWER, j
    assert j.ratio == pytest.approx(1.05, abs=0.01) and 1.02 < j.low < 1.05 < j.high < 1.08


def _times_frame(keys, flags):
    import pandas as pd

    index = pd.MultiIndex.from_tuples(keys, names=["op", "workload", "mode", "candidate"])
    return pd.DataFrame({"time_median_ms": 1.0, "time_iqr_ms": 0.0, "flags": [flags.get(k[3], "") for k in keys]},
                        index=index)


def test_ab_rows_are_not_held_to_the_floor_and_single_processes_are():
    rng = np.random.default_rng(2)
    key = ("rmsnorm", "w", "fwd", "triton")
    base = _side(rng, [1.0, 1.0, 1.0], noise=0.005, drift=0.001)
    new = _side(rng, [1.025, 1.025, 1.025], noise=0.005, drift=0.001)
    times = _times_frame([key], {})
    several = judge_rows(times, times, {key: base}, {key: new}, threshold=0.01, noise_guard=False)
    assert several.verdict.iloc[0] == SLOWER and several.threshold.iloc[0] == 0.01
    first = [part[:360] for part in base], [part[:360] for part in new]  # process 0 of each side only
    single = judge_rows(times, times, {key: first[0]}, {key: first[1]}, threshold=0.01, noise_guard=False)
    assert single.verdict.iloc[0] == SAME and single.threshold.iloc[0] == PROCESS_NOISE
    assert "one process a side: held to the process noise, 3.0%" in single.why.iloc[0]


def _report(folder, rows, *, seed):
    """A one-process run report: per candidate (level, flags); 3 rounds of 120 reps, 1% noise."""
    rng = np.random.default_rng(seed)
    writer = ReportWriter(folder, ENV, "run")
    for (op, cand), (level, flags) in rows.items():
        times, rounds = _process(rng, level)
        q25, q50, q75 = np.quantile(times, [0.25, 0.5, 0.75])
        key = {"op": op, "workload": "w", "mode": "fwd", "candidate": cand, "unit": "ms", "status": "ok"}
        writer.add({**key, "metric": "time_median_ms", "value": q50, "flags": flags})
        writer.add({**key, "metric": "time_iqr_ms", "value": q75 - q25})
        for r in range(1, 4):
            writer.add_round(RoundSamples(op, "w", "fwd", cand, "time_median_ms", r, tuple(times[rounds == r])))
    writer.close("complete")
    return folder


def test_replay_of_the_same_commit_compare_on_an_h100_has_no_slower(tmp_path):
    """Mimics results/2026-11-26-h100-statistical-verdicts, run 667fd22: ci-lean twice at one commit,
    where muon-ns 4096x1024 torch-eager (host-bound) sat 1.58x higher in the second process,
    rotary fwd+bwd auto (host-bound) 0.53x, and cross-entropy liger fwd+bwd 1.066x with an interval
    [0.92, 1.17]; the other rows within 0.5%. The record kept summaries only, so the levels are
    rebuilt from them; the rounds of each process agree, as they did there."""
    host = "host-bound,fits-in-L2"
    base_rows = {("muon-ns", "torch-eager"): (0.52, host), ("rotary", "auto"): (0.51, host),
                 ("muon-ns", "triton-auto"): (0.246, "fits-in-L2"), ("rmsnorm", "triton"): (0.461, ""),
                 ("adamw", "torch-fused"): (3.9, ""), ("swiglu", "triton"): (0.363, "")}
    new_rows = dict(base_rows)
    new_rows[("muon-ns", "torch-eager")] = (0.52 * 1.58, host)
    new_rows[("rotary", "auto")] = (0.51 * 0.53, host)
    new_rows[("rmsnorm", "triton")] = (0.461 * 1.004, "")
    new_rows[("adamw", "torch-fused")] = (3.9 * 0.996, "")
    base = _report(tmp_path / "ci-lean-1", base_rows, seed=1)
    new = _report(tmp_path / "ci-lean-2", new_rows, seed=2)
    result = compare_reports(base, new)
    table = result.table.set_index(["op", "candidate"])
    assert (table.verdict != SLOWER).all() and result.regressions.empty, table[["ratio", "low", "verdict"]]
    eager = table.loc[("muon-ns", "torch-eager")]
    assert eager.verdict == INCONCLUSIVE and eager.ratio == pytest.approx(1.58, abs=0.03) and eager.low > 1.5
    assert "host-bound in BASE and NEW" in eager.why and "kernelbench ab" in eager.why
    assert table.loc[("rotary", "auto"), "verdict"] == INCONCLUSIVE
    assert "host-bound in BASE and NEW" in table.loc[("rotary", "auto"), "why"]
    assert set(table.loc[[("muon-ns", "triton-auto"), ("rmsnorm", "triton"), ("adamw", "torch-fused"),
                          ("swiglu", "triton")], "verdict"]) == {SAME}
    assert set(table.method) == {RANK_TEST}


def test_a_host_bound_row_is_slower_only_beyond_the_host_noise(tmp_path):
    host = "host-bound"
    rows = {("muon-ns", "torch-eager"): (0.52, host), ("rotary", "auto"): (0.51, host)}
    base = _report(tmp_path / "base", rows, seed=7)
    new = _report(tmp_path / "new", {("muon-ns", "torch-eager"): (0.52 * 10, host), ("rotary", "auto"): (0.51, host)},
                  seed=8)
    table = compare_reports(base, new).table.set_index("candidate")
    assert table.loc["torch-eager", "verdict"] == SLOWER and table.loc["torch-eager", "threshold"] == 1.2
    assert table.loc["auto", "verdict"] == SAME  # within 3%: the host noise does not make it inconclusive


def test_a_true_slowdown_beyond_the_floor_still_fails_between_two_reports(tmp_path):
    rows = {("rmsnorm", "triton"): (0.461, ""), ("rmsnorm", "torch-rms-norm"): (0.917, "")}
    base = _report(tmp_path / "base", rows, seed=3)
    new = _report(tmp_path / "new", {**rows, ("rmsnorm", "triton"): (0.461 * 1.10, "")}, seed=4)
    table = compare_reports(base, new).table.set_index("candidate")
    assert table.loc["triton", "verdict"] == SLOWER and table.loc["triton", "ratio"] == pytest.approx(1.10, abs=0.01)
    # Held to a 15% process noise, the same 10% is no longer called slower.
    held = compare_reports(base, new, process_noise=0.15).table.set_index("candidate")
    assert held.loc["triton", "verdict"] == SAME and held.loc["triton", "threshold"] == 0.15


def test_the_cli_takes_process_noise_and_refuses_a_negative_one(tmp_path):
    import inspect

    from typer.testing import CliRunner

    from kernelbench import cli

    assert inspect.signature(cli.compare).parameters["process_noise"].default == PROCESS_NOISE
    rows = {("rmsnorm", "triton"): (0.461, "")}
    base = _report(tmp_path / "base", rows, seed=5)
    new = _report(tmp_path / "new", {("rmsnorm", "triton"): (0.461 * 1.10, "")}, seed=6)
    runner = CliRunner()
    assert runner.invoke(cli.app, ["compare", str(base), str(new)]).exit_code == 3
    assert runner.invoke(cli.app, ["compare", str(base), str(new), "--process-noise", "0.2"]).exit_code == 0
    refused = runner.invoke(cli.app, ["compare", str(base), str(new), "--process-noise", "-1"])
    assert refused.exit_code == 2 and "--process-noise" in refused.output
