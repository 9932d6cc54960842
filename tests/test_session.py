"""The session without the CLI: a typed request in, a typed outcome out, the report closed; the
defaults and bounds of the timing settings in one place for the CLI and suites alike."""

import json

import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.harness.settings import DEFAULT_TIMING, TimingConfig
from kernelbench.ops.base import UsageError
from kernelbench.session import Entry, Listener, OutputSettings, RunRequest, Session, Status
from kernelbench.session.options import RunOptions, run_request

FAST = TimingConfig(warmup_ms=1, rep_ms=5, rounds=1)


class Heard(Listener):
    def __init__(self):
        self.lines = []

    def note(self, text, *, important=False):
        self.lines.append(text)

    def error(self, text):
        self.lines.append("error: " + text)


def test_a_request_runs_into_a_closed_report_and_an_outcome(tmp_path):
    heard = Heard()
    request = RunRequest("run", "adamw", bench=(Entry("adamw", ["tiny"], ["torch-forloop", "triton"]),),
                         device="cpu", timing=FAST, output=OutputSettings(tmp_path / "r"))
    outcome = Session(heard).run(request)
    assert outcome.status is Status.COMPLETE and outcome.folder == tmp_path / "r"
    assert outcome.tally.line() == "1 ok, 0 failed, 0 skipped, 1 not measured"
    assert any("No CUDA device" in line for line in heard.lines)
    doc = json.loads((tmp_path / "r" / "run.json").read_text())
    assert doc["outcome"] == "complete" and doc["settings"]["rep_ms"] == 5 and doc["settings"]["rounds"] == 1


@pytest.mark.parametrize("entry, status, message", [
    (Entry("adamw", ["tiny"], ["torch-fused"], steps=1, atol=0, rtol=0), Status.PARITY_FAILED,
     "parity failed: adamw/tiny/step/torch-fused"),
    (Entry("adam-mini", ["llama-tiny"], ["triton-fp32"], steps=1), Status.COMPLETE, ""),
])
def test_parity_outcomes(tmp_path, entry, status, message):
    outcome = Session().run(RunRequest("parity", entry.op, parity=(entry,), device="cpu",
                                       output=OutputSettings(tmp_path)))
    assert outcome.status is status and outcome.message == message


def test_nothing_that_can_run_is_an_outcome_with_its_reasons(tmp_path):
    request = RunRequest("run", "adam-mini", bench=(Entry("adam-mini", ["llama-tiny"], ["torch-adamw-fused"]),),
                         device="cpu", output=OutputSettings(tmp_path))
    outcome = Session().run(request)
    assert outcome.status is Status.NOTHING_RAN and outcome.reasons == ["torch-adamw-fused: needs CUDA"]
    assert outcome.tally.line() == "0 ok, 0 failed, 1 skipped"


def test_a_late_usage_error_leaves_no_report_folder(tmp_path):
    # Found by the harness once the report is open: the report is closed and its empty folder removed.
    request = RunRequest("parity", "adamw", parity=(Entry("adamw", ["tiny"], steps=0),), device="cpu",
                         output=OutputSettings(tmp_path / "r"))
    with pytest.raises(UsageError, match="--steps 0: must be at least 1"):
        Session().run(request)
    assert not (tmp_path / "r").exists()


def test_the_command_line_wins_over_the_suite_and_the_suite_over_the_defaults(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\ndevice = "cpu"\nrep_ms = 7\n[[bench]]\nop = "adamw"\n')
    request = run_request(RunOptions(config=suite, rounds=2))
    assert request.timing == TimingConfig(rep_ms=7, rounds=2) and request.device == "cpu"
    assert request.timing.warmup_ms == DEFAULT_TIMING.warmup_ms


def test_one_bound_for_the_command_line_and_the_suite(tmp_path):
    runner = CliRunner()
    cli = runner.invoke(app, ["run", "adamw", "--rep-ms", "0"])
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nrep_ms = 0\n[[bench]]\nop = "adamw"\n')
    toml = runner.invoke(app, ["run", "--config", str(suite)])
    assert cli.exit_code == toml.exit_code == 2
    assert "--rep-ms 0: must be greater than 0" in cli.output
    assert "[suite].rep_ms = 0: must be greater than 0" in toml.output
    help_text = " ".join(runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output.split())
    assert f"[default: {DEFAULT_TIMING.rep_ms:g}, or the suite's]" in help_text
