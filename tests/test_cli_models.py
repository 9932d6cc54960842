"""The model grid on the command line: `list --workloads` shows it, `run llama-step --model /
--tokens` times a grid model or a spec at any batch x sequence, and a bad value is one line, exit 2."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.models import GRID

runner = CliRunner()
SPEC = "hidden=32,layers=1,heads=2,kv_heads=1,intermediate=48,vocab=64"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_list_workloads_shows_the_grid_and_the_written_form():
    result = invoke("list", "--workloads", "--format", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    grid = {r["workload"]: r for r in records if r.get("table") == "workloads" and r.get("op") == "llama-step"}
    assert set(grid) == {row.name for row in GRID}
    assert "Qwen2.5-1.5B" in grid["qwen2.5-1.5b-layer4"]["note"] and "2x4096" in grid["qwen2.5-1.5b-layer4"]["note"]
    forms = [r for r in records if r.get("table") == "workload_forms" and r.get("op") == "llama-step"]
    assert forms and "MODEL@BxS" in forms[0]["-w also takes"]


@pytest.mark.parametrize("args, words", [
    (["llama-step", "--model", "llama-3.2-1b"], "--model: unknown model 'llama-3.2-1b'"),
    (["llama-step", "--model", "hidden=32,layers=1"], "missing heads, kv_heads, intermediate, vocab"),
    (["llama-step", "--model", SPEC + ",heads=3"], "heads given twice"),
    (["llama-step", "--model", "llama-tiny", "--tokens", "4by2048"], "--tokens: 4by2048: expected BATCHxSEQ"),
    (["llama-step", "--model", SPEC], "needs --tokens"),
    (["llama-step", "--tokens", "2x8"], "--tokens needs --model or -w"),
    (["llama-step", "-w", "llama-tiny@2x8:int4"], "dtype 'int4'"),
    (["rmsnorm", "--model", "llama-tiny"], "llama-step options only"),
])
def test_bad_model_or_tokens_is_one_line_and_exit_2(args, words, tmp_path):
    result = invoke("run", *args, "--device", "cpu", "-o", tmp_path / "x")
    assert result.exit_code == 2, result.output
    assert len(_lines(result.output)) == 1 and words in result.output
    assert not (tmp_path / "x").exists()


def test_run_times_a_spec_model_at_the_tokens_given(tmp_path):
    result = invoke("run", "llama-step", "--model", SPEC, "--tokens", "2x8", "-c", "torch-eager", "-m", "fwd+bwd",
                    "--device", "cpu", "--rep-ms", "5", "--warmup-ms", "1", "--rounds", "1", "-o", tmp_path)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    assert set(rows["workload"]) == {f"{SPEC}@2x8"}
    value = rows.set_index("metric")["value"]
    assert float(value["tokens_per_s"]) == pytest.approx(16 / (float(value["time_median_ms"]) * 1e-3), rel=1e-6)


def test_train_takes_a_model_written_as_a_spec(tmp_path):
    bad = invoke("train", "adamw", "--model", SPEC.replace("vocab=64", "vocab=x"), "--device", "cpu",
                 "-o", tmp_path / "x")
    assert bad.exit_code == 2 and "vocab=x is not an integer" in bad.output
    result = invoke("train", "adamw", "--model", SPEC, "-c", "torch-fused", "--steps", "2", "--ref-seeds", "2",
                    "--batch", "2", "--seq", "8", "--device", "cpu", "-o", tmp_path / "ok")
    assert result.exit_code in (0, 1), result.output  # the band of two 2-step runs may or may not hold
    doc = json.loads((tmp_path / "ok" / "train.json").read_text())
    assert doc["model"]["hidden"] == 32 and doc["model"]["vocab_size"] == 64
