"""The CLI on a GPU machine: list probes CUDA there, and --format json carries measured times."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def kb(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TRITON_INTERPRET")}
    return subprocess.run([sys.executable, "-m", "kernelbench", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_list_probes_cuda_where_a_gpu_is():
    result = kb("list", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {(r["op"], r["candidate"]): r for r in json.loads(result.stdout)}
    assert rows[("adamw", "torch-fused")]["runs here"] == "yes"
    assert rows[("adamw", "triton")]["runs here"] == "yes"


def test_run_json_on_the_gpu_has_times_and_a_lean_report(tmp_path):
    result = kb("run", "adamw", "-w", "single-4096x1024", "-c", "torch-fused", "-c", "triton", "--rep-ms", "30",
                "--parity-steps", "3", "--format", "json", "-o", tmp_path)
    assert result.returncode == 0, result.stderr
    speed = [r for r in json.loads(result.stdout) if r["table"] == "speed"]
    assert {r["candidate"] for r in speed} == {"torch-fused", "triton"}
    assert all(r["median ms"] > 0 for r in speed)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert "rows" not in doc and doc["environment"]["device"] == "cuda"
