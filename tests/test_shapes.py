"""Workloads written on the command line: shapes and dtypes for function ops (and sweeps over one
of their dimensions), model:NAME and parameter-list files for optimizer ops; bad specs are one
line naming the op's dimensions."""

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.models import CONFIGS, Llama
from kernelbench.ops import get_op
from kernelbench.ops.base import UsageError
from kernelbench.session.plan import resolve_workload

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "250"})


def test_a_shape_spec_is_a_workload_the_op_builds_inputs_for():
    op = get_op("rmsnorm")
    workload = resolve_workload(op, "16x384:bf16")
    assert workload.name == "16x384:bf16" and workload.spec == {"shape": (16, 384), "dtype": "bf16"}
    assert resolve_workload(op, "16x384").name == "16x384:bf16"  # the op's default dtype
    inputs = op.make_inputs(workload, "cpu", torch.Generator().manual_seed(0))
    assert inputs["x"].shape == (16, 384) and inputs["x"].dtype == torch.bfloat16
    rotary = resolve_workload(get_op("rotary"), "2x8x2x16x64:fp32")
    assert rotary.spec == {"batch": 2, "q_heads": 8, "kv_heads": 2, "seq": 16, "head_dim": 64, "dtype": "fp32"}
    assert resolve_workload(op, "64x256-fp32").tier == "cpu"  # names still win


@pytest.mark.parametrize("op, spec, message", [
    ("rmsnorm", "16x384x2:bf16", "-w 16x384x2:bf16: 3 dimension(s) given, 2 expected; op 'rmsnorm' takes "
                                 "MxN[:fp32|bf16|fp16] (M rows (tokens), each of N features normalised)"),
    ("rmsnorm", "16x384:int8", "dtype 'int8' not accepted; op 'rmsnorm' takes MxN[:fp32|bf16|fp16]"),
    ("rmsnorm", "0x384", "-w 0x384: M must be at least 1; op 'rmsnorm' takes MxN"),
    ("rmsnorm", "16x384:", "-w 16x384:: not a shape; op 'rmsnorm' takes MxN"),
    ("rotary", "2x8x16x64", "4 dimension(s) given, 5 expected; op 'rotary' takes BxHqxHkxSxD"),
    ("llama-step", "4x8", "unknown workload of op 'llama-step' '4x8'"),
    ("adamw", "16x384", "or model:NAME (the parameters of a kernelbench.models config) or a FILE of 'NAME SHAPE'"),
])
def test_bad_specs_are_one_line_naming_the_dimensions(op, spec, message):
    with pytest.raises(UsageError) as info:
        resolve_workload(get_op(op), spec)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sweeps_double_or_list_and_name_the_dimensions_when_wrong():
    op = get_op("rmsnorm")
    assert op.sweep("N=256..4096", "1024x512:bf16", "gpu") == [f"1024x{n}:bf16" for n in (256, 512, 1024, 2048, 4096)]
    assert op.sweep("N=100..300", None, "cpu") == ["64x100:fp32", "64x200:fp32", "64x300:fp32"]  # last one kept
    assert op.sweep("M=1,7,33", None, "gpu") == ["1x4096:bf16", "7x4096:bf16", "33x4096:bf16"]
    for bad, message in (("K=1..8", "op 'rmsnorm' has no dimension 'K'; its dimensions: M, N"),
                         ("N=8..2", "expected N=FIRST..LAST (1 <= FIRST <= LAST, doubling) or N=A,B,C"),
                         ("N", "expected DIM=FIRST..LAST or DIM=A,B,C with DIM one of M, N"),
                         ("N=1..1000000000000000000000", "points; at most 64")):
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            op.sweep(bad, None, "cpu")
    with pytest.raises(UsageError, match="op 'adamw' declares no dimensions to sweep"):
        get_op("adamw").sweep("N=1..4", None, "cpu")


def test_model_workloads_are_the_models_parameters():
    workload = resolve_workload(get_op("adam-mini"), "model:llama-tiny")
    config = CONFIGS["llama-tiny"]
    with torch.device("meta"):
        model = Llama(config)
    assert workload.spec["shapes"] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert workload.spec["hyperparams"] == {"dim": config.hidden, "n_heads": config.n_heads,
                                            "n_kv_heads": config.n_kv_heads}
    with pytest.raises(UsageError, match="unknown model \\(-w model:NAME\\) 'llama-70b'"):
        resolve_workload(get_op("adamw"), "model:llama-70b")


def test_parameter_list_files(tmp_path):
    good = tmp_path / "params.txt"
    good.write_text("# a layer\nembed 96x32\nlayers.0.mlp_up  64x32   # the up projection\n48\ndim = 32\n")
    workload = resolve_workload(get_op("adamw"), str(good))
    assert workload.spec == {"shapes": [("embed", (96, 32)), ("layers.0.mlp_up", (64, 32)), ("p2", (48,))],
                             "hyperparams": {"dim": 32}}
    for text, message in (("embed 96y32\n", "params.txt:1: 'embed 96y32': expected 'NAME SHAPE'"),
                          ("dim = many\n", "expected 'KEY = INTEGER'"), ("# nothing\n", "lists no parameter"),
                          ("a 4\na 5\n", "parameter 'a' is listed twice"), ("a 0x4\n", "at least 1")):
        bad = tmp_path / "params.txt"
        bad.write_text(text)
        with pytest.raises(UsageError, match=message):
            resolve_workload(get_op("adamw"), str(bad))


def test_cli_runs_a_shape_and_a_parameter_file_and_sweeps_into_a_plot(tmp_path):
    shaped = invoke("run", "rmsnorm", "-w", "3x100:fp32", "-c", "torch-eager", "-m", "fwd", "--rep-ms", "3",
                    "--warmup-ms", "1", "--device", "cpu", "-o", tmp_path / "a")
    assert shaped.exit_code == 0, shaped.output
    assert set(pd.read_csv(tmp_path / "a" / "results.csv").workload) == {"3x100:fp32"}
    params = tmp_path / "params.txt"
    params.write_text("w 33x17\nb 17\n")
    fileload = invoke("parity", "adamw", "-w", params, "-c", "torch-foreach", "--steps", "2", "--device", "cpu",
                      "-o", tmp_path / "b")
    assert fileload.exit_code == 0, fileload.output
    swept = invoke("run", "rmsnorm", "--sweep", "M=1..8", "-w", "5x64:fp32", "-c", "torch-eager", "-m", "fwd",
                   "--rep-ms", "3", "--warmup-ms", "1", "--device", "cpu", "-o", tmp_path / "c")
    assert swept.exit_code == 0, swept.output
    rows = pd.read_csv(tmp_path / "c" / "results.csv")
    assert list(rows[rows.metric == "time_median_ms"].workload) == ["1x64:fp32", "2x64:fp32", "4x64:fp32",
                                                                     "8x64:fp32"]
    assert (tmp_path / "c" / "sweep-rmsnorm-fwd.png").is_file()
    for args, message in ((["--sweep", "Q=1..4"], "op 'rmsnorm' has no dimension 'Q'; its dimensions: M, N"),
                          (["--sweep", "N=1..4", "-w", "2x2", "-w", "3x3"], "--sweep takes at most one -w"),
                          (["-w", "2x2x2"], "3 dimension(s) given, 2 expected; op 'rmsnorm' takes MxN")):
        bad = invoke("run", "rmsnorm", *args, "--device", "cpu", "-o", tmp_path / "x")
        assert bad.exit_code == 2 and message in " ".join(bad.stderr.split()), bad.stderr
    assert not (tmp_path / "x").exists()
    nosweep = invoke("run", "--sweep", "N=1..4", "--device", "cpu")
    assert nosweep.exit_code == 2 and "--sweep: choose what runs, so they need an op" in nosweep.stderr
