"""llama-step: the runner's rows for a model step (throughput, the optimizer's share of a train
step) and the FLOP model; parity of every candidate runs in test_registry_parity."""

from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import TimingConfig
from kernelbench.models import CONFIGS
from kernelbench.ops import get_op


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_train_mode_reports_throughput_and_optimizer_share():
    op = get_op("llama-step")
    workload = op.workload("llama-tiny")
    sink = Rows()
    plan = [PlanItem(op, [op.get_candidate("torch-eager")], [workload], ["fwd+bwd", "train"])]
    run_benchmarks(plan, "cpu", sink, timing=TimingConfig(warmup_ms=1, rep_ms=1, min_reps=3), rounds=1)
    value = {(r["mode"], r["metric"]): r["value"] for r in sink.rows}
    tokens = workload.spec["batch"] * workload.spec["seq"]
    for mode in ("fwd+bwd", "train"):
        assert (
            abs(value[(mode, "tokens_per_s")] - tokens / (value[(mode, "time_median_ms")] * 1e-3)) < 1e-6 * tokens * 1e3
        )
    assert 0 < value[("train", "optimizer_share")] < 1
    assert (
        abs(value[("train", "optimizer_share")] * value[("train", "time_median_ms")] - value[("train", "optimizer_ms")])
        < 1e-9
    )
    assert ("fwd+bwd", "optimizer_ms") not in value


def test_flop_model_counts_matmuls_and_causal_attention():
    op = get_op("llama-step")
    workload = op.workload("llama-1b-layer4")
    cfg = CONFIGS["llama-1b-layer4"]
    d, hd, layers, tokens, seq = cfg.hidden, cfg.head_dim, cfg.n_layers, 4 * 2048, 2048
    per_layer = d * hd * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * d * cfg.intermediate
    matmul = layers * per_layer + cfg.vocab_size * d  # lm_head; the embedding is a lookup
    want = 6 * matmul * tokens + 6 * layers * seq * d * tokens
    assert op.flops(workload, op.get_candidate("torch-eager"), "fwd+bwd") == want
