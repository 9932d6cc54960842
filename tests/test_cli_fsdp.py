"""`kernelbench parity OP --fsdp` and `kernelbench train OP --fsdp` on CPU ranks (Gloo, Triton
interpreter, torch's launcher): a run-through of the commands, and their usage errors."""

import json
import xml.etree.ElementTree as ET

import pandas as pd
from typer.testing import CliRunner

from kernelbench.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


def test_parity_under_fsdp_checks_each_candidate_against_itself_unsharded(tmp_path):
    out = tmp_path / "p"
    result = invoke("parity", "adam-mini", "--fsdp", "--nproc", "2", "--steps", "2", "--device", "cpu",
                    "-c", "triton-fp32", "-c", "triton-fp8", "-o", out)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    verdicts = rows[rows.metric == "parity"]
    assert set(verdicts.candidate) == {"triton-fp32", "triton-fp8"} and set(verdicts.status) == {"pass"}
    assert set(verdicts["mode"]) == {"fsdp, 2 ranks"} and set(verdicts.workload) == {"llama-tiny"}
    assert rows.tensor.notna().any()  # per-tensor rows, as for one device
    assert "itself unsharded" in verdicts.message.iloc[0]
    assert json.loads((out / "run.json").read_text())["settings"]["fsdp_nproc"] == 2
    cases = list(ET.parse(out / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == 2 and not any(c.find("failure") is not None for c in cases)  # one per check


def test_train_under_fsdp_judges_the_band_as_on_one_device(tmp_path):
    out = tmp_path / "t"
    result = invoke("train", "adamw", "--fsdp", "--nproc", "2", "--steps", "4", "--ref-seeds", "2", "--device", "cpu",
                    "-c", "triton", "-o", out)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    verdicts = rows[rows.metric == "parity"]
    assert dict(zip(verdicts.candidate, verdicts.status)) == {"torch-forloop": "pass", "triton": "pass"}
    assert set(rows["mode"]) == {"train, fsdp 2 ranks"}
    losses = pd.read_csv(out / "losses.csv")
    assert losses.loss.notna().all() and set(losses.candidate) == {"torch-forloop", "triton"}


def test_fsdp_usage_errors_are_one_line():
    cases = [
        (("parity", "adamw", "--nproc", "2", "--device", "cpu"), "add --fsdp"),
        (("parity", "rmsnorm", "--fsdp", "--device", "cpu"), "not an optimizer op"),
        (("parity", "adamw", "--fsdp", "-w", "llama-huge", "--device", "cpu"), "llama-tiny"),
        (("parity", "adamw", "--fsdp", "--nproc", "0", "--device", "cpu"), "--nproc 0"),
        (("train", "adamw", "--nproc", "2", "--device", "cpu"), "add --fsdp"),
        (("train", "adamw", "--fsdp", "--nproc", "3", "--batch", "4", "--device", "cpu"), "does not split"),
    ]
    for args, expected in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.output, (args, result.output)
