"""On the GPU, the broken candidates of tests/plugins/broken_rmsnorm.py are caught as on the CPU,
and so is the one that only a GPU can have: a result written on a side stream that the caller's
stream never waits for (its CUDA events time nothing). kernelbench's own candidates pass the same
checks."""

from pathlib import Path

import pytest

from kernelbench.harness.runner import PlanItem, run_benchmarks, run_parity
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops import get_op, plugins
from kernelbench.session.plan import resolve_workload

pytestmark = pytest.mark.gpu

BROKEN = Path(__file__).parents[1] / "plugins" / "broken_rmsnorm.py"
VERDICTS = {
    "broken-zeros": "no better than an all-zero output",
    "broken-identity": "'y' is its input 'x' returned unchanged",
    "broken-cached": "a cached or stale result",
    "broken-mutates-input": "modified its input 'x'",
    "broken-side-stream": "changed after the call returned: written on a stream the caller's stream does not wait for",
}
GOOD = ["torch-eager", "triton"]
WORKLOAD = "4096x4096:bf16"


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


@pytest.fixture
def rmsnorm(registry_sandbox):
    assert plugins.load(str(BROKEN)).error is None
    op = get_op("rmsnorm")
    candidates = [op.get_candidate(n) for n in GOOD + list(VERDICTS)]
    return [PlanItem(op, candidates, [resolve_workload(op, WORKLOAD)], ["fwd"])]


def test_parity_catches_every_broken_candidate_on_the_gpu(rmsnorm):
    sink = Rows()
    run_parity(rmsnorm, "cuda", sink, steps=3)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "parity"}
    for name in GOOD:
        assert checks[name]["status"] == "pass", checks[name]["message"]
    for name, verdict in VERDICTS.items():
        assert checks[name]["status"] == "fail" and verdict in checks[name]["message"], (name, checks[name]["message"])


def test_timing_catches_every_broken_candidate_on_the_gpu(rmsnorm):
    sink = Rows()
    run_benchmarks(rmsnorm, "cuda", sink, timing=TimingConfig(warmup_ms=5, rep_ms=30), rounds=2)
    checks = {r["candidate"]: r for r in sink.rows if r["metric"] == "output_check"}
    times = {r["candidate"]: r for r in sink.rows if r["metric"] == "time_median_ms"}
    for name in GOOD:
        assert checks[name]["status"] == "pass" and times[name]["status"] == "ok", checks[name]["message"]
    for name, verdict in VERDICTS.items():
        assert checks[name]["status"] == "fail" and verdict in checks[name]["message"], (name, checks[name]["message"])
        assert times[name]["status"] == "suspect" and "wrong-output" in times[name]["flags"]
    # The side stream's time is the launch alone: what the guard exists for.
    side, eager = times["broken-side-stream"]["value"], times["torch-eager"]["value"]
    print(f"side-stream {side:.4f} ms against torch-eager {eager:.4f} ms (CUDA events on the caller's stream)")
