"""compare's verdicts from synthetic reports: one row per verdict, the fallback for reports without
samples, throttled rows, and broken rows."""

import numpy as np
import pandas as pd
import pytest

from kernelbench.harness.gpustate import GpuState
from kernelbench.harness.rows import RoundSamples
from kernelbench.report.compare import BROKEN, IQR_RULE, RANK_TEST, compare_reports
from kernelbench.report.samples import SAMPLES_CSV
from kernelbench.report.significance import FASTER, INCONCLUSIVE, SAME, SLOWER
from kernelbench.report.writer import ReportWriter

ENV = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6"}


def _report(folder, levels, *, seed, flags=None, parity=None, offsets=(0.0, 0.002, -0.002), throttled=(),
            noise=None):
    """A run report with one timed row per candidate: 3 rounds of 120 reps at ``levels[c]`` ms,
    the given per-round offsets, 1% noise per rep (``noise[c]`` where given)."""
    rng = np.random.default_rng(seed)
    writer = ReportWriter(folder, ENV, "run")
    for cand, level in levels.items():
        per_round = level if isinstance(level, tuple) else [level * (1 + o) for o in offsets]
        spread = (noise or {}).get(cand, 0.01)
        rounds = [lv * (1 + spread * rng.standard_normal(120)) for lv in per_round]
        times = np.concatenate(rounds)
        q25, q50, q75 = np.quantile(times, [0.25, 0.5, 0.75])
        base = {"op": "rmsnorm", "workload": "w", "mode": "fwd", "candidate": cand, "unit": "ms", "status": "ok"}
        writer.add({**base, "metric": "time_median_ms", "value": q50, "flags": (flags or {}).get(cand, "")})
        writer.add({**base, "metric": "time_iqr_ms", "value": q75 - q25})
        for i, r in enumerate(rounds):
            gpu = GpuState("nvml", reasons="sw-power-cap" if cand in throttled else "")
            writer.add_round(RoundSamples("rmsnorm", "w", "fwd", cand, "time_median_ms", i + 1, tuple(r), gpu))
    for cand, status in (parity or {}).items():
        writer.add({"op": "rmsnorm", "workload": "w", "mode": "fwd", "candidate": cand, "metric": "parity",
                    "value": 1.0, "status": status})
    writer.close("complete")
    return folder


def _by_candidate(result):
    return result.table.set_index("candidate")


def test_each_verdict_from_samples_and_only_slower_fails(tmp_path):
    base = _report(tmp_path / "base", {"slow": 1.0, "fast": 1.0, "same": 1.0, "unsure": 1.0}, seed=1)
    new = _report(tmp_path / "new", {"slow": 1.10, "fast": 0.90, "same": 1.0, "unsure": (0.99, 1.05, 1.11)},
                  seed=2)
    result = compare_reports(base, new)
    table = _by_candidate(result)
    assert table.verdict.to_dict() == {"slow": SLOWER, "fast": FASTER, "same": SAME, "unsure": INCONCLUSIVE}
    assert set(table.method) == {RANK_TEST} and result.fallback_rows == 0
    assert table.loc["slow", "ratio"] == pytest.approx(1.10, abs=0.01) and table.loc["slow", "low"] > 1.05
    assert table.loc["slow", "p"] < 1e-10 and "above 1.05" in table.loc["slow", "why"]
    assert result.regressions.candidate.tolist() == ["slow"]
    assert result.inconclusive.candidate.tolist() == ["unsure"]
    # A threshold of 15% leaves nothing slower; the 10% change is then inside the band.
    loose = _by_candidate(compare_reports(base, new, threshold=0.15))
    assert loose.loc["slow", "verdict"] == SAME and compare_reports(base, new, threshold=0.15).regressions.empty


def test_a_noisy_row_is_held_to_its_own_spread_between_two_runs(tmp_path):
    """Reps spread by 20% (IQR / median about 27%): 10% slower is within what such a row moves from
    one process to the next; twice as slow is not."""
    noise = {"noisy": 0.2, "doubled": 0.2}
    base = _report(tmp_path / "base", {"noisy": 1.0, "doubled": 1.0}, seed=1, noise=noise)
    new = _report(tmp_path / "new", {"noisy": 1.10, "doubled": 2.0}, seed=2, noise=noise)
    table = _by_candidate(compare_reports(base, new))
    assert table.loc["noisy", "verdict"] in (SAME, INCONCLUSIVE) and table.loc["noisy", "threshold"] > 0.2
    assert "a noisy row: held to its IQR / median" in table.loc["noisy", "why"]
    assert table.loc["doubled", "verdict"] == SLOWER


def test_reports_without_samples_fall_back_to_the_iqr_rule_and_say_so(tmp_path):
    base = _report(tmp_path / "base", {"slow": 1.0, "same": 1.0}, seed=1)
    new = _report(tmp_path / "new", {"slow": 1.10, "same": 1.01}, seed=2)
    (new / SAMPLES_CSV).unlink()  # as a report written before samples were kept
    result = compare_reports(base, new)
    table = _by_candidate(result)
    assert set(table.method) == {IQR_RULE} and result.fallback_rows == 2
    assert table.verdict.to_dict() == {"slow": SLOWER, "same": SAME}
    assert table.low.isna().all() and "no samples in NEW" in table.loc["slow", "why"]


def test_throttled_rows_get_no_speed_verdict(tmp_path):
    base = _report(tmp_path / "base", {"a": 1.0, "b": 1.0}, seed=1)
    new = _report(tmp_path / "new", {"a": 1.10, "b": 1.0}, seed=2, flags={"a": "throttled"}, throttled=("a",))
    table = _by_candidate(compare_reports(base, new))
    assert table.loc["a", "verdict"] == INCONCLUSIVE and "held down by power or heat in NEW" in table.loc["a", "why"]
    assert table.loc["b", "verdict"] == SAME


def test_a_parity_break_is_broken_and_fails(tmp_path):
    base = _report(tmp_path / "base", {"a": 1.0}, seed=1, parity={"a": "pass"})
    new = _report(tmp_path / "new", {"a": 1.0}, seed=2, parity={"a": "fail"})
    result = compare_reports(base, new)
    assert result.regressions.verdict.tolist() == [BROKEN]
    assert "parity pass -> fail" in result.regressions.why.iloc[0]


def test_same_commit_twice_is_never_slower(tmp_path):
    levels = {f"c{i}": 10 ** (i / 4 - 1) for i in range(12)}
    base = _report(tmp_path / "base", levels, seed=10)
    new = _report(tmp_path / "new", levels, seed=11, offsets=(0.004, -0.003, 0.001))
    table = compare_reports(base, new).table
    assert (table.verdict == SAME).all(), table[["candidate", "ratio", "low", "high", "verdict"]]
    assert pd.api.types.is_float_dtype(table["p"])

