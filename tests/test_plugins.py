"""Plugins: ops and candidates from outside kernelbench, through the API the built-in ones use;
loaded from --plugin (a file, a module), a suite's plugins key, or installed entry points; a
broken plugin is one line naming it and what is wrong, and the rest still runs; rows say where
they came from."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.ops import get_op, plugins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_rmsnorm"
runner = CliRunner()

# A candidate joining kernelbench's rmsnorm and a new op, as a plugin file.
GOOD = '''
from kernelbench.ops import Dims, FunctionOp, Workload, get_op


@get_op("rmsnorm").candidate("plugin-eager")
def plugin_eager():
    """torch's F.rms_norm, from a plugin."""
    import torch.nn.functional as F

    return lambda x, weight, eps: F.rms_norm(x, (x.shape[-1],), weight, eps)


def _double(x):
    return x * 2


def _inputs(workload, device, gen):
    import torch

    return {"x": torch.randn(workload.spec["shape"], generator=gen, device=device)}


doubling = FunctionOp("plugin-double", doc="x * 2", workloads=[Workload("8x8", "cpu", {"shape": (8, 8)})],
                      make_inputs=_inputs, reference=_double, outputs=("y",),
                      dims=Dims(("M", "N"), "M x N", example="64x64:fp32", small="8x8:fp32", dtypes=("fp32",),
                                default_dtype="fp32"))


@doubling.candidate("add")
def add():
    """x + x."""
    return lambda x: x + x
'''


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "250"})


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


# -- the loader ------------------------------------------------------------------------------------

def test_a_file_plugin_adds_a_candidate_and_an_op_labelled_with_its_source(tmp_path, registry_sandbox):
    path = _write(tmp_path, "good.py", GOOD)
    plugin = plugins.load(str(path))
    assert plugin.error is None
    assert plugin.ops == ["plugin-double"]
    assert sorted(plugin.candidates) == ["plugin-double/add", "rmsnorm/plugin-eager"]
    assert get_op("rmsnorm").get_candidate("plugin-eager").source == f"plugin:{path}"
    assert get_op("rmsnorm").get_candidate("triton").source == "kernelbench"
    assert get_op("plugin-double").source == f"plugin:{path}"
    assert plugins.load(str(path)) is plugin  # loading it again changes nothing


def test_a_module_plugin_by_name(tmp_path, monkeypatch, registry_sandbox):
    package = tmp_path / "kb_plugin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write(package, "plugin.py", GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = plugins.load("kb_plugin_pkg.plugin")
    assert plugin.error is None and "rmsnorm/plugin-eager" in plugin.candidates
    assert get_op("plugin-double").get_candidate("add").source == "plugin:kb_plugin_pkg.plugin"
    sys.modules.pop("kb_plugin_pkg.plugin", None)
    sys.modules.pop("kb_plugin_pkg", None)


@pytest.mark.parametrize("text, why", [
    ("import no_such_module_kb\n",
     "failed to import: ModuleNotFoundError: No module named 'no_such_module_kb' (at bad.py:1)"),
    (GOOD + '\n@get_op("rmsnorm").candidate("triton")\ndef mine():\n    return None\n',
     "registers a name already taken: candidate 'triton' of op 'rmsnorm' is already registered by kernelbench"),
    (GOOD + '\nFunctionOp("adamw", doc="", workloads=[], make_inputs=_inputs, reference=_double, outputs=("y",))\n',
     "registers a name already taken: op 'adamw' is already declared by kernelbench"),
    (GOOD + '\nget_op("rmsnorm").candidate("my kernel")\n',
     "breaks the plugin API: op 'rmsnorm': candidate name 'my kernel': expected letters, digits and . _ + -"),
    (GOOD + '\nget_op("rmsnorm").candidate("x")(42)\n',
     "breaks the plugin API: rmsnorm/x: @rmsnorm.candidate(...) decorates a factory function, got int"),
    ("x = 1\n", "registers no op and no candidate"),
])
def test_a_broken_plugin_is_one_line_and_leaves_nothing_behind(tmp_path, registry_sandbox, text, why):
    path = _write(tmp_path, "bad.py", text)
    before = {name: set(op.candidates) for name, op in registry_sandbox.items()}
    plugin = plugins.load(str(path))
    assert plugin.error is not None and why in plugin.error, plugin.error
    (line,) = plugins.errors()
    assert line.startswith(f"plugin '{path}' (--plugin {path}): ") and "\n" not in line
    assert {name: set(op.candidates) for name, op in registry_sandbox.items()} == before  # rolled back


def test_a_second_plugin_cannot_take_the_first_ones_names(tmp_path, registry_sandbox):
    first = plugins.load(str(_write(tmp_path, "first.py", GOOD)))
    second = plugins.load(str(_write(tmp_path, "second.py", GOOD)))
    assert first.error is None
    assert "candidate 'plugin-eager' of op 'rmsnorm' is already registered by plugin:" in second.error


def test_the_public_api_refuses_malformed_declarations(registry_sandbox):
    from kernelbench.ops import FunctionOp, Workload
    from kernelbench.ops.base import RegistrationError

    with pytest.raises(RegistrationError, match="workloads must be Workload"):
        FunctionOp("x-op", doc="", workloads=[("a", "cpu")], make_inputs=print, reference=print, outputs=("y",))
    with pytest.raises(RegistrationError, match="tier 'big'; accepted: cpu, gpu"):
        FunctionOp("x-op", doc="", workloads=[Workload("a", "big", {})], make_inputs=print, reference=print,
                   outputs=("y",))
    with pytest.raises(RegistrationError, match="outputs names the results"):
        FunctionOp("x-op", doc="", workloads=[], make_inputs=print, reference=print, outputs="y")
    assert "x-op" not in registry_sandbox


# -- the command line ------------------------------------------------------------------------------

def test_run_with_a_plugin_labels_its_rows_and_records_it(tmp_path, registry_sandbox):
    path = _write(tmp_path, "good.py", GOOD)
    bad = _write(tmp_path, "bad.py", "import no_such_module_kb\n")
    out = tmp_path / "r"
    result = invoke("run", "rmsnorm", "--plugin", path, "--plugin", bad, "-c", "plugin-eager", "-c", "torch-eager",
                    "-w", "64x256-fp32", "-m", "fwd", "--rep-ms", "5", "--warmup-ms", "1", "--parity-steps", "1",
                    "--device", "cpu", "-o", out)
    assert result.exit_code == 0, result.output
    assert f"error: plugin '{bad}' (--plugin {bad}): failed to import: ModuleNotFoundError" in result.stderr
    rows = pd.read_csv(out / "results.csv")
    sources = rows.groupby("candidate")["source"].unique().to_dict()
    assert list(sources["plugin-eager"]) == [f"plugin:{path}"] and list(sources["torch-eager"]) == ["kernelbench"]
    checks = rows[rows.metric.isin(["parity", "output_check"])].set_index(["candidate", "metric"])["status"]
    assert checks[("plugin-eager", "parity")] == "pass" and checks[("plugin-eager", "output_check")] == "pass"
    recorded = {p["name"]: p for p in json.loads((out / "run.json").read_text())["plugins"]}
    assert recorded[str(path)]["candidates"] == ["rmsnorm/plugin-eager", "plugin-double/add"]
    assert recorded[str(path)]["source"] == f"plugin:{path}" and recorded[str(path)]["error"] is None
    assert "No module named 'no_such_module_kb'" in recorded[str(bad)]["error"]


def test_parity_list_and_train_take_plugin(tmp_path, registry_sandbox):
    path = _write(tmp_path, "good.py", GOOD)
    listed = invoke("list", "--device", "cpu", "--plugin", path, "--workloads")
    assert listed.exit_code == 0 and "plugin-double" in listed.output and f"plugin:{path}" in listed.output
    checked = invoke("parity", "plugin-double", "--plugin", path, "-w", "3x5:fp32", "--steps", "2", "--device", "cpu",
                     "-o", tmp_path / "p")
    assert checked.exit_code == 0, checked.output
    trained = invoke("train", "rmsnorm", "--plugin", path, "-c", "plugin-eager", "--steps", "3", "--ref-seeds", "2",
                     "--batch", "2", "--seq", "8", "--device", "cpu", "-o", tmp_path / "t")
    assert trained.exit_code == 0, trained.output
    rows = pd.read_csv(tmp_path / "t" / "results.csv").set_index(["candidate", "metric"])
    assert rows.loc[("plugin-eager", "parity"), "status"] == "pass"
    assert rows.loc[("plugin-eager", "parity"), "source"] == f"plugin:{path}"


def test_a_suite_loads_its_plugins_relative_to_itself_and_sweeps(tmp_path, registry_sandbox):
    (tmp_path / "kernels").mkdir()
    _write(tmp_path / "kernels", "good.py", GOOD)
    suite = _write(tmp_path, "suite.toml", '''
        [suite]
        device = "cpu"
        warmup_ms = 1
        rep_ms = 3
        rounds = 1
        plugins = ["kernels/good.py"]

        [[bench]]
        op = "plugin-double"
        sweep = "N=2..16"

        [[parity]]
        op = "rmsnorm"
        candidates = ["plugin-eager"]
        workloads = ["4x32:fp32"]
        steps = 1
    ''')
    result = invoke("run", "--config", suite, "-o", tmp_path / "s")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "s" / "results.csv")
    timed = rows[(rows.metric == "time_median_ms") & (rows.op == "plugin-double")]
    assert list(timed.workload) == ["8x2:fp32", "8x4:fp32", "8x8:fp32", "8x16:fp32"]
    assert (tmp_path / "s" / "sweep-plugin-double-fwd.png").is_file()
    broken = _write(tmp_path, "broken.toml", '[suite]\nplugins = "kernels/good.py"\n[[bench]]\nop = "adamw"\n')
    result = invoke("run", "--config", broken, "-o", tmp_path / "b")
    assert result.exit_code == 2 and "[suite].plugins = 'kernels/good.py': expected a list of strings" in result.stderr


def test_fsdp_ranks_take_installed_plugins_only(tmp_path, registry_sandbox):
    path = _write(tmp_path, "good.py", GOOD)
    for args in (["parity", "adamw", "--fsdp"], ["train", "adamw", "--fsdp"]):
        result = invoke(*args, "--plugin", path, "--device", "cpu", "-o", tmp_path / "x")
        assert result.exit_code == 2 and "--plugin does not reach --fsdp's ranks: install the plugin's package" \
            in result.stderr, result.output
    swept = invoke("parity", "adamw", "--fsdp", "--sweep", "N=1..2", "--device", "cpu")
    assert swept.exit_code == 2 and "--sweep does not apply under --fsdp" in swept.stderr
    assert not (tmp_path / "x").exists()


def test_a_plugin_that_does_not_load_is_named_once_and_the_suite_still_runs(tmp_path, registry_sandbox):
    bad = _write(tmp_path, "bad.py", "import no_such_module_kb\n")
    suite = _write(tmp_path, "suite.toml", '''
        [suite]
        device = "cpu"
        warmup_ms = 1
        rep_ms = 3
        rounds = 1
        plugins = ["bad.py", "missing.py"]

        [[bench]]
        op = "rmsnorm"
        candidates = ["torch-eager"]
        workloads = ["4x32:fp32"]
        modes = ["fwd"]
    ''')
    result = invoke("run", "--config", suite, "--plugin", bad, "-o", tmp_path / "s")
    assert result.exit_code == 0, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: plugin")]
    assert len(errors) == 2, errors
    assert "failed to import: ModuleNotFoundError" in errors[0]
    assert errors[1] == f"error: plugin 'missing.py' (suite {suite} {tmp_path / 'missing.py'}): no such file: " \
                        f"{tmp_path / 'missing.py'}"


# -- entry points ------------------------------------------------------------------------------------

def _fake_install(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """What pip install leaves for importlib.metadata: a dist-info with METADATA and entry points."""
    dist = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[kernelbench.plugins]\n{lines}")


def _kernelbench(args: list[str], pythonpath: list[Path], probe: str = "") -> subprocess.CompletedProcess:
    code = (f"import sys\nfrom kernelbench.cli import app\ntry:\n    app({args!r}, prog_name='kernelbench')\n"
            f"except SystemExit:\n    pass\n{probe}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_installed_entry_points_load_lazily_and_list_stays_free_of_torch(tmp_path):
    site = tmp_path / "site"
    _write(site, "kb_ep_good.py", GOOD)
    _write(site, "kb_ep_bad.py", "raise RuntimeError('cannot work here')\n")
    _fake_install(site, "kb-ep-good", {"good": "kb_ep_good"})
    _fake_install(site, "kb-ep-bad", {"bad": "kb_ep_bad"})
    probe = "print('LOADED', sorted(m for m in ('torch', 'triton', 'kb_ep_good') if m in sys.modules))\n"
    listed = _kernelbench(["list", "--device", "cpu"], [site], probe)
    assert "plugin-double" in listed.stdout and "plugin:good" in listed.stdout
    assert ("error: plugin 'bad' (entry point kb_ep_bad from kb-ep-bad 0.1.0): failed to import: RuntimeError: "
            "cannot work here (at kb_ep_bad.py:1)") in " ".join(listed.stderr.split())
    assert "LOADED ['kb_ep_good']" in listed.stdout, listed.stdout[-300:] + listed.stderr[-2000:]
    helped = _kernelbench(["--help"], [site], probe)
    assert "LOADED []" in helped.stdout  # --help imports no plugin


def test_the_example_package_declares_its_plugin_as_an_entry_point(tmp_path):
    """examples/my_rmsnorm's pyproject entry point, installed as pip would (into a fake site on
    PYTHONPATH): `kernelbench run rmsnorm --device cpu` finds its candidate and its op."""
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]["kernelbench.plugins"]
    assert declared == {"my_rmsnorm": "my_rmsnorm.plugin"}
    site = tmp_path / "site"
    _fake_install(site, "my-rmsnorm", declared)
    out = tmp_path / "r"
    ran = _kernelbench(["run", "rmsnorm", "--device", "cpu", "-c", "my-triton", "-c", "torch-eager", "-w",
                        "64x256-fp32", "--parity-steps", "1", "--rep-ms", "5", "--warmup-ms", "1", "-o", str(out)],
                       [site, EXAMPLE / "src"])
    rows = pd.read_csv(out / "results.csv")
    check = rows[(rows.candidate == "my-triton") & (rows.metric == "parity")]
    assert list(check.status) == ["pass", "pass"] and set(check.source) == {"plugin:my_rmsnorm"}, ran.stderr[-2000:]
    listed = _kernelbench(["list", "--device", "cpu"], [site, EXAMPLE / "src"])
    assert "add-silu" in listed.stdout and "my-triton" in listed.stdout
