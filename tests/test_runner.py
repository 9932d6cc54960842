"""The harness's robustness: a failing candidate becomes an error row, the others still run,
and rows reach the report file as they are produced."""

import pandas as pd
import pytest
import torch

from kernelbench.harness.runner import PlanItem, run_benchmarks, run_parity
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops.base import REGISTRY, Workload
from kernelbench.ops.function_op import FunctionOp
from kernelbench.report.writer import ReportWriter

FAST = TimingConfig(warmup_ms=1, rep_ms=3, min_reps=2)


def _doubling_op(name: str, n: int, seed: int) -> FunctionOp:
    """A throwaway op, x * 2 over n elements, for its candidates to be added to."""
    return FunctionOp(
        name,
        doc="x * 2",
        workloads=[Workload("w", "cpu", {"n": n}, seed=seed)],
        make_inputs=lambda w, device, gen: {"x": torch.randn(w.spec["n"], generator=gen, device=device)},
        reference=lambda x: x * 2,
        outputs=("y",),
    )


@pytest.fixture
def scratch_op():
    """A throwaway op with a good, a raising and an out-of-memory candidate."""
    op = _doubling_op("scratch-double", 64, 5)

    @op.candidate("good")
    def good():
        return lambda x: x + x

    @op.candidate("raises")
    def raises():
        def fn(x):
            raise RuntimeError("kernel exploded")
        return fn

    @op.candidate("oom")
    def oom():
        def fn(x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return fn

    @op.candidate("wrong")
    def wrong():
        return lambda x: x * 2.001

    yield op
    del REGISTRY[op.name]


class ListSink:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_failing_candidates_get_error_rows_and_the_others_run(scratch_op):
    sink = ListSink()
    plan = [PlanItem(scratch_op, list(scratch_op.candidates.values()), list(scratch_op.workloads.values()), ["fwd"])]
    summary = run_benchmarks(plan, "cpu", sink, timing=FAST, rounds=2)
    medians = {r["candidate"]: r for r in sink.rows if r["metric"] == "time_median_ms"}
    assert medians["good"]["status"] == "ok" and medians["good"]["value"] > 0
    assert medians["wrong"]["status"] == "ok"
    assert medians["raises"]["status"] == "error" and "kernel exploded" in medians["raises"]["message"]
    assert medians["oom"]["status"] == "error" and medians["oom"]["message"].startswith("out of memory")
    assert summary.errors == 2 and summary.measured == 2


def test_parity_failure_names_the_first_failing_step(scratch_op):
    sink = ListSink()
    plan = [PlanItem(scratch_op, [scratch_op.get_candidate(n) for n in ("good", "wrong", "raises")],
                     list(scratch_op.workloads.values()), ["fwd"])]
    summary = run_parity(plan, "cpu", sink, steps=3)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "parity"}
    assert checks["good"]["status"] == "pass"
    assert checks["wrong"]["status"] == "fail" and "y (step 0: 64 of 64 elements outside" in checks["wrong"]["message"]
    assert checks["raises"]["status"] == "error"
    assert summary.parity_failures == 2 and summary.parity_checks == 3
    first = [r for r in sink.rows if r["candidate"] == "wrong" and r["metric"] == "parity_first_failed_step"]
    assert first[0]["value"] == 0


def test_rows_reach_the_csv_before_the_run_ends(tmp_path, scratch_op):
    writer = ReportWriter(tmp_path, {"device": "cpu"}, "run")

    class Boom(Exception):
        pass

    class CrashAfterFirstRow:
        def add(self, row):
            writer.add(row)
            raise Boom

    plan = [PlanItem(scratch_op, [scratch_op.get_candidate("good")], list(scratch_op.workloads.values()), ["fwd"])]
    with pytest.raises(Boom):
        run_benchmarks(plan, "cpu", CrashAfterFirstRow(), timing=FAST, rounds=1)
    rows = pd.read_csv(tmp_path / "results.csv")  # nothing closed the writer: the row is there
    assert len(rows) == 1 and rows.loc[0, "metric"] == "time_median_ms"


def test_interpreted_triton_candidates_are_not_timed(monkeypatch, scratch_op):
    from kernelbench.ops.base import Requires

    scratch_op.candidate("triton", requires=Requires(triton=True))(lambda: (lambda x: x * 2))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sink = ListSink()
    plan = [PlanItem(scratch_op, [scratch_op.get_candidate("triton")], list(scratch_op.workloads.values()), ["fwd"])]
    run_benchmarks(plan, "cpu", sink, timing=FAST)
    (row,) = sink.rows
    assert row["status"] == "not-measured" and row["value"] is None


def test_compile_anchors_get_compiled_code_on_every_shape_of_a_sweep():
    import torch._dynamo.config as dynamo_config

    from kernelbench.ops import get_op

    get_op("rmsnorm").get_candidate("torch-compile").build()
    limit = getattr(dynamo_config, "recompile_limit", None) or dynamo_config.cache_size_limit
    assert limit >= 2 * len(get_op("rmsnorm").workloads)  # a fwd and a fwd+bwd entry per shape


def test_rows_take_only_the_named_statuses_and_keep_the_csv_column_order():
    from kernelbench.harness.rows import ROW_FIELDS, Row

    row = Row("adamw", "tiny", "step", "triton", "time_median_ms", 1.5, "ms")
    assert tuple(row.as_dict()) == ROW_FIELDS and row.as_dict()["status"] == "ok"
    with pytest.raises(ValueError, match="row status 'fine'"):
        Row("adamw", "tiny", "step", "triton", "time_median_ms", status="fine")


# -- settling: untimed interleaved rounds before the timed ones ----------------------------------
@pytest.fixture
def pair_op():
    """Two candidates; "flaky" raises from its fourth call on (its first is the harness's setup)."""
    op = _doubling_op("scratch-pair", 8, 1)
    calls = {"flaky": 0}

    @op.candidate("steady")
    def steady():
        return lambda x: x + x

    @op.candidate("flaky")
    def flaky():
        def fn(x):
            calls["flaky"] += 1
            if calls["flaky"] >= 4:
                raise RuntimeError("clock fell over")
            return x + x
        return fn

    yield op
    del REGISTRY[op.name]


def _fake_timer(monkeypatch, log):
    """Every timed round of any candidate: one call, reported as 5 reps of 2 ms (10 ms a round)."""
    from kernelbench.harness import runner
    from kernelbench.harness.timing import Sample

    def timer(fn, prepare, config):
        prepare()
        fn()
        log.append(fn)
        return Sample([2.0] * 5, "fake clock", 0.0)

    monkeypatch.setattr(runner, "time_cpu", timer)


def _median_rows(sink):
    return {r["candidate"]: r for r in sink.rows if r["metric"] == "time_median_ms"}


def test_settling_runs_untimed_rounds_until_the_candidates_have_run_that_long(monkeypatch, pair_op):
    log = []
    _fake_timer(monkeypatch, log)
    steady = pair_op.get_candidate("steady")
    sink = ListSink()
    # 10 ms a round: 25 ms of settling takes three rounds (10, 20, then 30 ms).
    run_benchmarks([PlanItem(pair_op, [steady], pair_op.workloads.values(), ["fwd"])], "cpu", sink,
                   timing=TimingConfig(warmup_ms=1, rep_ms=3, min_reps=2, settle_ms=25), rounds=3)
    assert len(log) == 3 + 3  # the settling rounds, then the timed ones
    row = _median_rows(sink)["steady"]
    assert row["status"] == "ok" and "after 3 untimed settling rounds" in row["message"]
    reps = [r for r in sink.rows if r["metric"] == "reps"]
    assert reps and all(r["value"] == 15 for r in reps)  # 3 timed rounds of 5: none of the settling ones


def test_without_settling_only_the_timed_rounds_run(monkeypatch, pair_op):
    log = []
    _fake_timer(monkeypatch, log)
    steady = pair_op.get_candidate("steady")
    sink = ListSink()
    run_benchmarks([PlanItem(pair_op, [steady], pair_op.workloads.values(), ["fwd"])], "cpu", sink,
                   timing=TimingConfig(warmup_ms=1, rep_ms=3, min_reps=2), rounds=3)
    assert len(log) == 3 and "settling" not in _median_rows(sink)["steady"]["message"]


def test_a_candidate_failing_while_settling_gets_its_error_row_and_the_other_is_timed(monkeypatch, pair_op):
    log = []
    _fake_timer(monkeypatch, log)
    sink = ListSink()
    run_benchmarks([PlanItem(pair_op, [pair_op.get_candidate("steady"), pair_op.get_candidate("flaky")],
                             pair_op.workloads.values(), ["fwd"])], "cpu", sink,
                   timing=TimingConfig(warmup_ms=1, rep_ms=3, min_reps=2, settle_ms=1000), rounds=2)
    rows = _median_rows(sink)
    assert rows["flaky"]["status"] == "error" and "clock fell over" in rows["flaky"]["message"]
    assert rows["steady"]["status"] == "ok" and rows["steady"]["value"] == pytest.approx(2.0)
