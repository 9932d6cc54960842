"""scripts/before_after.py on the CPU (``--tiny``: the check only, in the Triton interpreter): two
source trees imported side by side in one process, a changed kernel caught, an unchanged one not."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tool(before: Path, *only: str) -> tuple[int, list[dict]]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "before_after.py"), "--before", str(before),
                           "--tiny", "--only", *only], env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows and rows[-1].get("summary"), done.stderr[-3000:]
    return done.returncode, rows


def copy_tree(dest: Path) -> Path:
    shutil.copytree(ROOT / "kernelbench", dest / "kernelbench", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_an_unchanged_tree_is_bit_identical(tmp_path):
    code, rows = run_tool(copy_tree(tmp_path / "same"), "rmsnorm", "newton-schulz", "adamw")
    cases = [row for row in rows if "kind" in row]
    assert code == 0 and cases and all(row["equal"] for row in cases), rows
    assert {row["kind"] for row in cases} == {"rmsnorm", "newton-schulz", "adamw"}


def test_a_changed_kernel_is_caught(tmp_path):
    tree = copy_tree(tmp_path / "changed")
    kernels = tree / "kernelbench" / "nn" / "rmsnorm" / "kernels.py"
    source = kernels.read_text()
    statistic = "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)"
    assert statistic in source
    kernels.write_text(source.replace(statistic, "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / (N + 1) + eps)", 1))
    code, rows = run_tool(tree, "rmsnorm", "swiglu")
    assert code == 1
    by_kind = {}
    for row in rows:
        if "kind" in row:
            by_kind.setdefault(row["kind"], []).append(row["equal"])
    assert not all(by_kind["rmsnorm"]) and all(by_kind["swiglu"]), rows
    assert rows[-1]["differ"] == by_kind["rmsnorm"].count(False)
