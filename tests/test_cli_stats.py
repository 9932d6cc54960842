"""The statistics through the CLI: compare --strict, ab with two environments on the CPU, history
add / show, run --lock-clocks without a GPU, and plot of the samples."""

import json
import re
import sys

import pandas as pd
import pytest
from test_compare_verdicts import _report
from test_history import _report as _history_report
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.report.significance import VERDICTS

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "250"})


def test_compare_lists_inconclusive_rows_and_fails_on_them_only_when_strict(tmp_path):
    base = _report(tmp_path / "base", {"same": 1.0, "unsure": 1.0}, seed=1)
    new = _report(tmp_path / "new", {"same": 1.0, "unsure": (0.99, 1.05, 1.11)}, seed=2)
    result = invoke("compare", base, new, "-o", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    assert "1 inconclusive" in result.output and "rmsnorm/w/fwd/unsure" in result.output
    assert "not failing without --strict" in result.output
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert {"low", "high", "p", "verdict", "method", "why"} <= set(table.columns)
    strict = invoke("compare", base, new, "--strict")
    assert strict.exit_code == 3 and "1 inconclusive (--strict)" in strict.output
    as_json = json.loads(invoke("compare", base, new, "--format", "json").stdout)
    assert {r["candidate"]: r["verdict"] for r in as_json} == {"same": "same", "unsure": "inconclusive"}
    assert invoke("compare", base, new, "--alpha", "2").exit_code == 2


@pytest.mark.slow
def test_ab_with_two_environments_calls_the_slowed_candidate_slower(tmp_path, monkeypatch):
    # One thread per process: on a shared 2-core machine, several threads per timed call make
    # CPU times jump by 100x between processes.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    base, new = tmp_path / "base-python", tmp_path / "new-python"
    base.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    new.write_text(f"#!/bin/sh\nKERNELBENCH_TEST_SLOWDOWN=adamw/torch-forloop=2.0 exec {sys.executable} \"$@\"\n")
    base.chmod(0o755)
    new.chmod(0o755)
    out = tmp_path / "ab"
    # Processes are the bootstrap's unit: three a side, and a slowdown (3x) far beyond the level a
    # loaded CPU process can sit at, so the verdict does not depend on the machine being quiet.
    result = invoke("ab", base, new, "--rounds", "3", "-o", out, "--", "adamw", "--device", "cpu", "-w", "tiny",
                    "-c", "torch-forloop", "-c", "torch-foreach", "--rep-ms", "40", "--warmup-ms", "2")
    assert result.exit_code == 3, result.output
    table = pd.read_csv(out / "compare.csv").set_index("candidate")
    assert table.loc["torch-forloop", "verdict"] == "slower", table.loc["torch-forloop"].to_dict()
    # The ratio's size moves with a loaded 2-core host's process-to-process spread (1.25-1.55 seen
    # against the 3x asked); that the interval excludes 1 and holds the estimate is what the verdict means.
    row = table.loc["torch-forloop"]
    assert row["low"] > 1.0 and row["ratio"] > 1.0, row.to_dict()
    assert table.loc["torch-foreach", "verdict"] in VERDICTS
    assert set(table["method"]) == {"rank test + bootstrap"}
    doc = json.loads((out / "ab.json").read_text())
    order = [(p["round"], p["side"]) for p in doc["processes"]]
    assert order == [(1, "BASE"), (1, "NEW"), (2, "NEW"), (2, "BASE"), (3, "BASE"), (3, "NEW")]  # alternating
    assert all(p["returncode"] == 0 for p in doc["processes"])
    slowed = pd.read_csv(out / "new-1" / "results.csv")
    assert "test_slowdown_ms" in set(slowed.metric)
    assert "test_slowdown_ms" not in set(pd.read_csv(out / "base-1" / "results.csv").metric)
    # The unslowed candidate may be called slower too: a loaded 2-core host can drift between
    # processes by more than the 5% threshold, as the verdict check on torch-foreach above allows.
    assert re.search(r"\d slower: [^\n]*adamw/tiny/step/torch-forloop", result.output), result.output


def test_ab_refuses_bad_sides_and_arguments(tmp_path):
    python = tmp_path / "py"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    no_args = invoke("ab", python, python, "-o", tmp_path / "a")
    assert no_args.exit_code == 2 and "name what to time after --" in no_args.output
    bad = invoke("ab", python, "no-such-revision-xyz", "-o", tmp_path / "b", "--", "adamw")
    assert bad.exit_code == 2 and "NEW no-such-revision-xyz" in bad.output
    nothing = invoke("ab", python, python, "-o", tmp_path / "c", "--rounds", "1", "--", "no-such-op")
    assert nothing.exit_code == 4 and "timed nothing" in nothing.output and "base-1.log" in nothing.output


def test_history_add_and_show(tmp_path):
    store = tmp_path / "h.sqlite"
    reports = [_history_report(tmp_path / f"r{i}", f"{i:07d}f", f"2026-11-2{i}T00:00:00+00:00", level)
               for i, level in enumerate([1.0, 1.0, 1.0, 1.2, 1.2])]
    added = invoke("history", "add", *reports, "--store", store)
    assert added.exit_code == 0 and added.output.count("2 timed row(s)") == 5
    assert "already in" in invoke("history", "add", reports[0], "--store", store).output
    shown = invoke("history", "show", "rmsnorm", "-w", "w", "--store", store, "-o", tmp_path / "plots")
    assert shown.exit_code == 0, shown.output
    assert "step up +20%" in shown.output and "2 step change(s)" in shown.output  # triton and torch
    history = pd.read_csv(tmp_path / "plots" / "history.csv", dtype={"commit": str})
    assert len(history) == 10 and history.commit.iloc[0] == "0000000"
    assert invoke("history", "show", "adamw", "--store", store).exit_code == 4
    assert invoke("history", "show", "rmsnorm", "--store", tmp_path / "none.sqlite").exit_code == 2


def test_run_lock_clocks_without_a_gpu_says_so_and_plot_draws_the_samples(tmp_path):
    out = tmp_path / "r"
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "--rep-ms", "5",
                    "--warmup-ms", "1", "--lock-clocks", "-o", out)
    assert result.exit_code == 0, result.output
    assert "--lock-clocks: no GPU in this run, nothing to lock" in result.output
    assert json.loads((out / "run.json").read_text())["settings"]["lock_clocks"] == "no GPU: nothing locked"
    plotted = invoke("plot", out)
    assert plotted.exit_code == 0 and "samples-adamw.png" in plotted.output
    assert invoke("run", "dist-adamw", "--lock-clocks").exit_code == 2  # its ranks take no such option
