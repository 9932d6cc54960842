"""A candidate whose ranks hang: the launcher stops them after --stall-s and the other candidates are
measured again without it (real processes for the watch, made-up worker results for the relaunch)."""

import functools
import json
import time

import pytest

import kernelbench.ops.dist_train_step as op_module
from kernelbench.distributed import launch as launch_module
from kernelbench.harness.rows import ERROR, OK
from kernelbench.ops.dist_train_step import BASELINE, ROUND_STALL_S, default_stall_s, result_rows, round_stalled

# Rank 0 alone writes the result, as the real workers do: two ranks writing one file can leave the
# tail of the longer text after the shorter one, which no longer parses.
HANGING_WORKER = '''
import json, os, sys, time
out = sys.argv[sys.argv.index("--output") + 1]
result = {"op": "demo", "candidates": {"a": {"status": "ok"}},
          "running": {"candidate": "b", "round": 1, "since_unix": time.time()}}
if os.environ["RANK"] == "0":
    open(out, "w").write(json.dumps(result))
time.sleep(600)  # a rank stuck in a collective
'''


def test_a_stalled_round_stops_every_rank_and_keeps_what_was_written(tmp_path, monkeypatch, processes_mentioning):
    (tmp_path / "hanging_worker.py").write_text(HANGING_WORKER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    output = tmp_path / "out.json"
    t0 = time.monotonic()
    result = launch_module.launch("hanging_worker", 2, [], output, timeout_s=120, cpu=True, name="demo",
                                  stalled=functools.partial(round_stalled, 1.0), poll_s=0.5)
    assert time.monotonic() - t0 < 60  # not the 120 s deadline, nor the worker's 600 s sleep
    assert result["candidates"] == {"a": {"status": "ok"}}
    assert result["stalled"] == "b's round 1 gave no result within 1 s"
    assert result["teardown_error"].startswith("demo: b's round 1 gave no result within 1 s; killed.")
    assert processes_mentioning("hanging_worker") == []


def test_round_stalled_only_past_the_limit():
    now = time.time()
    assert round_stalled(10.0, None) is None
    assert round_stalled(10.0, {"candidates": {}}) is None
    assert round_stalled(10.0, {"running": {"candidate": "x", "round": 2, "since_unix": now - 5}}) is None
    assert round_stalled(10.0, {"running": {"candidate": "x", "round": 2, "since_unix": now - 11}}) == \
        "x's round 2 gave no result within 10 s"


def test_the_gpu_default_grows_with_the_rounds_timing_budget():
    quick = {"rounds": 3, "warmup_ms": 25.0, "rep_ms": 1500.0}
    assert default_stall_s(quick) == pytest.approx(ROUND_STALL_S + 2 * (0.025 + 1.0))
    # --rep-ms 600000 over 3 rounds: each round times 200 s, and its comm-free steps as long again
    assert default_stall_s({**quick, "rep_ms": 600000.0}) > ROUND_STALL_S + 400


def _measured(name):
    return {"status": "ok", "step_ms": [[10.0, 10.0, 10.0]] * 2, "comm_free_ms": [], "what": name, "clipping": "torch",
            "rounds_done": 3}


def _result(candidates, **extra):
    return {"op": "dist-train-step", "workload": "llama-tiny-1x32", "world_size": 2, "backend": "nccl",
            "tokens_per_rank": 32, "timing": "t", "complete": "stalled" not in extra, "candidates": candidates,
            **extra}


@pytest.fixture
def fake_launch(monkeypatch):
    calls, results = [], []

    def fake(module, nproc, args, output, **kwargs):
        calls.append({"args": list(args), **kwargs})
        return results.pop(0)

    monkeypatch.setattr(op_module, "launch", fake)
    return calls, results


def test_a_hung_candidate_is_an_error_row_and_the_others_run_again_without_it(fake_launch, tmp_path):
    calls, results = fake_launch
    names = [BASELINE, "zero-overlap+torch-foreach", "sharded-adamw-overlap"]
    results.append(_result({BASELINE: {**_measured(BASELINE), "rounds_done": 1},
                            "zero-overlap+torch-foreach": {"status": "pending", "reason": "-"},
                            "sharded-adamw-overlap": {"status": "pending", "reason": "-"}},
                           stalled="zero-overlap+torch-foreach's round 1 gave no result within 240 s",
                           running={"candidate": "zero-overlap+torch-foreach", "round": 1, "since_unix": 0},
                           teardown_error="killed"))
    results.append(_result({BASELINE: _measured(BASELINE), "sharded-adamw-overlap": _measured("s")}))
    settings = {"nproc": 2, "rounds": 3, "warmup_ms": 25, "rep_ms": 100, "min_reps": 1, "max_reps": 10,
                "candidates": names}
    result = op_module.launch_workload(settings, "llama-tiny-1x32", tmp_path / "o.json", cpu=True, stall_s=240.0)

    assert len(calls) == 2
    assert all(c["stalled"] is not None for c in calls)
    second = calls[1]["args"]
    assert second[second.index("--candidates") + 1] == f"{BASELINE},sharded-adamw-overlap"
    assert list(result["candidates"]) == names  # the run's order
    hung = result["candidates"]["zero-overlap+torch-foreach"]
    assert hung["status"] == "error" and hung["reason"].startswith("hung: its round 1 gave no result within 240 s")
    assert "teardown_error" not in result and result["candidates"][BASELINE]["rounds_done"] == 3

    rows = result_rows(result)
    status = {(r.candidate, r.metric): r.status for r in rows}
    assert status[("zero-overlap+torch-foreach", "time_median_ms")] == ERROR
    assert status[(BASELINE, "time_median_ms")] == OK
    assert status[("sharded-adamw-overlap", "time_median_ms")] == OK


def test_relaunching_stops_when_no_candidate_is_left(fake_launch, tmp_path):
    calls, results = fake_launch
    results.append(_result({"sharded-adamw": {"status": "pending", "reason": "-"}}, stalled="s", teardown_error="k",
                           running={"candidate": "sharded-adamw", "round": 1, "since_unix": 0}))
    settings = {"nproc": 2, "rounds": 1, "warmup_ms": 25, "rep_ms": 100, "min_reps": 1, "max_reps": 10,
                "candidates": ["sharded-adamw"]}
    result = op_module.launch_workload(settings, "llama-tiny-1x32", tmp_path / "o.json", cpu=True, stall_s=5.0)
    assert len(calls) == 1
    assert result["candidates"]["sharded-adamw"]["status"] == "error"
    assert "running" not in result and result["teardown_error"] == "k"
    json.dumps(result)  # still what the report writes


def test_cpu_ranks_are_not_watched_unless_asked(fake_launch, tmp_path):
    calls, results = fake_launch
    results.append(_result({BASELINE: _measured(BASELINE)}))
    settings = {"nproc": 2, "rounds": 1, "warmup_ms": 25, "rep_ms": 100, "min_reps": 1, "max_reps": 10}
    op_module.launch_workload(settings, "llama-tiny-1x32", tmp_path / "o.json", cpu=True)
    assert calls[0]["stalled"] is None and "--candidates" not in calls[0]["args"]


def test_stall_s_is_checked_and_belongs_to_dist_train_step():
    from typer.testing import CliRunner

    from kernelbench.cli import app

    runner = CliRunner()
    zero = runner.invoke(app, ["run", "dist-train-step", "--stall-s", "0"])
    assert zero.exit_code != 0 and "--stall-s 0: must be greater than 0" in zero.output
    other = runner.invoke(app, ["run", "rmsnorm", "--stall-s", "5"])
    assert other.exit_code != 0 and "dist-train-step options only" in other.output
