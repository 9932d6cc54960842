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


def test_cuda_graphs_at_the_layers_defaults_fuse_the_loss_and_pass_parity():
    from kernelbench.nn.linear_crossentropy import fusing_pays

    op = get_op("llama-step")
    workload = parse_workload("hidden=256,layers=1,heads=4,kv_heads=2,intermediate=512,vocab=32768@8x1024:bf16")
    assert fusing_pays(8 * 1024, 32768)  # the head and loss run as one op, captured in the graph
    rows = Rows()
    plan = [PlanItem(op, [op.get_candidate("kernelbench-cudagraphs+auto")], [workload], ["fwd+bwd"])]
    summary = run_parity(plan, "cuda", rows, steps=2)
    assert summary.parity_checks == 1 and summary.parity_failures == 0, summary.failures


def test_auto_candidates_name_the_choices_their_step_ran(tmp_path, monkeypatch):
    from kernelbench.nn.autoselect import clear_memory_cache

    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))  # measured here, not read from a file
    clear_memory_cache()
    op = get_op("llama-step")
    rows = Rows()
    plan = [PlanItem(op, [op.get_candidate(c) for c in ("kernelbench-eager+auto", "kernelbench-compile+auto")],
                     [parse_workload(WORKLOAD)], ["fwd+bwd"])]
    summary = run_benchmarks(plan, "cuda", rows, timing=TimingConfig(warmup_ms=5, rep_ms=60), rounds=2)
    assert summary.errors == 0, [r["message"] for r in rows if r["status"] == "error"]
    by = {(r["candidate"], r["metric"]): r for r in rows}
    eager, compiled = (by[(c, "auto_triton_choices")] for c in ("kernelbench-eager+auto", "kernelbench-compile+auto"))
    for row in (eager, compiled):
        assert row["message"].startswith("of 4 impl='auto' choices")  # two norms, rotary, SwiGLU
        for op_name in ("rmsnorm 2x128x256", "rmsnorm residual 2x128x256", "rotary half-bhsd", "swiglu 2x128x512"):
            assert op_name in row["message"]
    # The compiled step runs rotary as torch's traced formula, whatever its eager calls chose.
    assert "rotary half-bhsd 2x4x2x128x64x64 bfloat16 fwd+bwd: torch (traced; eager " in compiled["message"]
    rotary_eager = "triton" if "rotary half-bhsd 2x4x2x128x64x64 bfloat16 fwd+bwd: triton" in eager["message"] else ""
    assert compiled["value"] == eager["value"] - (1 if rotary_eager else 0)
    clear_memory_cache()
