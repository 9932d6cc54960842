"""The CLI as a CI job meets it: stdout is no terminal, output is read by scripts, runs are ended
by signals, bad input must give one line and exit 2, and the report folder is an artifact."""

import csv
import io
import json
import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.config import load_suite

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env=env)


def kb(*args, env=None, timeout=300, **kw):
    """`python -m kernelbench ...` in a child process whose stdout is a pipe (no terminal)."""
    full_env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | (env or {})
    return subprocess.run([sys.executable, "-m", "kernelbench", *map(str, args)], cwd=kw.pop("cwd", ROOT),
                          env=full_env, capture_output=True, text=True, timeout=timeout, **kw)


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _tiny_bench(tmp_path, name, *extra):
    out = tmp_path / name
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "--rep-ms", "5",
                    "--warmup-ms", "1", "--output-dir", out, *extra)
    assert result.exit_code == 0, result.output
    return out


# -- 1. readable logs, machine-readable output ---------------------------------------------------
def test_list_in_a_pipe_never_splits_a_name():
    result = kb("list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    hits = [line for line in lines if "triton-8bi" in line]
    assert hits and all("triton-8bit" in line and "adafactor" in line for line in hits)
    # Each candidate's row is one line: its name, its op and its reason on the same line.
    assert any("adam-mini" in line and "torch-adamw-fused" in line and "needs CUDA" in line for line in lines)
    # A narrow $COLUMNS folds only the free text; names stay whole on their row.
    narrow = kb("list", env={"COLUMNS": "60"}).stdout.splitlines()
    assert [line for line in narrow if "triton-8bi" in line] and all(
        "triton-8bit" in line and "adafactor" in line for line in narrow if "triton-8bi" in line)


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_list_formats_for_scripts(fmt):
    result = invoke("list", "--device", "cpu", "--format", fmt)
    assert result.exit_code == 0, result.output
    if fmt == "json":
        rows = json.loads(result.stdout)
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(result.stdout)))
    else:
        assert "| op | candidate |" in result.stdout
        return
    by_name = {(r["op"], r["candidate"]): r for r in rows}
    assert by_name[("adam-mini", "torch-adamw-fused")]["runs here"] == "no: needs CUDA"
    assert all(r["table"] == "candidates" for r in rows)


def test_run_json_output_is_one_object_per_row_and_nothing_else(tmp_path):
    result = kb("run", "adamw", "--device", "cpu", "-w", "tiny", "-m", "step", "-c", "torch-forloop", "-c",
                "torch-foreach", "--rep-ms", "5", "--warmup-ms", "1", "--parity-steps", "1", "--format", "json",
                "-o", tmp_path / "r")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # notes went to stderr
    speed = [r for r in rows if r["table"] == "speed"]
    assert {r["candidate"] for r in speed} == {"torch-forloop", "torch-foreach"}
    assert all(isinstance(r["median ms"], float) for r in speed)
    assert [r["candidate"] for r in rows if r["table"] == "parity"] == ["torch-foreach"]
    assert "Report:" in result.stderr


def test_errors_print_on_one_line():
    result = kb("run", "adamw", "--rounds", "0")
    assert result.returncode == 2
    assert _error_lines(result.stderr) == ["error: --rounds 0: must be at least 1"]


# -- 2. lean reports -----------------------------------------------------------------------------
def test_parity_rows_are_detailed_only_for_failing_and_worst_tensors(tmp_path):
    lean = invoke("parity", "adamw", "-w", "model-tiny", "-m", "step", "-c", "torch-foreach", "--steps", "1",
                  "--device", "cpu", "-o", tmp_path / "lean")
    full = invoke("parity", "adamw", "-w", "model-tiny", "-m", "step", "-c", "torch-foreach", "--steps", "1",
                  "--device", "cpu", "--parity-detail", "full", "-o", tmp_path / "full")
    assert lean.exit_code == 0 and full.exit_code == 0, lean.output + full.output
    lean_rows, full_rows = (pd.read_csv(tmp_path / d / "results.csv") for d in ("lean", "full"))
    every = set(full_rows[full_rows.metric == "parity_max_abs"].tensor)
    shown = set(lean_rows[lean_rows.metric == "parity_max_abs"].tensor)
    assert shown < every and len(shown) <= 9  # 3 worst by each of three measures
    # The worst tensor by relative Frobenius error is among them, so the table's figure holds.
    fro = full_rows[full_rows.metric == "parity_rel_fro"].set_index("tensor")["value"]
    assert fro.idxmax() in shown
    assert "--parity-detail full" in lean_rows[lean_rows.metric == "parity"].message.iloc[0]
    doc = json.loads((tmp_path / "lean" / "run.json").read_text())
    assert "rows" not in doc and doc["summary"]["parity_checks"] == {"pass": 1}
    assert doc["settings"]["parity_detail"] == "worst"


def test_every_failing_tensor_keeps_its_detail(tmp_path):
    result = invoke("parity", "adamw", "-w", "model-tiny", "-c", "torch-fused", "--steps", "1", "--atol", "0",
                    "--rtol", "0", "--device", "cpu", "-o", tmp_path)
    assert result.exit_code == 1, result.output
    rows = pd.read_csv(tmp_path / "results.csv")
    failing = set(rows[(rows.metric == "parity_first_failed_step")].tensor)
    assert failing and failing <= set(rows[rows.metric == "parity_max_abs"].tensor)
    assert (rows[rows.metric == "parity_first_failed_step"].status == "fail").all()


# -- 3. default folder ---------------------------------------------------------------------------
def test_default_report_folder_is_under_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "--rep-ms", "5",
                    "--warmup-ms", "1")
    assert result.exit_code == 0, result.output
    folders = list((tmp_path / "reports").iterdir())
    assert len(folders) == 1 and (folders[0] / "results.csv").is_file()
    assert not (tmp_path / "results").exists()


# -- 4 / 6. signals, orphans, closed pipes ------------------------------------------------------


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc (Linux)")
@pytest.mark.parametrize("how", ["SIGTERM to the parent", "SIGINT to the process group", "SIGKILL to the parent"])
def test_ending_dist_adamw_ends_its_ranks_and_closes_the_report(tmp_path, how, processes_mentioning):
    out = tmp_path / "dist"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelbench",
            "run",
            "dist-adamw",
            "--nproc",
            "2",
            "--device",
            "cpu",
            "-w",
            "tiny",
            "--steps",
            "1000000",
            "-o",
            out,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    marker = str(out / "dist-adamw-tiny.json")  # on torchrun's and every rank's command line
    try:
        # torchrun plus two ranks (their command lines carry the output path).
        assert _wait_for(lambda: len(processes_mentioning(marker)) >= 3, 120), "ranks never started"
        if how.startswith("SIGINT"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _wait_for(lambda: not processes_mentioning(marker), 30), "ranks outlived the parent"
    if how.startswith("SIGKILL"):
        return  # a killed parent closes nothing; what matters is that no rank is left running
    assert proc.returncode == (143 if how.startswith("SIGTERM") else 130), stderr
    assert "interrupted by SIG" in stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["outcome"] == "interrupted" and doc["interruption"] in ("SIGTERM", "SIGINT")
    assert (out / "summary.md").is_file() and (out / "junit.xml").is_file()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc (Linux)")
def test_dist_launch_timeout_kills_every_rank(tmp_path, processes_mentioning):
    from kernelbench.ops.dist_adamw import launch_workload

    output = tmp_path / "dist.json"
    with pytest.raises(RuntimeError, match="no result after"):
        launch_workload(2, "tiny", 1_000_000, output, timeout_s=25, cpu=True)
    assert _wait_for(lambda: not processes_mentioning(str(output)), 30)


def test_sigterm_closes_the_report_like_ctrl_c(tmp_path):
    out = tmp_path / "r"
    # A million parity steps: still running when the signal comes, however loaded the machine.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelbench",
            "parity",
            "adamw",
            "--device",
            "cpu",
            "-w",
            "tiny",
            "-c",
            "torch-foreach",
            "--steps",
            "1000000",
            "-o",
            out,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(lambda: (out / "run.json").is_file(), 120)
        time.sleep(2)  # into the steps
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["outcome"] == "interrupted" and doc["interruption"] == "SIGTERM"
    assert "Interrupted" in (out / "summary.md").read_text() and (out / "junit.xml").is_file()


def test_a_closed_pipe_is_not_a_failure(tmp_path):
    cmd = (
        f"{sys.executable} -m kernelbench run adamw --device cpu -w tiny -c torch-forloop --rep-ms 5 "
        f"--warmup-ms 1 -o {tmp_path / 'r'} | head -1; exit ${{PIPESTATUS[0]}}"
    )
    result = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


# -- 5. dist-adamw and --device ------------------------------------------------------------------
def test_dist_adamw_honours_device_cuda_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    result = invoke("run", "dist-adamw", "--device", "cuda", "-o", tmp_path / "d")
    assert result.exit_code == 2 and "no CUDA device" in result.output


def test_dist_adamw_defaults_to_a_cpu_workload_on_cpu_ranks():
    from kernelbench.ops.dist_adamw import OP
    from kernelbench.ops.dist_adamw import defaults as dist_defaults
    from kernelbench.ops.optimizer_op import workload_numel

    (cpu_workload,), steps = dist_defaults("cpu")
    (gpu_workload,), _ = dist_defaults("cuda")
    assert gpu_workload == "model-370m"
    # Interpreter-sized: a thousandth of model-370m at most (the whole run takes well under a minute).
    assert workload_numel(OP.workloads[cpu_workload]) * 1000 < workload_numel(OP.workloads[gpu_workload])
    assert steps < 50


# -- 7. one line and exit 2 instead of a traceback -----------------------------------------------
@pytest.mark.parametrize(
    "args, expected",
    [
        (("run", "adamw", "--rounds", "0"), "--rounds 0: must be at least 1"),
        (("run", "adamw", "--rounds", "-2"), "--rounds -2: must be at least 1"),
        (("run", "adamw", "--rep-ms", "-1"), "--rep-ms -1: must be greater than 0"),
        (("run", "adamw", "--rep-ms", "0"), "--rep-ms 0: must be greater than 0"),
        (("run", "adamw", "--warmup-ms", "-1"), "--warmup-ms -1: must be at least 0"),
        (("run", "adamw", "--settle-ms", "-5"), "--settle-ms -5: must be at least 0"),
        (("parity", "adamw", "--atol", "-1"), "--atol -1: must be at least 0"),
        (("compare", ".", ".", "--threshold", "-1"), "--threshold -1: must be at least 0"),
        (("run", "dist-adamw", "--bucket-mb", "-1"), "--bucket-mb -1: must be greater than 0"),
        (("run", "adamw", "--steps", "5"), "dist-adamw options only"),
        (("run", "adamw", "--bucket-mb", "3"), "--bucket-mb: dist-adamw, dist-train-step options only"),
        # Owners are named sorted, whatever order the registry loads them in.
        (("run", "adamw", "--nproc", "4"), "--nproc: dist-adamw, dist-train-step options only"),
        (
            ("run", "dist-adamw", "-c", "triton", "--state", "fp8"),
            "-c/--candidate, --state: not accepted by dist-adamw",
        ),
        (("run", "adam-mini", "-c", "triton-fp32", "--state", "fp8"), "has state=fp32, not --state fp8"),
        (("run", "dist-adamw", "--nproc", "0"), "--nproc 0: must be at least 1"),
        (("parity", "dist-adamw"), "times its candidates inside the processes it starts"),
    ],
)
def test_bad_values_exit_2_with_one_line(args, expected, tmp_path):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert len(_error_lines(result.stderr)) == 1 and "Traceback" not in result.output


def test_output_dir_that_cannot_be_a_folder(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for target, expected in (
        (a_file, "is a file"),
        (a_file / "sub", "is a file, so no folder"),
        (Path("/proc/kernelbench-no/r"), "cannot"),
    ):
        result = invoke("run", "adamw", "--device", "cpu", "-w", "tiny", "-c", "torch-forloop", "-o", target)
        assert result.exit_code == 2 and expected in result.output, result.output
        assert len(_error_lines(result.stderr)) == 1


def test_a_usage_error_leaves_no_empty_report_folder(tmp_path):
    for args in (
        ("run", "adamw", "--rounds", "0"),
        ("run", "adamw", "-w", "nope"),
        ("parity", "adamw", "--steps", "0"),
    ):
        result = invoke(*args, "--device", "cpu", "-o", tmp_path / "r")
        assert result.exit_code == 2 and not (tmp_path / "r").exists(), result.output


@pytest.mark.parametrize(
    "body, expected",
    [
        ('[[bench]]\nop = "adamw"\ncandidates = [1]\n', "candidates = [1]: expected a list of strings"),
        ("bench = 5\n", "bench = 5: expected [[bench]] tables"),
        ('[[bench]]\nop = "adamw"\nexclude = "triton"\n', "exclude = 'triton': expected a list of strings"),
        ('[suite]\nrepms = 3\n[[bench]]\nop = "adamw"\n', "unknown key 'repms' in [suite]; accepted:"),
        ("", "no [[bench]] or [[parity]] table"),
        ('[[parity]]\nop = "adamw"\nsteps = 0\n', "[[parity]] #1.steps = 0: must be at least 1"),
        ('[suite]\nrounds = 0\n[[bench]]\nop = "adamw"\n', "[suite].rounds = 0: must be at least 1"),
        ('[[bench]]\nop = "dist-adamw"\ncandidates = ["sharded-zero1"]\n',
         "a [[bench]] table with op, workloads and options only (drop candidates)"),
        ('[[parity]]\nop = "dist-adamw"\n', "a [[bench]] table with op, workloads and options only"),
        ('[[bench]]\nop = "dist-train-step"\nmodes = ["step"]\n',
         "with op, workloads, candidates and options only (drop modes)"),
        ('[[bench]]\nop = "adamw"\noptions = { nproc = 2 }\n', "options are for ops that start processes"),
        ('[[bench]]\nop = "dist-train-step"\noptions = { nprocs = 2 }\n',
         "op 'dist-train-step' has no option 'nprocs'; accepted: nproc, bucket_mb, stall_s"),
        ('[[bench]]\nop = "dist-train-step"\noptions = { nproc = 2.5 }\n', "options.nproc = 2.5: expected an integer"),
        ('[[bench]]\nop = "dist-train-step"\noptions = { nproc = 0 }\n', "options.nproc = 0: must be at least 1"),
        ('[[bench]]\nop = "dist-train-step"\noptions = { stall_s = 0 }\n',
         "options.stall_s = 0: must be greater than 0"),
        ('[[bench]]\nop = "dist-adamw"\noptions = { gather_group = 1 }\n',
         "options.gather_group = 1: expected true or false"),
        ('[[bench]]\nop = "dist-train-step"\noptions = 4\n', "options = 4: expected a table like { nproc = 4 }"),
        ('[[parity]]\nop = "adamw"\noptions = { nproc = 2 }\n', "unknown key 'options' in [[parity]] #1"),
    ],
)
def test_config_errors_are_one_literal_line_naming_the_file(body, expected, tmp_path):
    config = tmp_path / "suite.toml"
    config.write_text(body)
    result = invoke("run", "--config", config)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and str(config) in result.stderr
    assert len(_error_lines(result.stderr)) == 1


def _damaged(tmp_path, base, name, csv_text=None, json_text=None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.csv").write_text(csv_text if csv_text is not None else (base / "results.csv").read_text())
    (folder / "run.json").write_text(json_text if json_text is not None else (base / "run.json").read_text())
    return folder


def test_compare_damaged_reports_exit_2_with_one_line(tmp_path):
    base = _tiny_bench(tmp_path, "base")
    csv_text = (base / "results.csv").read_text()
    header = csv_text.splitlines()[0]
    cases = {
        "garbage": dict(csv_text='a,b\n"1,2\n3,4,5,6\n'),
        "empty": dict(csv_text=""),
        "truncated": dict(csv_text=csv_text[: len(header) + 40]),
        "corrupt-json": dict(json_text="{not json"),
        "list-json": dict(json_text="[1, 2]"),
        "no-rows": dict(csv_text=header + "\n"),
    }
    for name, damage in cases.items():
        folder = _damaged(tmp_path, base, name, **damage)
        result = invoke("compare", base, folder)
        assert result.exit_code == 2, (name, result.output)
        assert len(_error_lines(result.stderr)) == 1 and "Traceback" not in result.output, name


# -- 8. config text printed literally --------------------------------------------------------
def test_config_text_is_not_read_as_markup(tmp_path):
    config = tmp_path / "suite.toml"
    config.write_text('[suite]\nrepms = 3\n[[bench]]\nop = "adamw"\n')
    result = kb("run", "--config", config)
    assert result.returncode == 2 and "in [suite];" in result.stderr


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_every_shipped_suite_loads(config):
    suite = load_suite(ROOT / "configs" / config)
    assert suite.bench or suite.parity


# -- 9. flags that cannot apply, and CLI values over the suite's ---------------------------------
def test_flags_a_suite_cannot_take_are_errors(tmp_path):
    result = invoke(
        "run",
        "--config",
        ROOT / "configs" / "quick.toml",
        "-c",
        "triton",
        "-w",
        "model-370m",
        "-m",
        "fwd",
        "--state",
        "fp8",
        "--telemetry",
    )
    assert result.exit_code == 2
    for flag in ("-c/--candidate", "-w/--workload", "-m/--mode", "--state", "--telemetry"):
        assert flag in result.stderr


def test_a_cli_value_overrides_the_suite_even_when_it_equals_the_default(tmp_path):
    config = tmp_path / "suite.toml"
    config.write_text(
        '[suite]\ndevice = "cpu"\nrounds = 2\nrep_ms = 5\nwarmup_ms = 1\n'
        '[[bench]]\nop = "adamw"\nworkloads = ["tiny"]\nmodes = ["step"]\ncandidates = ["torch-forloop"]\n'
    )
    result = invoke("run", "--config", config, "--rounds", "3", "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "r" / "run.json").read_text())["settings"]
    assert settings["rounds"] == 3 and settings["rep_ms"] == 5


# -- 10. compare on unrelated inputs -------------------------------------------------------------
def test_compare_with_no_common_rows_or_dropped_rows_is_an_error(tmp_path):
    base = _tiny_bench(tmp_path, "base")
    other = tmp_path / "other"
    result = invoke(
        "run",
        "rmsnorm",
        "--device",
        "cpu",
        "-w",
        "64x256-fp32",
        "-c",
        "torch-eager",
        "-m",
        "fwd",
        "--rep-ms",
        "5",
        "--warmup-ms",
        "1",
        "-o",
        other,
    )
    assert result.exit_code == 0, result.output
    unrelated = invoke("compare", base, other)
    assert unrelated.exit_code == 2 and "no rows in common" in unrelated.stderr
    assert invoke("compare", base, other, "--allow-missing").exit_code == 0
    two = _tiny_bench(tmp_path, "two", "-c", "torch-foreach")
    rows = pd.read_csv(two / "results.csv")
    cut = _damaged(tmp_path, two, "cut", csv_text=rows[rows.candidate == "torch-forloop"].to_csv(index=False))
    dropped = invoke("compare", two, cut)
    assert dropped.exit_code == 2 and "missing from NEW" in dropped.stderr and "torch-foreach" in dropped.stderr
    assert invoke("compare", two, cut, "--allow-missing").exit_code == 0


# -- 11. reasons for exit 4 and for nothing measured ---------------------------------------------
def test_skipped_work_says_why(tmp_path):
    no_parity = invoke("parity", "adafactor", "-c", "adafactor8bit", "--device", "cpu", "-o", tmp_path / "p")
    assert no_parity.exit_code == 2 and "'adafactor8bit' is an anchor computing something else" in no_parity.stderr
    nothing = invoke("run", "adam-mini", "-c", "torch-adamw-fused", "--device", "cpu", "-o", tmp_path / "n")
    assert nothing.exit_code == 4 and "torch-adamw-fused: needs CUDA" in nothing.stderr
    untimed = invoke("run", "adamw", "-c", "triton", "-w", "tiny", "--device", "cpu", "-o", tmp_path / "u")
    assert untimed.exit_code == 0 and "nothing was measured" in untimed.stderr


# -- 12. startup without torch -------------------------------------------------------------------
def test_help_list_and_argument_errors_do_not_import_torch():
    probe = (
        "import sys\n"
        "from kernelbench.cli import app\n"
        "for args in (['--help'], ['list', '--device', 'cpu', '--workloads'], ['run', 'adamw', '--rounds', '0'],\n"
        "             ['run', 'adamx'], ['run', '--config', 'no-such.toml'], ['parity', 'adamw', '-w', 'nope'],\n"
        "             ['run', 'rmsnorm', '-m', 'bwd'], ['compare', 'a', 'b', '--threshold', '-1']):\n"
        "    try:\n"
        "        app(args, prog_name='kernelbench')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('LOADED', sorted(m for m in ('torch', 'pandas', 'triton') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "LOADED []" in result.stdout, result.stdout[-500:] + result.stderr[-2000:]


# -- 13. help and README agree ------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, options",
    [
        ("run", ["--parity-steps", "--parity-detail", "--format", "--steps", "dist-adamw only", "Exit codes"]),
        ("parity", ["--steps", "--parity-detail", "--format", "Exit codes"]),
        ("compare", ["--threshold", "--alpha", "--strict", "--force", "--allow-missing", "--output-dir", "print only",
                     "Exit codes"]),
        ("ab", ["--rounds", "--threshold", "--strict", "Exit codes"]),
        ("env", ["--json", "--ceilings"]),
        ("list", ["--workloads", "--format", "Exit codes"]),
    ],
)
def test_help_documents_the_options_and_the_readme_too(command, options):
    text = " ".join(invoke(command, "--help", env={"COLUMNS": "200"}).stdout.split())
    readme = (ROOT / "README.md").read_text()
    for option in options:
        assert option in text, (command, option)
        if option.startswith("--"):
            assert option in readme, (command, option)


# -- 14. the CI workflow ------------------------------------------------------------------------
def test_the_workflow_uses_real_actions_and_its_cpu_part_runs(tmp_path):
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu-bench.yml").read_text())
    steps = workflow["jobs"]["bench"]["steps"]
    uses = {s["uses"].split("@")[0] for s in steps if "uses" in s}
    assert uses <= {"actions/checkout", "actions/upload-artifact", "actions/download-artifact",
                    "actions/cache/restore", "actions/cache/save"}
    by_name = {s.get("name"): s for s in steps}

    # Install: the same pip install, offline into a throwaway venv that sees this one's packages.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    # The throwaway venv sees this interpreter's packages (torch, hatchling...): no download.
    purelib = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = by_name["Install"]["run"]
    assert "pip install -e ." in install
    subprocess.run(
        [venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", ROOT],
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert subprocess.run([venv / "bin" / "kernelbench", "--help"], capture_output=True, timeout=60).returncode == 0

    # The suite and compare steps, verbatim, with a suite of seconds in place of configs/ci.toml.
    suite = tmp_path / "tiny.toml"
    suite.write_text(
        '[suite]\ndevice = "cpu"\nrep_ms = 5\nwarmup_ms = 1\nrounds = 1\n'
        '[[bench]]\nop = "adamw"\nworkloads = ["tiny"]\nmodes = ["step"]\ncandidates = ["torch-forloop"]\n'
        '[[parity]]\nop = "adamw"\nworkloads = ["tiny"]\ncandidates = ["torch-foreach"]\nsteps = 1\n'
    )
    work = tmp_path / "job"
    work.mkdir()
    summary = tmp_path / "step_summary.md"
    env = {
        **os.environ,
        **workflow["jobs"]["bench"]["env"],
        "KB_SUITE": str(suite),
        "GITHUB_STEP_SUMMARY": str(summary),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        # One thread per timed call: on a shared 2-core machine, several make a row's reps spread
        # by 100x, and compare holds so noisy a row to its own spread.
        "OMP_NUM_THREADS": "1",
    }

    def step(name):
        return subprocess.run(
            ["bash", "-eo", "pipefail", "-c", by_name[name]["run"]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # main's last report, as the download step would leave it.
    assert step("Run the CI suite").returncode == 0
    (work / "bench-report").rename(work / "base-report")
    first = step("Run the CI suite")
    assert first.returncode == 0, first.stderr
    assert summary.read_text().count("# kernelbench run: complete") == 2  # summary.md in the job summary
    # Timings of a loaded CPU move by several times between runs: main's report gets this run's rows
    # and samples.
    new_rows = pd.read_csv(work / "bench-report" / "results.csv")
    new_samples = pd.read_csv(work / "bench-report" / "samples.csv.gz")
    new_rows.to_csv(work / "base-report" / "results.csv", index=False)
    new_samples.to_csv(work / "base-report" / "samples.csv.gz", index=False)
    same = step("Compare with main")
    assert same.returncode == 0, same.stderr
    assert "kernelbench compare: main -> this run (exit 0)" in summary.read_text()

    # A slower row fails the job with exit 3 and its table shows in the summary.
    rows = new_rows.copy()
    median, iqr = rows.metric == "time_median_ms", rows.metric == "time_iqr_ms"
    rows.loc[iqr, "value"] = 0.0
    rows.loc[median, "value"] = rows.loc[median, "value"] / 10  # main was 10x faster
    rows.to_csv(work / "base-report" / "results.csv", index=False)
    new_samples.assign(ms=new_samples["ms"] / 10).to_csv(work / "base-report" / "samples.csv.gz", index=False)
    slower = step("Compare with main")
    assert slower.returncode == 3, slower.stderr
    assert "(exit 3)" in summary.read_text() and "| slower |" in summary.read_text()

    # On main: the report goes into the history store the cache keeps.
    assert step("Add this run to the history").returncode == 0
    assert (work / "kb-history" / "history.sqlite").is_file()

    # The ab job, in a clone whose base branch is this commit: both sides time the tiny suite.
    ab_steps = {s.get("name"): s for s in workflow["jobs"]["ab"]["steps"]}
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", ROOT, clone], check=True, timeout=120)
    subprocess.run(["git", "update-ref", "refs/remotes/origin/kb-base", "HEAD"], cwd=clone, check=True)
    ab_env = {**env, **workflow["jobs"]["ab"]["env"], "KB_SUITE": str(suite), "KB_AB_ROUNDS": "1",
              "GITHUB_BASE_REF": "kb-base"}
    ab = subprocess.run(["bash", "-eo", "pipefail", "-c", ab_steps["A/B against the base branch"]["run"]], cwd=clone,
                        env=ab_env, capture_output=True, text=True, timeout=600)
    # One process a side, at least 10 reps each: a verdict per row (which one, the CPU's noise decides).
    assert ab.returncode in (0, 3) and "kernelbench ab: kb-base -> this pull request" in summary.read_text()
    table = pd.read_csv(clone / "ab-report" / "compare.csv")
    assert table.candidate.tolist() == ["torch-forloop"] and table.method.tolist() == ["rank test + bootstrap"]
    assert {p.name for p in (clone / "ab-report").iterdir()} >= {"base-1", "new-1", "ab.json", "ab.md"}


# -- 15. narrow terminals ------------------------------------------------------------------------
def _terminal_output(width):
    from kernelbench.report.output import Output, _Console

    out = Output()
    out.out = _Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None, highlight=False,
                       emoji=False, markup=False)
    return out


def _speed_rows():
    """A speed table as a GPU run prints it: long workload names, every figure column, notes."""
    rows = []
    for w in ("32768x4096-bf16", "llama-1b-8192x8192-bf16"):
        for cand, ms in (("torch-compile", 0.1423), ("triton", 0.1311), ("torch-fused-capturable", 12.5)):
            rows.append({"op": "rmsnorm", "workload": w, "mode": "fwd+bwd", "candidate": cand, "median ms": ms,
                         "IQR %": 1.87, "vs anchor": 0.921, "GB/s": 3012.4, "% copy": 91.3, "peak MB": 1024.0,
                         "status": "ok", "notes": "noisy, host-bound: the host's time per call decides the speed"})
    return rows


@pytest.mark.parametrize("width", [80, 60, 40])
def test_a_narrow_terminal_never_splits_a_number_or_a_name(width):
    out = _terminal_output(width)
    rows = _speed_rows()
    out.table("run: speed", rows, name="speed")
    text = out.out.file.getvalue()
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines), text
    for value in ("0.142", "0.131", "12.5", "1.87", "0.921", "3,012", "91.3", "1,024", "llama-1b-8192x8192-bf16",
                  "torch-fused-capturable", "32768x4096-bf16"):
        assert any(value in line for line in lines), (value, text)
    if width == 80:  # compact: a table per workload, one line per row, constant columns in the title
        assert "run: speed (op rmsnorm, mode fwd+bwd" in text and "workload llama-1b-8192x8192-bf16" in text
        assert sum("torch-fused-capturable" in x and "12.5" in x for x in lines) == 2


def test_list_at_60_columns_fits_and_keeps_names_whole():
    result = kb("list", env={"COLUMNS": "60"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line.rstrip()) <= 60 for line in lines)
    assert any(line.strip() == "adafactor  triton-8bit" for line in lines)
    whole = kb("list").stdout  # no terminal, no $COLUMNS: one row per line at full width
    assert any("adafactor" in line and "triton-8bit" in line and "interpreter" in line for line in whole.splitlines())
