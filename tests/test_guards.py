"""Candidates that game the check are caught, with a verdict that says how: a plugin of broken
RMSNorm candidates (tests/plugins/broken_rmsnorm.py) under parity and under timing. The side-stream
one needs CUDA: tests/gpu/test_guards_gpu.py runs the same checks there."""

from pathlib import Path

import pytest
import torch

from kernelbench.harness.parity import TRIVIAL_MARGIN, compare_tensors
from kernelbench.harness.runner import PlanItem, run_benchmarks, run_parity
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops import get_op, plugins

BROKEN = Path(__file__).parent / "plugins" / "broken_rmsnorm.py"
FAST = TimingConfig(warmup_ms=1, rep_ms=4, min_reps=2)
# What each broken candidate's verdict must say (parity, and the timed result's check).
VERDICTS = {
    "broken-zeros": "no better than an all-zero output",
    "broken-identity": "'y' is its input 'x' returned unchanged",
    "broken-cached": "matches the reference of the previous inputs, not of these: a cached or stale result",
    "broken-mutates-input": "modified its input 'x': the op declares no in-place output",
}


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


@pytest.fixture
def broken(registry_sandbox):
    plugin = plugins.load(str(BROKEN))
    assert plugin.error is None, plugin.error
    return get_op("rmsnorm")


def _plan(op, names, workload="64x256-fp32"):
    return [PlanItem(op, [op.get_candidate(n) for n in names], [op.workload(workload)], ["fwd"])]


def test_parity_fails_each_broken_candidate_saying_how(broken):
    sink = Rows()
    summary = run_parity(_plan(broken, ["torch-eager", *VERDICTS]), "cpu", sink, steps=2)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "parity"}
    assert checks["torch-eager"]["status"] == "pass", checks["torch-eager"]["message"]
    for name, verdict in VERDICTS.items():
        assert checks[name]["status"] == "fail" and verdict in checks[name]["message"], (name, checks[name]["message"])
        assert checks[name]["source"] == f"plugin:{BROKEN}"
    assert sorted(summary.failures) == sorted(f"rmsnorm/64x256-fp32/fwd/{n}" for n in VERDICTS)
    guards = {r["candidate"] for r in sink.rows if r["metric"] == "parity_guard"}
    assert guards == set(VERDICTS) - {"broken-zeros"}  # zeros is the comparison's own verdict


def test_timing_fails_each_broken_candidate_and_marks_its_time(broken):
    sink = Rows()
    summary = run_benchmarks(_plan(broken, ["torch-eager", *VERDICTS]), "cpu", sink, timing=FAST, rounds=2)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "output_check"}
    times = {r["candidate"]: r for r in sink.rows if r["metric"] == "time_median_ms"}
    assert checks["torch-eager"]["status"] == "pass"
    assert "fresh inputs each of 2 rounds" in checks["torch-eager"]["message"]
    assert times["torch-eager"]["status"] == "ok"
    for name, verdict in VERDICTS.items():
        assert checks[name]["status"] == "fail" and verdict in checks[name]["message"], (name, checks[name]["message"])
        assert times[name]["status"] == "suspect" and "wrong-output" in times[name]["flags"]
        assert times[name]["message"].startswith("the timed calls' result is not one")
    assert sorted(summary.failures) == sorted(f"rmsnorm/64x256-fp32/fwd/{n} (timed result)" for n in VERDICTS)


def test_a_timed_result_that_is_not_one_fails_the_run_apart_from_parity(broken, tmp_path):
    """The session's outcome names it (exit 1 in the CLI), the tally counts it, junit.xml lists it."""
    from kernelbench.session import Entry, OutputSettings, RunRequest, Session, Status

    entry = Entry("rmsnorm", ["64x256-fp32"], ["torch-eager", "broken-zeros"], ["fwd"])
    outcome = Session().run(RunRequest("run", "rmsnorm", bench=(entry,), device="cpu", timing=FAST,
                                       output=OutputSettings(tmp_path)))
    assert outcome.status is Status.PARITY_FAILED
    assert outcome.message == "a timed result is not one: rmsnorm/64x256-fp32/fwd/broken-zeros"
    assert outcome.tally.line() == "1 ok, 1 failed, 0 skipped, 1 suspect"
    junit = (tmp_path / "junit.xml").read_text()
    assert 'classname="kernelbench.timed-result.rmsnorm" name="64x256-fp32/fwd/broken-zeros"><failure' in junit


def test_the_check_uses_inputs_other_than_the_timed_ones(broken):
    """Even with one round, the checked call sees inputs the timed calls did not: a result
    computed once and returned since is named as what it is."""
    sink = Rows()
    run_benchmarks(_plan(broken, ["broken-cached", "torch-eager"]), "cpu", sink, timing=FAST, rounds=1)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "output_check"}
    assert checks["torch-eager"]["status"] == "pass" and checks["torch-eager"]["message"].startswith("one round")
    assert checks["broken-cached"]["status"] == "fail"
    assert "round 0: 'y' matches the reference of the previous inputs" in checks["broken-cached"]["message"]


def test_declared_in_place_outputs_may_be_overwritten(registry_sandbox):
    """swiglu declares gate and up as in-place outputs (liger writes its gradients there): a
    candidate that overwrites them passes; one that overwrites anything else would not."""
    op = get_op("swiglu")

    @op.candidate("writes-gate")
    def writes_gate():
        def fn(gate, up):
            out = torch.nn.functional.silu(gate) * up
            with torch.no_grad():
                gate.zero_()
            return out
        return fn

    sink = Rows()
    run_parity(_plan(op, ["writes-gate"], "4x64-fp32"), "cpu", sink, steps=1)
    assert [r["status"] for r in sink.rows if r["metric"] == "parity"] == ["pass"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_zeros_inside_a_loose_atol_still_fail(dtype):
    """Small results (gradients ~1e-4) sit inside bf16's atol of 1e-2: element-wise, zeros pass;
    against the all-zero baseline they do not, while a rounded result does."""
    ref = 1e-4 * torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    zeros = compare_tensors("g", ref, torch.zeros(1000, dtype=dtype), atol=1e-2, rtol=1e-2)
    assert zeros.n_outside == 0 and not zeros.beats_zero and not zeros.passed
    assert "no better than an all-zero output" in zeros.why and f"{TRIVIAL_MARGIN:g}x" in zeros.why
    rounded = compare_tensors("g", ref, ref.to(dtype), atol=1e-2, rtol=1e-2)
    assert rounded.passed and rounded.rel_fro < 1e-2
    # an all-zero reference (a gradient that is zero) is no reason to fail
    assert compare_tensors("g", torch.zeros(4), torch.zeros(4), atol=0, rtol=0).passed
