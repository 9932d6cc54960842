"""dist-train-step: its metrics and loss check on made-up worker results, and a run-through of
`kernelbench run dist-train-step --nproc 2` on CPU ranks (Gloo, Triton interpreter)."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.ops import get_op
from kernelbench.ops.dist_train_step import (
    BASELINE,
    LOSS_RTOL,
    exposed_comm_ms,
    loss_check,
    result_rows,
    slowest_rank_stats,
)

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


def test_slowest_rank_per_rep_then_median():
    # rep i takes max over ranks: [3, 5, 4] -> median 4, not the median of either rank's own times
    stats = slowest_rank_stats([[1.0, 5.0, 4.0], [3.0, 2.0, 2.0]])
    assert stats["median"] == 4.0 and stats["min"] == 3.0 and stats["reps"] == 3
    assert slowest_rank_stats([[], []]) == {"median": None, "reps": 0}


def test_exposed_comm_is_the_gap_to_the_comm_free_step_and_never_negative():
    assert exposed_comm_ms({"median": 10.0}, {"median": 7.5}) == 2.5
    assert exposed_comm_ms({"median": 10.0}, {"median": 10.4}) == 0.0  # noise, not negative comm
    assert exposed_comm_ms({"median": 10.0}, {}) is None


def test_loss_check_passes_rounding_and_fails_a_candidate_that_did_not_step():
    reference = [[4.8, 4.6, 4.4], [4.9, 4.7, 4.5]]
    near = [[4.8 * (1 + 1e-4), 4.6, 4.4 * (1 - 2e-4)], [4.9, 4.7, 4.5]]
    check = loss_check(near, reference)
    assert check["passed"] and check["discriminating"] and check["max_rel_diff"] == pytest.approx(2e-4, rel=1e-3)
    frozen = [[4.8, 4.8, 4.8], [4.9, 4.9, 4.9]]  # same first loss, no update after it
    check = loss_check(frozen, reference)
    assert not check["passed"] and check["n_outside"] == 4
    nan = loss_check([[4.8, math.nan, 4.4], [4.9, 4.7, 4.5]], reference)
    assert not nan["passed"] and nan["n_outside"] == 1


def test_loss_check_says_when_the_reference_barely_moved():
    reference = [[4.8, 4.8, 4.79]]
    check = loss_check(reference, reference)
    assert check["passed"] and not check["discriminating"]
    assert check["rtol"] == LOSS_RTOL


def _result(backend="nccl"):
    def ok(step, free, losses, state):
        return {"status": "ok", "what": "w", "clipping": "torch", "comm_free_how": "no_sync", "comm_free_reason": "",
                "step_ms": step, "comm_free_ms": free, "peak_bytes": [100, 120], "state_bytes": state,
                "losses": losses, "rounds_done": 1}

    ref_losses = [[4.8, 4.6, 4.4], [4.9, 4.7, 4.5]]
    return {
        "op": "dist-train-step", "workload": "llama-1b-1x2048", "world_size": 2, "backend": backend,
        "tokens_per_rank": 2048, "timing": "t", "complete": False,
        "candidates": {
            BASELINE: {**ok([[10.0, 10.0], [11.0, 11.0]], [[8.0, 8.0], [8.0, 8.0]], ref_losses, [800, 800]),
                       "phase_ms": [[{"step": {"forward": 3.0, "host_forward": 4.0}, "comm_free": {"forward": 2.0}},
                                     {"step": {"forward": 5.0, "host_forward": 4.5}}]]},
            "sharded-adamw": ok([[9.0, 9.0], [9.0, 9.0]], [], [[4.8, 4.6, 4.41], [4.9, 4.7, 4.5]], [200, 210]),
            "zero-overlap+torch-foreach": {"status": "error", "reason": "rank 0: OutOfMemoryError"},
            "fsdp2+torch-fused": {"status": "pending", "reason": "not reached before the run ended"},
        },
    }


def test_rows_carry_each_metric_and_a_partial_result_keeps_what_was_measured():
    rows = pd.DataFrame([r.as_dict() for r in result_rows(_result())])
    by = rows.set_index(["candidate", "metric"])
    assert by.loc[(BASELINE, "time_median_ms"), "value"] == 11.0  # the slowest rank
    assert by.loc[(BASELINE, "tokens_per_s"), "value"] == pytest.approx(2 * 2048 / 0.011)
    assert by.loc[(BASELINE, "exposed_comm_ms"), "value"] == 3.0
    assert by.loc[(BASELINE, "peak_bytes"), "value"] == 120
    assert by.loc[(BASELINE, "step_forward_ms"), "value"] == 4.0  # median over ranks (and rounds)
    assert by.loc[(BASELINE, "step_host_forward_ms"), "value"] == 4.25
    assert by.loc[(BASELINE, "comm_free_forward_ms"), "value"] == 2.0
    assert ("sharded-adamw", "step_forward_ms") not in by.index  # no phases recorded, no rows
    assert by.loc[("sharded-adamw", "state_bytes"), "value"] == 210
    assert by.loc[("sharded-adamw", "ratio_vs_anchor"), "value"] == pytest.approx(9 / 11)
    assert by.loc[("sharded-adamw", "exposed_comm_ms"), "status"] == "not-measured"
    assert by.loc[("sharded-adamw", "parity"), "status"] == "pass"
    assert by.loc[("zero-overlap+torch-foreach", "time_median_ms"), "status"] == "error"
    assert by.loc[("fsdp2+torch-fused", "time_median_ms"), "status"] == "skipped"


def test_cpu_rows_are_not_measurements():
    rows = pd.DataFrame([r.as_dict() for r in result_rows(_result(backend="gloo"))])
    medians = rows[rows.metric == "time_median_ms"].set_index("candidate")
    assert medians.loc[BASELINE, "status"] == "not-measured" and "tokens_per_s" not in set(rows.metric)


def test_worker_step_counts_follow_the_time_budgets():
    from kernelbench.ops.dist_train_step.worker import WARMUP_MIN_STEPS, step_counts

    args = SimpleNamespace(warmup_steps=None, reps=None, warmup_ms=25.0, rep_ms=1500.0, rounds=3, min_reps=10,
                           max_reps=1000)
    assert step_counts(args, 50.0, 0) == (WARMUP_MIN_STEPS, 10)  # 1500 ms / 50 ms / 3 rounds
    assert step_counts(args, 500.0, 2) == (2 + WARMUP_MIN_STEPS, 4)  # min_reps 10 over 3 rounds
    # reps of 2 steps: half as many reps in the same budget; warm-up still counted in steps
    assert step_counts(args, 25.0, 0, steps_per_rep=2) == (WARMUP_MIN_STEPS, 10)
    fixed = SimpleNamespace(**{**vars(args), "warmup_steps": 0, "reps": 1})
    assert step_counts(fixed, None, 2) == (2, 1)


def test_op_takes_the_timing_options_nproc_bucket_size_and_stall_not_the_others():
    op = get_op("dist-train-step")
    assert {"--rounds", "--rep-ms", "--warmup-ms"} <= set(op.takes)
    assert set(op.options) == {"--nproc", "--bucket-mb", "--stall-s"}
    settings = op.settings("cuda", {"--nproc": 4, "--stall-s": 30.0})
    assert settings["nproc"] == 4 and settings["rounds"] == 3 and settings["bucket_mb"] is None
    assert settings["stall_s"] == 30.0 and op.settings("cuda", {})["stall_s"] is None
    result = invoke("run", "dist-train-step", "--steps", "3")
    assert result.exit_code == 2 and "not accepted by dist-train-step" in result.output
    assert "--bucket-mb" in result.output  # named among what it takes
    assert invoke("run", "dist-train-step", "--bucket-mb", "0").exit_code == 2


def test_run_through_on_two_cpu_ranks(tmp_path):
    result = invoke("run", "dist-train-step", "--nproc", "2", "--device", "cpu", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    medians = rows[rows.metric == "time_median_ms"].set_index("candidate")
    assert list(medians.index)[0] == BASELINE  # the headline first
    assert medians.loc["zero-overlap+torch-foreach", "status"] == "skipped"  # NCCL only
    assert medians.loc["ddp-bf16-comm+torch-fused", "status"] == "skipped"
    ran = [c for c in medians.index if medians.loc[c, "status"] == "not-measured"]
    assert {BASELINE, "fsdp2+torch-fused", "fsdp2-noreshard+torch-fused", "fsdp2-bf16-noreshard+torch-fused",
            "fsdp2+triton-adamw", "sharded-adamw", "sharded-adamw-overlap",
            "sharded-adamw-overlap+prefetch", "sharded-adamw-overlap+gather-group",
            "sharded-adamw-overlap+bf16-comm", "sharded-adamw-overlap+bf16-params",
            "sharded-adamw-overlap+prefetch+bf16-params"} <= set(ran)
    verdicts = rows[rows.metric == "parity"].set_index("candidate")
    assert set(verdicts.status) == {"pass"} and "fsdp2+torch-fused" in verdicts.index
    written = json.loads((tmp_path / "dist-train-step-llama-tiny-1x32.json").read_text())
    assert written["complete"] and written["world_size"] == 2
    assert written["candidates"][BASELINE]["losses"][0][1] < written["candidates"][BASELINE]["losses"][0][0]
    phases = written["candidates"][BASELINE]["phase_s"]  # where each round's time went, per round
    assert len(phases) == 1 and {"build", "loss_check", "warmup", "timed"} <= set(phases[0])
    assert all(seconds >= 0 for seconds in phases[0].values())


def test_candidates_chosen_with_c_are_the_only_ones_the_ranks_run(tmp_path):
    result = invoke("run", "dist-train-step", "--nproc", "2", "--device", "cpu", "-c", "sharded-adamw",
                    "-c", BASELINE, "--bucket-mb", "0.5", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "dist-train-step-llama-tiny-1x32.json").read_text())
    assert list(written["candidates"]) == [BASELINE, "sharded-adamw"]  # the op's order: the anchor first
    assert "0.5 MiB buckets" in written["candidates"]["sharded-adamw"]["what"]
    rows = pd.read_csv(tmp_path / "results.csv")
    assert set(rows.candidate) == {BASELINE, "sharded-adamw"}


def test_a_suite_table_chooses_candidates_and_options_and_the_command_line_overrides_options(tmp_path):
    config = tmp_path / "dist.toml"
    config.write_text('[suite]\ndevice = "cpu"\n[[bench]]\nop = "dist-train-step"\n'
                      f'candidates = ["sharded-adamw-overlap+bf16-params", "{BASELINE}"]\n'
                      'options = { nproc = 2, bucket_mb = 0.5, stall_s = 900 }\n')
    result = invoke("run", "--config", config, "--output-dir", tmp_path / "out")
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "dist-train-step-llama-tiny-1x32.json").read_text())
    assert list(written["candidates"]) == [BASELINE, "sharded-adamw-overlap+bf16-params"]
    assert written["world_size"] == 2
    assert "0.5 MiB buckets" in written["candidates"]["sharded-adamw-overlap+bf16-params"]["what"]
    settings = json.loads((tmp_path / "out" / "run.json").read_text())["settings"]["dist-train-step"]
    assert settings["nproc"] == 2 and settings["bucket_mb"] == 0.5 and settings["stall_s"] == 900
    # The command line's options win over the table's; one no table's op takes is refused.
    again = invoke("run", "--config", config, "--bucket-mb", "0.25", "-c", BASELINE, "--output-dir", tmp_path / "again")
    assert again.exit_code == 2 and "-c/--candidate" in again.output  # a suite's tables choose what runs
    again = invoke("run", "--config", config, "--bucket-mb", "0.25", "--output-dir", tmp_path / "again")
    assert again.exit_code == 0, again.output
    settings = json.loads((tmp_path / "again" / "run.json").read_text())["settings"]["dist-train-step"]
    assert settings["bucket_mb"] == 0.25 and settings["nproc"] == 2
    refused = invoke("run", "--config", config, "--steps", "3")
    assert refused.exit_code == 2 and "--steps: no [[bench]] table of" in refused.output, refused.output
    assert "dist-adamw options only" in refused.output


def test_an_unknown_candidate_is_refused_before_any_rank_starts(tmp_path):
    result = invoke("run", "dist-train-step", "--nproc", "2", "--device", "cpu", "-c", "no-such",
                    "--output-dir", tmp_path)
    assert result.exit_code == 2 and "no-such" in result.output
    assert not (tmp_path / "dist-train-step-llama-tiny-1x32.json").exists()


def test_worker_phase_spans_are_medians_of_consecutive_marks(monkeypatch):
    from kernelbench.ops.dist_train_step import worker

    class Event:  # a CUDA event's elapsed_time without a GPU
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(worker.torch.cuda, "synchronize", lambda *a: None)
    steps = [[(Event(0.0), 0.0), (Event(2.0), 0.001), (Event(5.0), 0.004), (Event(6.0), 0.0045)],
             [(Event(0.0), 0.0), (Event(4.0), 0.003), (Event(9.0), 0.005), (Event(10.0), 0.006)],
             [(Event(0.0), 0.0), (Event(3.0), 0.002), (Event(6.0), 0.006), (Event(8.0), 0.007)]]
    phases = worker.step_phase_ms(steps)
    assert phases == {"forward": 3.0, "backward": 3.0, "optimizer": 1.0,
                      "host_forward": 2.0, "host_backward": 3.0, "host_optimizer": 1.0}
    assert worker.step_phase_ms([]) == {}


def test_worker_writes_a_trace_per_rank_with_profile_dir(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "kernelbench.ops.dist_train_step.worker", "--workload", "llama-tiny-1x32", "--rounds", "1",
           "--warmup-steps", "0", "--reps", "1", "--candidates", BASELINE, "--output", str(out),
           "--profile-dir", str(tmp_path / "prof")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert names == [f"{BASELINE}-rank{r}-{m}.json.gz" for r in (0, 1) for m in ("comm_free", "step")]
    assert "profile" in json.loads(out.read_text())["candidates"][BASELINE]["phase_s"][0]
