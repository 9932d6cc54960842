"""The model grid: its shapes, the spec and token parsers, llama-step's workloads made from it,
and the runner's per-round ratio spread against each candidate's own anchor."""

import subprocess
import sys

import pytest
import torch

from kernelbench.config import configs_dir, load_suite
from kernelbench.harness import runner as runner_module
from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import Sample, TimingConfig
from kernelbench.models import CONFIGS, GRID, Llama
from kernelbench.models.grid import SPEC_KEYS, model_config, parse_model_spec, parse_tokens
from kernelbench.ops import get_op
from kernelbench.ops.base import REGISTRY, UsageError, Workload
from kernelbench.ops.function_op import FunctionOp
from kernelbench.ops.llama_step import model_workload_texts, parse_workload

# name -> (hidden, heads, kv_heads, intermediate, vocab, layers, batch, seq): the families' shapes.
EXPECTED = {
    "smollm-135m-layer4": (576, 9, 3, 1536, 49152, 4, 8, 2048),
    "qwen2.5-0.5b-layer4": (896, 14, 2, 4864, 151936, 4, 4, 2048),
    "qwen2.5-1.5b-layer4": (1536, 12, 2, 8960, 151936, 4, 2, 4096),
    "llama-3.2-1b-layer4": (2048, 32, 8, 8192, 128256, 4, 4, 2048),
    "llama-3.2-1b-layer4-1x512": (2048, 32, 8, 8192, 128256, 4, 1, 512),
    "llama-3-8b-layer2": (4096, 32, 8, 14336, 128256, 2, 1, 4096),
    "llama-1b-layer4": (2048, 16, 8, 8192, 32000, 4, 4, 2048),
    "llama-7m": (256, 8, 4, 768, 4096, 6, 8, 512),
}
SMALL_SPEC = "hidden=64,layers=1,heads=4,kv_heads=2,intermediate=96,vocab=100"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_grid_rows_have_the_families_shapes(name):
    row = {r.name: r for r in GRID}[name]
    c = row.config
    assert (c.hidden, c.n_heads, c.n_kv_heads, c.intermediate, c.vocab_size, c.n_layers, row.batch, row.seq) \
        == EXPECTED[name]
    assert row.seq <= c.max_seq


def test_llama_step_workloads_are_the_grid():
    op = get_op("llama-step")
    assert set(op.workloads) == {row.name for row in GRID} == set(CONFIGS)
    for row in GRID:
        w = op.workloads[row.name]
        assert (w.spec["batch"], w.spec["seq"], w.tier) == (row.batch, row.seq, row.tier)
        assert model_config(row.name) == row.config


def test_grid_imports_without_torch():
    code = ("import sys; import kernelbench.models.grid, kernelbench.ops.llama_step; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_spec_parses_every_key():
    cfg = parse_model_spec(SMALL_SPEC + ",rope_theta=500000,eps=1e-5,tie=1,max_seq=32")
    assert (cfg.hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.intermediate, cfg.vocab_size) == \
        (64, 1, 4, 2, 96, 100)
    assert (cfg.rope_theta, cfg.eps, cfg.tie_embeddings, cfg.max_seq) == (500000.0, 1e-5, True, 32)


@pytest.mark.parametrize("text, words", [
    ("hidden=64,layers=2", "missing heads, kv_heads, intermediate, vocab"),
    (SMALL_SPEC + ",dim=3", "unknown key 'dim'"),
    (SMALL_SPEC.replace("layers=1", "layers=two"), "layers=two is not an integer"),
    (SMALL_SPEC + ",tie=yes", "tie=yes is not 0 or 1"),
    (SMALL_SPEC.replace("heads=4", "heads=3"), "not divisible by n_heads 3"),
    (SMALL_SPEC + ",hidden=128", "hidden given twice"),
])
def test_spec_errors_are_one_line_naming_the_keys(text, words):
    with pytest.raises(ValueError) as info:
        parse_model_spec(text)
    message = str(info.value)
    assert words in message and "\n" not in message
    if "key" in words or "missing" in words:
        assert all(key in message for key in SPEC_KEYS)


@pytest.mark.parametrize("text", ["4", "4x", "x2048", "0x2048", "4x2048x2", "4by2048", "-1x8"])
def test_bad_tokens_are_refused(text):
    with pytest.raises(ValueError, match="expected BATCHxSEQ"):
        parse_tokens(text)


def test_unknown_model_names_the_grid_and_the_spec_form():
    with pytest.raises(ValueError) as info:
        model_config("qwen2.5-0.5b")
    message = str(info.value)
    assert "Did you mean 'qwen2.5-0.5b-layer4'" in message and "hidden=..,layers=.." in message
    assert all(name in message for name in CONFIGS)


def test_workload_text_sets_model_tokens_and_dtype():
    w = parse_workload(f"{SMALL_SPEC}@2x48:fp32")
    assert (w.spec["batch"], w.spec["seq"], w.spec["dtype"]) == (2, 48, "fp32")
    assert w.spec["config"]["max_seq"] == 2048 and w.spec["config"]["hidden"] == 64
    grown = parse_workload("llama-tiny@1x100")  # past llama-tiny's 64 positions: the rotary table grows
    assert grown.spec["config"]["max_seq"] == 100 and grown.spec["dtype"] == "bf16"
    assert parse_workload("no-such-name") is None
    for bad, words in ((f"{SMALL_SPEC}", "needs its tokens"), ("llama-tiny@2x", "expected BATCHxSEQ"),
                       ("llama-tiny@2x8:int8", "dtype 'int8'"), ("llama-tin@2x8", "unknown model")):
        with pytest.raises(UsageError, match=words):
            parse_workload(bad)


def test_model_and_tokens_options_become_workload_texts():
    assert model_workload_texts("llama-step", "llama-7m", None, None) == ["llama-7m"]
    assert model_workload_texts("llama-step", "llama-7m", "2x64", ["llama-tiny"]) == ["llama-tiny", "llama-7m@2x64"]
    assert model_workload_texts("llama-step", None, "2x64", ["llama-tiny", "llama-7m@1x8"]) == \
        ["llama-tiny@2x64", "llama-7m@1x8"]
    assert model_workload_texts("rmsnorm", None, None, ["a"]) == ["a"]
    for args, words in ((("rmsnorm", "llama-7m", None), "llama-step options only"),
                        (("llama-step", None, "2x64"), "--tokens needs --model or -w"),
                        (("llama-step", SMALL_SPEC, None), "needs --tokens"),
                        (("llama-step", "llama-7", None), "--model: unknown model"),
                        (("llama-step", "llama-7m", "2"), "--tokens: 2: expected BATCHxSEQ")):
        with pytest.raises(UsageError, match=words):
            model_workload_texts(*args, None)


def test_a_spec_workload_builds_and_steps_the_model():
    op = get_op("llama-step")
    w = parse_workload(f"{SMALL_SPEC}@2x8:fp32")
    case = op.make_case(op.get_candidate("torch-eager"), w, "cpu", "fwd+bwd")
    case.prepare()
    case.run()
    tensors = case.tensors()
    assert tensors["logits"].shape == (2, 8, 100)
    assert tensors["grad.model.layers.0.mlp.gate_proj.weight"].shape == (96, 64)


def test_tied_grid_models_share_the_head_with_the_embedding():
    tied = [row for row in GRID if row.config.tie_embeddings]
    assert {row.name for row in tied} >= {"smollm-135m-layer4", "qwen2.5-0.5b-layer4", "llama-3.2-1b-layer4"}
    model = Llama(parse_model_spec(SMALL_SPEC + ",tie=1"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == model.config.n_params()


def test_anchors_are_the_torch_layers_compiled_the_same_way():
    op = get_op("llama-step")
    anchors = {name: op.anchor_for(name) for name in op.candidates}
    assert anchors["kernelbench-eager"] == anchors["liger"] == "torch-eager"
    assert anchors["kernelbench-compile"] == anchors["kernelbench-compile+muon"] == "torch-compile"
    assert anchors["kernelbench-cudagraphs"] == "torch-cudagraphs"
    assert op.get_candidate("torch-cudagraphs").requires.cuda


def test_models_suite_runs_the_whole_grid_eager_and_compiled():
    suite = load_suite(configs_dir() / "models.toml")
    timed = {(w, c) for e in suite.bench if e.op == "llama-step" for w in e.workloads for c in e.candidates}
    grid_gpu = {row.name for row in GRID if row.tier == "gpu"}
    assert {w for w, _ in timed} == grid_gpu
    for name in grid_gpu:
        assert {c for w, c in timed if w == name} >= {"torch-eager", "torch-compile", "kernelbench-eager",
                                                      "kernelbench-compile"}


# -- the runner: per-round ratios ------------------------------------------------------------------
@pytest.fixture
def paced_op(monkeypatch):
    """An op whose candidates' times are scripted per round: 'steady' is faster than its anchor in
    every round, 'wobbly' faster in one and slower in the other; each names its anchor."""
    op = FunctionOp("scratch-paced", doc="x + 1", workloads=[Workload("w", "cpu", {"n": 8})],
                    make_inputs=lambda w, device, gen: {"x": torch.zeros(w.spec["n"], device=device)},
                    reference=lambda x: x + 1, outputs=("y",))
    for name in ("anchor", "steady", "wobbly"):
        op.candidate(name)(lambda name=name: (lambda x: x + 1))
    op.anchor_for = lambda name: "anchor"
    script = {"anchor": [1.0, 1.0], "steady": [0.8, 0.9], "wobbly": [0.9, 1.2]}
    calls = {name: 0 for name in script}

    def timer(fn, prepare, config):
        name = next(n for n in script if fn == runs[n])
        value = script[name][calls[name]]
        calls[name] += 1
        return Sample([value] * 3, "cpu perf_counter", 0.0)

    runs = {}
    original = op.make_case

    def make_case(cand, workload, device, mode):
        case = original(cand, workload, device, mode)
        runs[cand.name] = case.run
        return case

    op.make_case = make_case
    monkeypatch.setattr(runner_module, "time_cpu", timer)
    yield op
    del REGISTRY[op.name]


def test_per_round_ratios_and_the_straddle_flag(paced_op):
    sink = []

    class Sink:
        def add(self, row):
            sink.append(row)

    plan = [PlanItem(paced_op, list(paced_op.candidates.values()), list(paced_op.workloads.values()), ["fwd"])]
    run_benchmarks(plan, "cpu", Sink(), timing=TimingConfig(warmup_ms=1, rep_ms=2, min_reps=1), rounds=2)
    rows = {(r["candidate"], r["metric"]): r for r in sink}
    assert ("anchor", "ratio_vs_anchor") not in rows
    assert rows[("steady", "ratio_round_min")]["value"] == pytest.approx(0.8)
    assert rows[("steady", "ratio_round_max")]["value"] == pytest.approx(0.9)
    assert "straddles-1.0" not in rows[("steady", "time_median_ms")]["flags"]
    assert rows[("wobbly", "ratio_round_min")]["value"] == pytest.approx(0.9)
    assert rows[("wobbly", "ratio_round_max")]["value"] == pytest.approx(1.2)
    for metric in ("time_median_ms", "ratio_vs_anchor"):
        assert "straddles-1.0" in rows[("wobbly", metric)]["flags"].split(",")
    assert "straddles 1.0" in rows[("wobbly", "ratio_vs_anchor")]["message"]


def test_static_launch_candidate_passes_inductor_its_option(monkeypatch):
    import torch

    from kernelbench.ops.model_step import compile_step

    op = get_op("llama-step")
    spec = op.get_candidate("kernelbench-compile+static-launch").build()
    assert spec.static_launch and op.anchor_for("kernelbench-compile+static-launch") == "torch-compile"
    calls: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    option = {"static_launch_user_defined_triton_kernels": True}
    compile_step(len, "cuda", options=option)
    compile_step(len, "cpu", options=option)  # aot_eager takes no Inductor options
    assert calls[0] == {"fullgraph": True, "backend": "inductor", "options": option}
    assert calls[1] == {"fullgraph": True, "backend": "aot_eager"}


@pytest.mark.parametrize(("candidate", "compile_mode"), [("kernelbench-compile+auto", "compile"),
                                                          ("kernelbench-cudagraphs+auto", "cudagraphs")])
def test_compiled_auto_candidate_measures_its_shapes_eagerly_before_compiling(monkeypatch, candidate, compile_mode):
    from kernelbench.nn.autoselect import choices_made, clear_memory_cache
    from kernelbench.ops import llama_step

    op = get_op("llama-step")
    spec = op.get_candidate(candidate).build()
    assert (spec.impl, spec.compile, spec.fused_head_loss) == ("auto", compile_mode, "auto")
    assert op.anchor_for(candidate) == {"compile": "torch-compile", "cudagraphs": "torch-cudagraphs"}[compile_mode]
    clear_memory_cache()
    seen: list[set] = []

    def compile_step(step, device, **kwargs):
        seen.append({key[0] for key in choices_made()})
        return step

    monkeypatch.setattr(llama_step, "compile_step", compile_step)
    llama_step.LlamaStepCase(spec, op.workloads["llama-tiny"], "cpu", "fwd+bwd")
    clear_memory_cache()
    assert seen == [{"rmsnorm", "rotary"}]  # the eager step chose before the trace (on the CPU: torch)


@pytest.mark.parametrize("candidate", ["kernelbench-eager+auto", "kernelbench-compile+auto"])
def test_an_auto_candidate_reports_the_choices_its_step_ran(monkeypatch, candidate):
    from kernelbench.nn.autoselect import clear_memory_cache
    from kernelbench.ops import llama_step

    op = get_op("llama-step")
    monkeypatch.setattr(llama_step, "compile_step", lambda step, device, **kwargs: step)
    clear_memory_cache()
    case = llama_step.LlamaStepCase(op.get_candidate(candidate).build(), op.workloads["llama-tiny"], "cpu",
                                    "fwd+bwd")
    case.prepare()
    case.run()
    row = [r for r in case.extra_rows(1.0) if r[0] == "auto_triton_choices"]
    clear_memory_cache()
    assert len(row) == 1
    _, triton, _, message = row[0]
    # On the CPU every choice is torch's; the norms (plain and with a residual) and rotary chose.
    assert triton == 0 and message.startswith("of 3 impl='auto' choices")
    assert "rmsnorm residual" in message and "rotary half-bhsd" in message
    traced = "(traced; eager torch)" in message
    assert traced == (candidate == "kernelbench-compile+auto")


def test_a_layer_set_without_auto_reports_no_choices():
    from kernelbench.ops import llama_step

    op = get_op("llama-step")
    case = llama_step.LlamaStepCase(op.get_candidate("kernelbench-eager").build(), op.workloads["llama-tiny"],
                                    "cpu", "fwd+bwd")
    case.prepare()
    case.run()
    assert case.auto_choices is None
    assert [r[0] for r in case.extra_rows(1.0)] == ["tokens_per_s"]


def test_a_candidate_can_fix_one_slots_impl(monkeypatch):
    from kernelbench.ops import llama_step

    op = get_op("llama-step")
    spec = op.get_candidate("kernelbench-compile+auto+triton-rotary").build()
    assert (spec.impl, spec.slot_impl, spec.compile) == ("auto", (("rotary", "triton"),), "compile")
    assert op.anchor_for("kernelbench-compile+auto+triton-rotary") == "torch-compile"
    monkeypatch.setattr(llama_step, "compile_step", lambda step, device, **kwargs: step)
    case = llama_step.LlamaStepCase(spec, op.workloads["llama-tiny"], "cpu", "fwd+bwd")
    assert case.model.layer_set.impls == {"norm": "auto", "rotary": "triton", "silu_mul": "auto", "loss": "auto"}
