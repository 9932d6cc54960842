"""One parity check per registered (candidate, CPU workload, mode): a candidate is tested the
moment it registers, through kernelbench.testing.assert_parity as a plugin's author would test
theirs. Candidates that need CUDA are checked on the GPU machine instead (the `ci.toml` suite),
and anchors that compute another algorithm (parity=False) are not compared."""

import pytest

from kernelbench.ops import load_all
from kernelbench.testing import assert_parity

STEPS = 2


def _cases():
    for op in load_all().values():
        for cand in op.candidates.values():
            if not cand.parity or cand.name == op.reference or cand.requires.unmet("cpu"):
                continue
            for workload in op.workloads_for("cpu"):
                for mode in op.modes():
                    yield pytest.param(op, cand, workload, mode, id=f"{op.name}/{cand.name}/{workload.name}/{mode}")


@pytest.mark.parametrize("op, cand, workload, mode", list(_cases()))
def test_candidate_matches_reference(op, cand, workload, mode):
    rows = assert_parity(op, cand, workloads=[workload.name], modes=[mode], steps=STEPS, device="cpu")
    assert [r for r in rows if r["metric"] == "parity_max_abs"], "no tensor was compared"
