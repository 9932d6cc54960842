"""Per-rep samples beside results.csv: written as the run goes, read back by pandas, small enough
for a CI suite; and the test-only slowdown hook that the GPU proof uses."""

import gzip
import time

import numpy as np
import pandas as pd
import pytest

from kernelbench.harness import slowdown
from kernelbench.harness.gpustate import GpuState
from kernelbench.harness.rows import RoundSamples
from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops import get_op
from kernelbench.ops.base import UsageError
from kernelbench.report.samples import ROUNDS_CSV, SAMPLE_COLUMNS, SAMPLES_CSV, load_rounds, load_samples
from kernelbench.report.writer import ReportError, ReportWriter, load_report


def _round(candidate, rnd, times, gpu=None, metric="time_median_ms"):
    return RoundSamples("adamw", "tiny", "step", candidate, metric, rnd, tuple(times), gpu)


def test_samples_and_rounds_read_back_with_pandas(tmp_path):
    writer = ReportWriter(tmp_path, {}, "run")
    assert not (tmp_path / SAMPLES_CSV).exists()  # files appear with the first round
    writer.add_round(_round("a", 1, [1.234567, 1.25, 1.3], GpuState("nvml", sm_mhz=1980, reasons="sw-power-cap")))
    writer.samples.flush()  # one gzip member now, another at close: read as one file
    writer.add_round(_round("a", 2, [1.2, 1.21]))
    writer.add_round(_round("b", 1, [0.5], metric="host_per_call_ms"))
    writer.close("complete")
    with gzip.open(tmp_path / SAMPLES_CSV, "rt") as fh:
        assert fh.readline().strip() == ",".join(SAMPLE_COLUMNS)
    samples = pd.read_csv(tmp_path / SAMPLES_CSV)
    assert list(samples.columns) == SAMPLE_COLUMNS and len(samples) == 6
    assert samples["ms"].tolist() == [1.2346, 1.25, 1.3, 1.2, 1.21, 0.5]  # 5 significant digits, in order
    assert samples["round"].tolist() == [1, 1, 1, 2, 2, 1]
    assert load_samples(tmp_path).equals(samples.astype({"op": str}))
    rounds = load_rounds(tmp_path)
    first = rounds.iloc[0]
    assert (first.reps, first.median_ms, first.min_ms, first.gpu_sm_mhz) == (3, 1.25, 1.2346, 1980)
    assert bool(first.gpu_throttled) and rounds.gpu_source.isna().tolist() == [False, True, True]
    meta, _ = load_report(tmp_path)
    assert meta["summary"]["samples_file"] == SAMPLES_CSV and meta["summary"]["reps"] == 6
    assert meta["summary"]["throttled_rows"] == ["adamw/tiny/step/a"]
    assert "samples.csv.gz" in (tmp_path / "summary.md").read_text()


def test_a_damaged_samples_file_is_one_clear_error(tmp_path):
    writer = ReportWriter(tmp_path, {}, "run")
    writer.add_round(_round("a", 1, [1.0 + i / 1000 for i in range(2000)]))
    writer.close("complete")
    data = (tmp_path / SAMPLES_CSV).read_bytes()
    (tmp_path / SAMPLES_CSV).write_bytes(data[: len(data) // 2])
    with pytest.raises(ReportError, match="samples.csv.gz: cut short"):
        load_samples(tmp_path)
    (tmp_path / SAMPLES_CSV).write_bytes(gzip.compress(b"op,ms\nadamw,1.0\n"))
    with pytest.raises(ReportError, match="no column workload"):
        load_samples(tmp_path)


def test_a_report_without_samples_reads_as_none(tmp_path):
    ReportWriter(tmp_path, {}, "parity").close("complete")
    assert load_samples(tmp_path) is None and load_rounds(tmp_path) is None


def test_a_ci_suite_of_samples_stays_small(tmp_path):
    """The CI suite times 63 rows in 3 rounds of 100 ms / 3 each, at most 333 reps a round (about
    17,500 reps on an H100); its samples file must leave the report well under 1 MB."""
    rng = np.random.default_rng(0)
    writer = ReportWriter(tmp_path, {}, "run")
    total = 0
    for row in range(63):
        median = 10 ** rng.uniform(-1.4, 1.3)  # 0.04 .. 20 ms, as the suite's rows
        reps = int(min(333, max(3, 100 / 3 / median)))
        for rnd in range(1, 4):
            times = median * (1 + 0.02 * rng.standard_normal(reps))
            writer.add_round(RoundSamples("op", "w", "fwd", f"c{row}", "time_median_ms", rnd, tuple(times)))
            total += reps
        if row % 8 == 7:
            writer.samples.flush()  # a flush every few seconds of a real run
    writer.close("complete")
    size = (tmp_path / SAMPLES_CSV).stat().st_size + (tmp_path / ROUNDS_CSV).stat().st_size
    assert total > 15_000
    assert size < 120_000, f"{total} reps took {size} bytes"


# -- the test-only slowdown hook ----------------------------------------------------------------
def test_slowdown_spec_parsing_and_matching():
    env = {slowdown.ENV: "rmsnorm/triton=0.05, adamw/tiny/step/torch-forloop=0.5"}
    assert slowdown.requested("rmsnorm", "any", "fwd", "triton", env) == 0.05
    assert slowdown.requested("adamw", "tiny", "step", "torch-forloop", env) == 0.5
    assert slowdown.requested("adamw", "other", "step", "torch-forloop", env) is None
    assert slowdown.requested("rmsnorm", "any", "fwd", "liger", {}) is None
    for bad in ("rmsnorm=0.05", "rmsnorm/triton=fast", "rmsnorm/triton=-1", "a/b/c=1"):
        with pytest.raises(UsageError, match="OP/CANDIDATE=FRACTION"):
            slowdown.parse(bad)


def test_slowdown_adds_the_asked_fraction_on_the_cpu():
    """A busy wait to a deadline never ends early: the bounds below hold on any machine, however
    loaded (the magnitude on a GPU: tests/gpu/test_gpustate_gpu.py)."""
    calls = []

    def two_ms():
        calls.append(1)
        end = time.perf_counter() + 2e-3
        while time.perf_counter() < end:
            pass

    run, delay = slowdown.slowed(two_ms, lambda: None, 0.5, "cpu")
    assert delay >= 1.0  # half a median of calls that each take 2 ms or more
    before = len(calls)
    t0 = time.perf_counter()
    run()
    assert (time.perf_counter() - t0) * 1e3 >= 2.0 + delay and len(calls) == before + 1


def test_the_runner_marks_a_slowed_row(monkeypatch, tmp_path):
    monkeypatch.setenv(slowdown.ENV, "adamw/torch-forloop=0.2")
    op = get_op("adamw")
    writer = ReportWriter(tmp_path, {}, "run")
    plan = [PlanItem(op, [op.get_candidate("torch-forloop"), op.get_candidate("torch-foreach")],
                     [op.workload("tiny")], ["step"])]
    run_benchmarks(plan, "cpu", writer, timing=TimingConfig(warmup_ms=1, rep_ms=6, min_reps=2), rounds=1)
    writer.close("complete")
    rows = pd.read_csv(tmp_path / "results.csv")
    delay = rows[rows.metric == "test_slowdown_ms"]
    assert delay.candidate.tolist() == ["torch-forloop"] and delay.value.iloc[0] > 0
    assert "a test, not a result" in delay.message.iloc[0]
    flags = rows[rows.metric == "time_median_ms"].set_index("candidate")["flags"].fillna("")
    assert "test-slowdown" in flags["torch-forloop"] and "test-slowdown" not in flags["torch-foreach"]
    monkeypatch.setenv(slowdown.ENV, "adamw=0.2")
    with pytest.raises(UsageError):
        run_benchmarks(plan, "cpu", writer, timing=TimingConfig(warmup_ms=1, rep_ms=6, min_reps=2), rounds=1)
