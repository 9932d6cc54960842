"""ab's pieces: sides from environments, executables and git revisions; the bench-only suite; the
run arguments each process gets; and pooling process reports, with and without samples. The whole
command runs in tests/test_cli_stats.py."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernelbench.config import load_suite
from kernelbench.harness.rows import RoundSamples
from kernelbench.ops.base import UsageError
from kernelbench.report.samples import SAMPLES_CSV
from kernelbench.report.writer import ReportWriter
from kernelbench.session.ab import bench_only_suite, pool, prepare_run_args, remove_side, resolve_side

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_only_suite_keeps_every_bench_table_and_no_parity(tmp_path):
    path = bench_only_suite(ROOT / "configs" / "ci.toml", tmp_path / "s.toml")
    original, copy = load_suite(ROOT / "configs" / "ci.toml"), load_suite(path)
    assert copy.bench == original.bench and copy.parity == [] and copy.settings == original.settings
    quick = load_suite(bench_only_suite(ROOT / "configs" / "quick.toml", tmp_path / "q.toml"))
    assert quick.bench == load_suite(ROOT / "configs" / "quick.toml").bench  # lists, tags, excludes carried


def test_run_arguments_each_process_gets(tmp_path):
    args = prepare_run_args(["--config", str(ROOT / "configs" / "ci.toml"), "--rounds", "1"], tmp_path)
    assert args[1] == str(tmp_path / "suite-bench-only.toml") and args[2:] == ["--rounds", "1"]
    assert prepare_run_args(["rmsnorm", "-w", "x"], tmp_path) == ["rmsnorm", "-w", "x"]
    for bad, said in (([], "name what to time"), (["rmsnorm", "-o", "x"], "-o after --"),
                      (["rmsnorm", "--output-dir=x"], "--output-dir after --"),
                      (["adamw", "--format", "json"], "--format")):
        with pytest.raises(UsageError, match=said):
            prepare_run_args(bad, tmp_path)


def test_sides_from_an_environment_an_executable_and_a_git_revision(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    env_side = resolve_side("BASE", str(venv), tmp_path)
    assert env_side.python == str(venv / "bin" / "python") and env_side.cwd is None
    # A virtualenv's python is a link to the base interpreter: run through the link, not its target.
    linked = tmp_path / "linked-python"
    linked.symlink_to(sys.executable)
    assert resolve_side("BASE", str(linked), tmp_path).python == str(linked)
    wrapper = tmp_path / "slow.sh"
    wrapper.write_text("#!/bin/sh\nexec python3 \"$@\"\n")
    with pytest.raises(UsageError, match="not executable"):
        resolve_side("NEW", str(wrapper), tmp_path)
    wrapper.chmod(0o755)
    assert resolve_side("NEW", str(wrapper), tmp_path).describe == f"executable {wrapper}"
    with pytest.raises(UsageError, match="not a Python executable, a virtualenv folder, or a revision"):
        resolve_side("NEW", "no-such-revision-xyz", tmp_path, repo=ROOT)

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    side = resolve_side("BASE", "HEAD", tmp_path, repo=ROOT)
    try:
        tree = Path(side.worktree)
        assert (tree / "kernelbench" / "__init__.py").is_file() and side.cwd == str(tree)
        assert side.env["KERNELBENCH_GIT_SHA"] == head and side.env["PYTHONPATH"].startswith(str(tree))
        listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
        assert str(tree) in listed
    finally:
        remove_side(side)
    assert not tree.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert str(tree) not in listed


def _process_report(folder, level, *, samples=True, status="ok"):
    writer = ReportWriter(folder, {"device": "cpu"}, "run")
    rng = np.random.default_rng(int(level * 1000))
    rounds = [level * (1 + 0.01 * rng.standard_normal(20)) for _ in range(2)]
    key = {"op": "adamw", "workload": "tiny", "mode": "step", "candidate": "a", "unit": "ms"}
    writer.add({**key, "metric": "time_median_ms", "value": float(np.median(np.concatenate(rounds))),
                "status": status, "message": "boom" if status == "error" else ""})
    if samples and status == "ok":
        for i, r in enumerate(rounds):
            writer.add_round(RoundSamples("adamw", "tiny", "step", "a", "time_median_ms", i + 1, tuple(r)))
    writer.close("complete")
    if not samples and (folder / SAMPLES_CSV).exists():
        (folder / SAMPLES_CSV).unlink()
    return folder


def test_pooling_process_reports(tmp_path):
    with_samples = pool([_process_report(tmp_path / f"s{i}", 1.0 + 0.01 * i) for i in range(3)])
    times, clusters, processes = with_samples.samples[("adamw", "tiny", "step", "a")]
    assert len(times) == 120 and len(set(clusters)) == 6  # (process, round) clusters
    assert sorted(set(processes)) == [0, 1, 2] and len(processes) == 120
    assert with_samples.processes_without_samples == 0
    bare = pool([_process_report(tmp_path / f"b{i}", 1.0 + 0.01 * i, samples=False) for i in range(3)])
    times, clusters, processes = bare.samples[("adamw", "tiny", "step", "a")]
    assert len(times) == 3 and len(set(clusters)) == 3 and bare.processes_without_samples == 3
    assert sorted(processes) == [0, 1, 2]
    broken = pool([_process_report(tmp_path / "e0", 1.0, status="error"), tmp_path / "never-written"])
    assert broken.errors == {("adamw", "tiny", "step", "a"): "boom"} and broken.times.empty
