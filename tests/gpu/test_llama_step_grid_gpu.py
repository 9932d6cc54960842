"""llama-step on the GPU with a model written as a spec: the CUDA-graph candidates (torch.compile
mode="reduce-overhead") time and pass parity, each candidate's ratio is to the torch layers run
the same way with its per-round spread, and the step's peak memory covers its weights."""

import pytest

from kernelbench.harness.runner import PlanItem, run_benchmarks, run_parity
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops import get_op
from kernelbench.ops.llama_step import parse_workload

pytestmark = pytest.mark.gpu

CANDIDATES = ["torch-eager", "torch-compile", "torch-cudagraphs", "kernelbench-eager", "kernelbench-compile",
              "kernelbench-cudagraphs"]
WORKLOAD = "hidden=256,layers=2,heads=4,kv_heads=2,intermediate=512,vocab=1000@2x128:bf16"


class Rows(list):
    def add(self, row):
        self.append(row)


def test_every_mode_times_against_its_own_torch_anchor():
    op = get_op("llama-step")
    workload = parse_workload(WORKLOAD)
    rows = Rows()
    plan = [PlanItem(op, [op.get_candidate(c) for c in CANDIDATES], [workload], ["fwd+bwd"])]
    summary = run_benchmarks(plan, "cuda", rows, timing=TimingConfig(warmup_ms=5, rep_ms=60), rounds=3)
    assert summary.errors == 0, [r["message"] for r in rows if r["status"] == "error"]
    by = {(r["candidate"], r["metric"]): r for r in rows}
    for cand, anchor in (("kernelbench-eager", "torch-eager"), ("kernelbench-compile", "torch-compile"),
                         ("kernelbench-cudagraphs", "torch-cudagraphs")):
        ratio = by[(cand, "ratio_vs_anchor")]
        assert f"median of {anchor} in the same run" in ratio["message"]
        low, high = by[(cand, "ratio_round_min")]["value"], by[(cand, "ratio_round_max")]["value"]
        assert 0 < low <= high
        assert ("straddles-1.0" in ratio["flags"]) == (low < 1.0 < high)
    cfg = workload.spec["config"]
    weights = 2 * (cfg["vocab_size"] * cfg["hidden"] * 2)  # bf16 embedding and head, a floor
    for cand in CANDIDATES:
        assert by[(cand, "peak_mem_bytes")]["value"] > weights
        assert by[(cand, "peak_mem_requested_bytes")]["value"] > weights
        assert by[(cand, "tokens_per_s")]["value"] > 0


def test_cuda_graph_candidates_pass_parity():
    op = get_op("llama-step")
    rows = Rows()
    plan = [PlanItem(op, [op.get_candidate(c) for c in ("torch-cudagraphs", "kernelbench-cudagraphs")],
                     [parse_workload(WORKLOAD)], ["fwd+bwd", "train"])]
    summary = run_parity(plan, "cuda", rows, steps=2)
    assert summary.parity_checks == 4 and summary.parity_failures == 0, summary.failures
