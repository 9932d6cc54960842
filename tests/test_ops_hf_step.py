"""hf-step: the throughput row, the FLOP model, parity kept to few tokens, and the one-line reason
when transformers is missing; parity of every candidate runs in test_registry_parity."""

import re

import pytest

from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops import base, get_op
from kernelbench.ops.hf_step import PARITY_MAX_TOKENS, hf_config


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_step_reports_throughput():
    pytest.importorskip("transformers", reason="transformers (an optional peer) is not installed")
    op = get_op("hf-step")
    workload = op.workload("hf-tiny")
    sink = Rows()
    plan = [PlanItem(op, [op.get_candidate("hf-eager")], [workload], ["fwd+bwd"])]
    run_benchmarks(plan, "cpu", sink, timing=TimingConfig(warmup_ms=1, rep_ms=1, min_reps=3), rounds=1)
    value = {r["metric"]: r["value"] for r in sink.rows}
    tokens = workload.spec["batch"] * workload.spec["seq"]
    assert value["tokens_per_s"] == pytest.approx(tokens / (value["time_median_ms"] * 1e-3), rel=1e-9)


def test_flop_model_counts_matmuls_tied_head_and_causal_attention():
    op = get_op("hf-step")
    workload = op.workload("hf-qwen2.5-0.5b-layer4")
    family, cfg = hf_config("qwen2.5-0.5b-layer4")
    d, hd, layers, tokens, seq = 896, 64, 4, 4 * 2048, 2048
    per_layer = d * hd * (2 * 14 + 2 * 2) + 3 * d * 4864
    want = 6 * (layers * per_layer + 151936 * d) * tokens + 6 * layers * seq * d * tokens
    assert family == "Qwen2" and cfg["hidden_size"] == d and cfg["intermediate_size"] == 4864
    assert op.flops(workload, op.get_candidate("hf-eager"), "fwd+bwd") == want


def test_parity_runs_on_few_tokens_only():
    op = get_op("hf-step")
    timed = [w for w in op.workloads_for("gpu") if not w.name.endswith("-parity")]
    assert timed
    for workload in timed:
        assert workload.spec["batch"] * workload.spec["seq"] > PARITY_MAX_TOKENS
        with pytest.raises(ValueError, match=re.escape(f"{workload.name}-parity")):
            op.make_reference_case(workload, "cpu", "fwd+bwd")
        twin = op.workload(f"{workload.name}-parity")
        assert twin.spec["config"] == workload.spec["config"]
        assert twin.spec["batch"] * twin.spec["seq"] <= PARITY_MAX_TOKENS


def test_missing_transformers_is_one_line_per_candidate(monkeypatch):
    monkeypatch.setattr(base, "package_available", lambda name: name != "transformers")
    op = get_op("hf-step")
    for name in ("hf-eager", "hf-compile", "kernelbench-eager", "kernelbench-compile", "liger-eager"):
        assert op.get_candidate(name).requires.unmet("cpu") == "transformers not installed"
