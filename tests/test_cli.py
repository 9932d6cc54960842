"""Every CLI verb through typer's CliRunner: exit codes, messages and the files written."""

import json
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.harness.rows import ROW_FIELDS

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


def test_list_shows_every_op_and_why_a_candidate_cannot_run():
    result = invoke("list", "--device", "cpu", "--workloads")
    assert result.exit_code == 0, result.output
    for op in ("adamw", "adam-mini", "muon-ns", "rmsnorm", "rotary"):
        assert op in result.output
    assert "needs CUDA" in result.output  # torch-adamw-fused in adam-mini
    assert "model-370m" in result.output and "llama-tiny" in result.output
    assert "dist-adamw" in result.output and "Gloo" in result.output


def test_run_writes_the_report_files(tmp_path):
    out = tmp_path / "r"
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "--rep-ms", "5", "--warmup-ms", "1",
                    "--parity-steps", "2", "--output-dir", out)
    assert result.exit_code == 0, result.output
    # plus the plots (ratios to the anchor) when matplotlib is installed
    assert {p.name for p in out.iterdir() if p.suffix != ".png"} == {
        "results.csv",
        "run.json",
        "summary.md",
        "junit.xml",
        "samples.csv.gz",
        "rounds.csv",
    }
    samples = pd.read_csv(out / "samples.csv.gz")
    reps = samples[samples.metric == "time_median_ms"].groupby("candidate").size()
    rows = pd.read_csv(out / "results.csv")
    counted = rows[rows.metric == "reps"].set_index("candidate")["value"]
    assert reps.to_dict() == counted.astype(int).to_dict()  # every timed rep kept
    assert list(rows.columns) == list(ROW_FIELDS)
    medians = rows[rows.metric == "time_median_ms"].set_index("candidate")
    assert medians.loc["torch-forloop", "status"] == "ok" and medians.loc["torch-forloop", "value"] > 0
    # AdamW state: exp_avg and exp_avg_sq (8 bytes per param) plus a 0-d step per tensor.
    numel = 64 * 48 + 48 + 33 * 17 + 1
    state = rows[rows.metric == "state_bytes"].set_index("candidate")["value"]
    assert ((state >= 8 * numel) & (state <= 8 * numel + 8 * 4)).all(), state
    meta = json.loads((out / "run.json").read_text())
    assert meta["outcome"] == "complete" and meta["environment"]["device"] == "cpu"
    # run.json is the fingerprint and a summary; the rows are in results.csv only.
    assert "rows" not in meta and meta["summary"]["rows"] == len(rows)
    cases = ET.parse(out / "junit.xml").getroot().iter("testcase")
    assert {c.get("name") for c in cases} >= {"tiny/step/torch-foreach", "tiny/step/torch-fused"}
    assert "## Speed" in (out / "summary.md").read_text()


def test_settle_ms_runs_untimed_rounds_first_and_is_recorded(tmp_path):
    out = tmp_path / "r"
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "--rep-ms", "5",
                    "--warmup-ms", "1", "--settle-ms", "5", "--output-dir", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["settings"]["settle_ms"] == 5
    rows = pd.read_csv(out / "results.csv")
    median = rows[(rows.metric == "time_median_ms") & (rows.candidate == "torch-forloop")].iloc[0]
    assert median.status == "ok" and "untimed settling rounds" in median.message


def test_parity_exit_code_1_when_a_check_fails(tmp_path):
    # torch's fused AdamW differs from the for-loop one by rounding: zero tolerance fails it.
    result = invoke(
        "parity",
        "adamw",
        "--steps",
        "2",
        "-w",
        "tiny",
        "-c",
        "torch-fused",
        "--atol",
        "0",
        "--rtol",
        "0",
        "--device",
        "cpu",
        "--output-dir",
        tmp_path,
    )
    assert result.exit_code == 1, result.output
    assert "parity failed" in result.output
    failure = ET.parse(tmp_path / "junit.xml").getroot().find(".//failure")
    assert failure is not None and "step 0" in failure.get("message")


def test_parity_passes_within_the_op_tolerance(tmp_path):
    result = invoke(
        "parity",
        "adamw",
        "--steps",
        "3",
        "-w",
        "tiny",
        "-c",
        "torch-foreach",
        "-c",
        "torch-fused",
        "--device",
        "cpu",
        "--parity-detail",
        "full",
        "--output-dir",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    per_tensor = rows[rows.metric == "parity_max_abs"]
    assert set(per_tensor.tensor) >= {"w0", "w0.exp_avg", "w0.exp_avg_sq", "b0.exp_avg"}


@pytest.mark.parametrize(
    "args, expected",
    [
        (("run", "adamx"), "Did you mean 'adamw'"),
        (("run", "adamw", "-c", "torch-fusd"), "Did you mean 'torch-fused'"),
        (("run", "adamw", "-w", "model-37m"), "Did you mean 'model-370m'"),
        (("run", "adam-mini", "--state", "fp9"), "accepted: fp32, bf16, fp8"),
        (("run", "adamw", "--state", "fp8"), "has no option --state"),
        (("parity", "rmsnorm", "--steps", "0"), "at least 1"),
        (("run", "adamw", "--device", "tpu"), "accepted values are cpu, cuda, auto"),
    ],
)
def test_bad_input_exits_2_naming_what_is_accepted(args, expected, tmp_path):
    result = invoke(*args, "--output-dir", tmp_path / "x") if args[0] != "list" else invoke(*args)
    assert result.exit_code == 2, result.output
    assert expected in result.output


def test_config_errors_name_the_file_key_and_accepted_values(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\nrep_ms = 10\nrepeat = 3\n[[bench]]\nop = "adamw"\n')
    result = invoke("run", "--config", bad)
    assert result.exit_code == 2
    assert str(bad) in result.output and "'repeat'" in result.output and "rep_ms" in result.output
    bad.write_text('[[bench]]\nop = "adamw"\nworkloads = ["tiny"]\ncandidate = ["torch-fused"]\n')
    result = invoke("run", "--config", bad)
    assert result.exit_code == 2 and "'candidate'" in result.output and "candidates" in result.output
    bad.write_text('[[bench]]\nop = "rmsnrm"\n')
    result = invoke("run", "--config", bad)
    assert result.exit_code == 2 and "Did you mean 'rmsnorm'" in result.output


def test_exit_4_when_no_requested_candidate_can_run(tmp_path):
    result = invoke("run", "adam-mini", "-c", "torch-adamw-fused", "--device", "cpu", "--output-dir", tmp_path)
    assert result.exit_code == 4, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    assert (rows.status == "skipped").all() and rows.message.str.contains("needs CUDA").all()


def _bench(tmp_path, name):
    out = tmp_path / name
    result = invoke(
        "run",
        "adamw",
        "--device",
        "cpu",
        "-w",
        "tiny",
        "-c",
        "torch-forloop",
        "--rep-ms",
        "5",
        "--warmup-ms",
        "1",
        "--output-dir",
        out,
    )
    assert result.exit_code == 0, result.output
    return out


def test_compare_same_run_is_clean_and_a_slower_row_is_exit_3(tmp_path):
    base = _bench(tmp_path, "base")
    same = invoke("compare", base, base, "--output-dir", tmp_path / "cmp")
    assert same.exit_code == 0, same.output
    assert (tmp_path / "cmp" / "compare.csv").is_file()
    # Crafted rows without samples (as reports before they were kept): the IQR rule judges them.
    # A quiet base (IQR 1% of the median) and the same row 3x slower.
    rows = pd.read_csv(base / "results.csv")
    is_median, is_iqr = rows.metric == "time_median_ms", rows.metric == "time_iqr_ms"
    rows.loc[is_iqr, "value"] = rows.loc[is_median, "value"].to_numpy() * 0.01
    rows.to_csv(base / "results.csv", index=False)
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "run.json").write_text((base / "run.json").read_text())
    rows.loc[is_median, "value"] = rows.loc[is_median, "value"] * 3
    rows.to_csv(slow / "results.csv", index=False)
    result = invoke("compare", base, slow)
    assert result.exit_code == 3, result.output
    assert "1 slower: adamw/tiny/step/torch-forloop" in result.output
    assert "1 row(s) judged by the IQR rule" in result.output and "IQR rule (no samples)" in result.output
    noisy = rows.copy()
    noisy.loc[is_iqr, "value"] = noisy.loc[is_median, "value"].to_numpy() * 5  # IQR 5x the median
    noisy.to_csv(slow / "results.csv", index=False)
    assert invoke("compare", base, slow).exit_code == 0  # a 3x change inside that noise is no verdict


def test_compare_refuses_other_gpus_unless_forced(tmp_path):
    base = _bench(tmp_path, "base")
    other = tmp_path / "other"
    other.mkdir()
    meta = json.loads((base / "run.json").read_text())
    meta["environment"]["gpu_name"] = "NVIDIA H200"
    (other / "run.json").write_text(json.dumps(meta))
    (other / "results.csv").write_text((base / "results.csv").read_text())
    refused = invoke("compare", base, other)
    assert refused.exit_code == 2 and "gpu_name" in refused.output and "--force" in refused.output
    assert invoke("compare", base, other, "--force").exit_code == 0
    assert invoke("compare", base, tmp_path / "missing").exit_code == 2


def test_env_prints_the_fingerprint_as_json():
    result = invoke("env", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    for key in ("torch", "triton", "python", "kernelbench", "git_sha", "utc_time", "seed", "command_line"):
        assert key in info


def test_default_run_without_cuda_runs_the_cpu_suite(tmp_path):
    result = invoke("run", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "quick.toml" in result.output and "CPU suite" in result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    assert set(rows.op) >= {"adamw", "rmsnorm", "rotary", "muon-ns"}
    triton_times = rows[(rows.metric == "time_median_ms") & rows.candidate.str.startswith("triton")]
    assert not triton_times.empty and triton_times.value.isna().all()  # never a number
    assert set(triton_times.status) <= {"not-measured", "skipped"}  # skipped: Hopper-only (needs CUDA)
    assert (triton_times.status == "not-measured").any()
    # Lean by construction: per-tensor parity rows for the worst few tensors of each check only.
    per_check = rows[rows.metric == "parity_max_abs"].groupby(["op", "workload", "mode", "candidate"]).tensor.nunique()
    assert not per_check.empty and (per_check <= 9).all()
    assert "rows" not in json.loads((tmp_path / "run.json").read_text())


def test_every_op_module_imports():
    from kernelbench.ops import LOAD_ERRORS, load_all

    load_all()
    assert LOAD_ERRORS == {}


def test_telemetry_rows_come_from_the_optimizer(tmp_path):
    result = invoke(
        "run",
        "adam-mini",
        "--state",
        "fp8",
        "-c",
        "triton-fp8",
        "--device",
        "cpu",
        "-w",
        "llama-tiny",
        "--telemetry",
        "--output-dir",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    tele = rows[rows.metric.str.startswith("telemetry_")]
    assert {"telemetry_max_update", "telemetry_max_m", "telemetry_scale_max"} <= set(tele.metric)
    assert "model.layers.0.self_attn.q_proj.weight" in set(tele.tensor)
    assert (tele[tele.metric == "telemetry_max_m"].value > 0).all()
    assert tele.message.str.contains("state_dtype=").all()


def test_autoselect_answers_without_cuda_and_rejects_bad_shapes():
    ok = invoke("autoselect", "rmsnorm", "--shape", "16x2048x4096", "--dtype", "bf16")
    assert ok.exit_code == 0, ok.output
    assert "choice: torch" in ok.output and "no CUDA" in ok.output
    assert invoke("autoselect", "rmsnorm", "--shape", "16xabc").exit_code == 2
    assert invoke("autoselect", "rmsnorm", "--shape", "8x64", "--dtype", "fp64").exit_code == 2
    assert invoke("autoselect", "layernorm", "--shape", "8x64").exit_code == 2


def test_dist_adamw_runs_two_ranks_through_torchrun(tmp_path):
    result = invoke(
        "run", "dist-adamw", "--nproc", "2", "--steps", "2", "-w", "tiny", "--gather-group", "--output-dir", tmp_path
    )
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    assert rows["mode"].str.endswith("all-gathers on a second communicator").all()
    medians = rows[rows.metric == "time_median_ms"].set_index("candidate")
    # CPU ranks: the Triton shard update ran in the interpreter, so it has no time; torch's has one.
    assert medians.loc["sharded-zero1", "status"] == "not-measured"
    assert medians.loc["allreduce+torch-fused", "status"] == "ok"
    assert (tmp_path / "dist-adamw-tiny.json").is_file()
    assert rows[rows.metric == "parity_max_rel_vs_allreduce_fused"].value.iloc[0] <= 1e-6


def test_a_suite_runs_dist_adamw_through_the_registry(tmp_path):
    suite = tmp_path / "dist.toml"
    suite.write_text('[suite]\ndevice = "cpu"\n[[bench]]\nop = "dist-adamw"\nworkloads = ["tiny"]\n')
    result = invoke("run", "--config", suite, "--output-dir", tmp_path / "r")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "r" / "results.csv")
    assert set(rows.op) == {"dist-adamw"} and set(rows.workload) == {"tiny"}
    medians = rows[rows.metric == "time_median_ms"].set_index("candidate")
    assert medians.loc["allreduce+torch-fused", "status"] == "ok"


# -- the closing lines and messages that say what happened ---------------------------------------
def test_every_run_ends_with_a_tally(tmp_path):
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "-c", "triton",
                    "--rep-ms", "5", "--warmup-ms", "1", "--parity-steps", "1", "--output-dir", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "2 ok, 0 failed, 0 skipped, 1 not measured"
    failed = invoke("parity", "adamw", "--steps", "1", "-w", "tiny", "-c", "torch-fused", "--atol", "0", "--rtol",
                    "0", "--device", "cpu", "--output-dir", tmp_path / "p")
    assert failed.exit_code == 1 and failed.stdout.strip().splitlines()[-1] == "0 ok, 1 failed, 0 skipped"
    nothing = invoke("run", "adam-mini", "-w", "llama-tiny", "-c", "torch-adamw-fused", "--device", "cpu",
                     "--output-dir", tmp_path / "n")
    assert nothing.exit_code == 4 and nothing.stdout.strip().splitlines()[-1] == "0 ok, 0 failed, 1 skipped"


def test_autoselect_without_cuda_says_nothing_was_measured_or_cached(tmp_path):
    result = runner.invoke(app, ["autoselect", "rmsnorm", "--shape", "16x2048x4096"], catch_exceptions=False,
                           env={"COLUMNS": "200", "KERNELBENCH_CACHE_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "source: measured" not in result.output and "not measured, so nothing was cached" in result.output
    assert "cache:" not in result.output and not list(tmp_path.iterdir())


def test_autoselect_names_the_cache_file_only_where_it_exists(tmp_path):
    from kernelbench.cli import _autoselect_source

    cache = tmp_path / "autoselect.json"
    report = {"source": "measured", "measured": True, "cache_file": str(cache)}
    assert "not cached" in _autoselect_source(report) and "cache:" not in _autoselect_source(report)
    cache.write_text("{}")
    assert _autoselect_source(report) == f"source: measured now; cache: {cache}"
    assert _autoselect_source({**report, "source": "file"}).startswith("source: the cache file")


def test_compare_without_run_json_says_so(tmp_path):
    base = _bench(tmp_path, "base")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "results.csv").write_text((base / "results.csv").read_text())
    refused = invoke("compare", base, bare)
    assert refused.exit_code == 2, refused.output
    assert f"NEW {bare} has no run.json" in refused.output and "different environments" not in refused.output
    forced = invoke("compare", base, bare, "--force")
    assert forced.exit_code == 0 and "has no run.json" in forced.output


def test_dist_adamw_parity_reaches_the_tables_and_junit(tmp_path):
    result = invoke("run", "dist-adamw", "--nproc", "2", "--steps", "1", "-w", "tiny", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "run: parity" in result.output and "elements within atol" in result.output
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    (case,) = suite.iter("testcase")
    assert case.get("classname") == "kernelbench.parity.dist-adamw" and case.get("name").endswith("/sharded-zero1")


def test_a_failing_dist_adamw_parity_row_fails_the_run(tmp_path, monkeypatch):
    from kernelbench.ops import dist_adamw

    result = {"op": "dist-adamw", "workload": "tiny", "world_size": 2, "bucket_mb": 256.0, "gather_group": True,
              "timing": "host clock; CPU ranks on Gloo, kernels in the Triton interpreter: not a measurement",
              "metrics_ms": {m: {"median": 1.0, "p25": 1.0, "p75": 1.0, "iqr": 0.0, "min": 1.0, "reps": 1}
                             for m in dist_adamw.METRICS},
              "state_bytes_per_rank": {"sharded": {"allocated_delta": [None]},
                                       "allreduce_fused": {"allocated_delta": [None]}},
              "parity": {"after_steps": 1, "max_abs_diff": 1e-3, "max_rel_diff": 1e-3, "rel_floor": 1e-3,
                         "atol": 1e-6, "rtol": 1e-5, "n_outside": 7, "numel": 100}}
    monkeypatch.setattr(dist_adamw, "launch_workload", lambda *args, **kwargs: result)
    failed = invoke("run", "dist-adamw", "-w", "tiny", "--output-dir", tmp_path)
    assert failed.exit_code == 1, failed.output
    assert "parity failed: dist-adamw/tiny/" in failed.output
    failure = ET.parse(tmp_path / "junit.xml").getroot().find(".//failure")
    assert "7 of 100 elements outside atol 1e-06, rtol 1e-05" in failure.get("message")


def test_config_validation_reports_every_bad_value(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\nrounds = 0\nrep_ms = -1\ncolour = "red"\n'
                   '[[bench]]\nop = "adamw"\nworkloads = ["tiny", "huge"]\ncandidates = ["torch-fusd"]\n'
                   '[[parity]]\nop = "rmsnrm"\nsteps = 0\n')
    result = invoke("run", "--config", bad)
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    for expected in ("7 problems", "[suite].rounds = 0: must be at least 1",
                     "[suite].rep_ms = -1: must be greater than 0", "unknown key 'colour' in [suite]", "'huge'",
                     "Did you mean 'torch-fused'",
                     "[[parity]] #1.steps = 0", "Did you mean 'rmsnorm'"):
        assert expected in line, expected
