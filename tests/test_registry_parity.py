"""One parity check per registered (candidate, CPU workload, mode): a candidate is tested the
moment it registers. Candidates that need CUDA are checked on the GPU machine instead (the
`ci.toml` suite), and anchors that compute another algorithm (parity=False) are not compared."""

import pytest

from kernelbench.harness.runner import PlanItem, run_parity
from kernelbench.ops import load_all

STEPS = 2


def _cases():
    for op in load_all().values():
        for cand in op.candidates.values():
            if not cand.parity or cand.name == op.reference or cand.requires.unmet("cpu"):
                continue
            for workload in op.workloads_for("cpu"):
                for mode in op.modes():
                    yield pytest.param(op, cand, workload, mode, id=f"{op.name}/{cand.name}/{workload.name}/{mode}")


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


@pytest.mark.parametrize("op, cand, workload, mode", list(_cases()))
def test_candidate_matches_reference(op, cand, workload, mode):
    sink = Rows()
    run_parity([PlanItem(op, [cand], [workload], [mode])], "cpu", sink, steps=STEPS)
    (check,) = [r for r in sink.rows if r["metric"] == "parity"]
    assert check["status"] == "pass", check["message"]
    compared = [r for r in sink.rows if r["metric"] == "parity_max_abs"]
    assert compared, "no tensor was compared"
