"""The GPU proof of compare's and ab's verdicts, in one call of under 8 minutes on one H100.

1. ``ci-lean`` twice at this commit, then ``compare``: no row may be ``slower``. ci-lean is every
   [[bench]] table of configs/ci.toml without the torch-compile candidates (Inductor compiling on a
   fresh machine would take most of the budget, twice) and with muon-ns on the two workloads its
   [[parity]] table checks instead of six.
2. A triton candidate slowed by 5% of its own time (KERNELBENCH_TEST_SLOWDOWN, a test hook of the
   runner) against a run of its own without the hook, ``--threshold 0.02``, for two rows:
   TritonAdamW's step on model-370m (device-bound: expected ``slower`` by about 1.05) and
   RMSNorm 32768x4096 fwd+bwd (whose host time is near its device time, so it may be flagged
   host-bound, and one process a side may then only say ``inconclusive``).
3. The RMSNorm row in one job: ``kernelbench ab`` with two Python wrappers, one plain and one
   setting the hook, two processes each, alternating.
4. tests/gpu/test_gpustate_gpu.py: NVML reads this GPU and a run records it per round.

Steps run in that order while the budget lasts (``STATS_PROOF_BUDGET_S``, default 480 s); one that
would not fit is skipped and SUMMARY.md says so. Writes ``$OUT/stats-proof/``: the report folders,
the compare and ab outputs, a log per step, ci-lean.toml and SUMMARY.md. Never passes
--lock-clocks: the clocks stay as they are.

From the repository root on the GPU machine (gpu_run.sh installs the carried peer wheels):

    KERNELBENCH_GIT_SHA=<commit> scripts/gpu_run.sh env py:scripts/stats_proof.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernelbench.config import tomllib  # noqa: E402
from kernelbench.ops import get_op  # noqa: E402
from kernelbench.session.ab import toml_value  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/kb-out")) / "stats-proof"
BUDGET_S = float(os.environ.get("STATS_PROOF_BUDGET_S", "480"))
# The slowed rows (op, workload, mode, candidate), each by 5% of its own time, and what times them.
SLOWED_CASES = {
    "adamw": (("adamw", "model-370m", "step", "triton"),
              ["adamw", "-w", "model-370m", "-m", "step", "-c", "triton", "-c", "torch-fused"]),
    "rmsnorm": (("rmsnorm", "32768x4096-bf16", "fwd+bwd", "triton"),
                ["rmsnorm", "-w", "32768x4096-bf16", "-m", "fwd+bwd", "-c", "triton", "-c", "torch-rms-norm"]),
}
AB_CASE = "rmsnorm"
SLOWED_ROUNDS = 12


def slowed_spec(row: tuple[str, ...]) -> str:
    return "/".join(row) + "=0.05"
START = time.monotonic()
summary: list[str] = []


def lean_suite(dest: Path) -> Path:
    doc = tomllib.loads((ROOT / "configs" / "ci.toml").read_text())
    lines = ["# configs/ci.toml's [[bench]] tables, no torch-compile, muon-ns on its two parity workloads", "",
             "[suite]"] + [f"{k} = {toml_value(v)}" for k, v in doc["suite"].items()]
    muon_parity = next(t["workloads"] for t in doc["parity"] if t["op"] == "muon-ns")
    for table in doc["bench"]:
        table = dict(table)
        if table["op"] == "muon-ns":
            table["workloads"] = muon_parity
        if "torch-compile" in get_op(table["op"]).candidates:
            table["exclude"] = sorted(set(table.get("exclude", [])) | {"torch-compile"})
        lines += ["", "[[bench]]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def step(name: str, command: list[str], cap_s: float, env: dict | None = None, reserve_s: float = 30) -> int | None:
    """Runs one command into logs/<name>.log within the budget; None when it was skipped."""
    left = BUDGET_S - (time.monotonic() - START) - reserve_s
    limit = min(cap_s, left)
    if limit < 15:
        summary.append(f"- {name}: skipped, {left + reserve_s:.0f} s of the budget left")
        return None
    t0 = time.monotonic()
    with open(OUT / "logs" / f"{name}.log", "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        # A session of its own, so that a step cut off takes its children (ab's processes) with it.
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = 124
    summary.append(f"- {name}: exit {code} in {time.monotonic() - t0:.0f} s (limit {limit:.0f} s): "
                   f"`{' '.join(command[2:])}`")
    print(summary[-1], flush=True)
    return code


def kb(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelbench", *args]


def verdicts(folder: Path) -> pd.DataFrame | None:
    path = folder / "compare.csv"
    return pd.read_csv(path) if path.is_file() else None


def describe(title: str, table: pd.DataFrame | None, focus: str | None = None) -> None:
    if table is None:
        summary.append(f"\n### {title}\n\nno comparison written (see the step's log)")
        return
    counts = table["verdict"].value_counts().to_dict()
    summary.append(f"\n### {title}\n\n{len(table)} rows: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    shown = table if focus is None else table[table["candidate"] == focus]
    interesting = shown if focus else shown[shown["verdict"] != "same"]
    for r in interesting.itertuples():
        summary.append(f"- {r.op} {r.workload} {r.mode} {r.candidate}: {r.verdict}, ratio {r.ratio:.4f}, "
                       f"interval [{r.low:.4f}, {r.high:.4f}], p {r.p:.2g}, threshold {r.threshold:.3g}: {r.why}")


def slowdown_expected(row: tuple[str, ...], slowed_report: Path, base_report: Path) -> tuple[float | None, str]:
    """The ratio the hook should give, (base median + inserted delay) / base median, and how it
    was found."""
    try:
        rows = pd.read_csv(slowed_report / "results.csv")
        base = pd.read_csv(base_report / "results.csv")
    except OSError:
        return None, "unknown (a report is missing)"
    op, workload, mode, candidate = row
    pick = (rows.metric == "test_slowdown_ms") & (rows.candidate == candidate) & (rows["mode"] == mode)
    lead = ((base.metric == "time_median_ms") & (base.op == op) & (base.workload == workload)
            & (base.candidate == candidate) & (base["mode"] == mode))
    if not pick.any() or not lead.any():
        return None, "unknown (no test_slowdown_ms or base row)"
    delay, median = float(rows[pick].value.iloc[0]), float(base[lead].value.iloc[0])
    expected = (median + delay) / median
    return expected, f"{expected:.4f} (delay {delay * 1e3:.1f} us on a {median * 1e3:.1f} us call)"


def slowed_verdict(row: tuple[str, ...], table: pd.DataFrame | None, expected: float | None) -> str:
    """PASS when the slowed row is slower, its ratio within 0.02 of the expected one."""
    if table is None:
        return "not run"
    _, workload, mode, candidate = row
    row = table[(table["candidate"] == candidate) & (table["mode"] == mode) & (table["workload"] == workload)]
    if row.empty:
        return f"FAIL: no {candidate} {mode} row"
    r = row.iloc[0]
    near = expected is not None and abs(r.ratio - expected) <= 0.02
    ok = r.verdict == "slower" and near
    return (f"{'PASS' if ok else 'FAIL'}: {candidate} {r.verdict}, ratio {r.ratio:.4f} against expected "
            f"{'unknown' if expected is None else f'{expected:.4f}'}, interval [{r.low:.4f}, {r.high:.4f}]")


def size_kb(path: Path) -> str:
    if not path.exists():
        return "absent"
    total = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    return f"{total / 1024:.0f} KB"


def main() -> int:
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    suite = lean_suite(OUT / "ci-lean.toml")
    a, b = OUT / "ci-lean-1", OUT / "ci-lean-2"

    # The reserves keep time for the steps after each one; the last, ab, gets what is left.
    step("ci-lean-1", kb("run", "--config", str(suite), "--output-dir", str(a)), 160, reserve_s=290)
    step("ci-lean-2", kb("run", "--config", str(suite), "--output-dir", str(b)), 140, reserve_s=170)
    step("compare-same-commit", kb("compare", str(a), str(b), "--output-dir", str(OUT / "compare-same-commit")), 40,
         reserve_s=160)
    step("gpustate-tests", [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu/test_gpustate_gpu.py", "-q",
                            "-p", "no:cacheprovider", "-p", "no:logging"], 45, reserve_s=150)
    # A verdict rests on rounds (the bootstrap resamples them first): the suite's 3 rounds a side
    # leave a 5% change inconclusive, so each slowed row and its base take SLOWED_ROUNDS.
    for name, (row, args) in SLOWED_CASES.items():
        base, slow = OUT / f"{name}-base", OUT / f"{name}-slowed"
        step(f"{name}-base", kb("run", *args, "--rounds", str(SLOWED_ROUNDS), "--output-dir", str(base)), 45,
             reserve_s=70)
        step(f"{name}-slowed", kb("run", *args, "--rounds", str(SLOWED_ROUNDS), "--output-dir", str(slow)), 45,
             env={"KERNELBENCH_TEST_SLOWDOWN": slowed_spec(row)}, reserve_s=60)
        step(f"compare-{name}-slowed", kb("compare", str(base), str(slow), "--threshold", "0.02", "--output-dir",
                                          str(OUT / f"compare-{name}-slowed")), 30, reserve_s=50)
    ab_row, ab_args = SLOWED_CASES[AB_CASE]
    wrapper = OUT / "python-slowed"
    wrapper.write_text(f"#!/bin/sh\nKERNELBENCH_TEST_SLOWDOWN={slowed_spec(ab_row)} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    step("ab", kb("ab", sys.executable, str(wrapper), "--rounds", "2", "--threshold", "0.02", "--output-dir",
                  str(OUT / "ab"), "--", *ab_args), 150, reserve_s=5)

    same = verdicts(OUT / "compare-same-commit")
    lines = [f"# Statistical verdicts on the GPU: {os.environ.get('KERNELBENCH_GIT_SHA', 'commit not given')}", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {BUDGET_S:.0f} s budget, "
             f"{time.monotonic() - START:.0f} s used.", "",
             "ci-lean (ci-lean.toml beside this file): configs/ci.toml's [[bench]] tables without the "
             "torch-compile candidates, muon-ns on 2048-bf16 and 4096x1024-bf16 only; no parity.", "",
             "## Steps", ""] + summary
    summary.clear()
    describe("1. ci-lean twice at one commit (expected: no slower)", same)
    if same is not None:
        slower = int((same["verdict"] == "slower").sum())
        summary.append(f"\n**{'PASS' if slower == 0 else 'FAIL'}**: {slower} slower of {len(same)} rows.")
    ab_expected = None
    for number, (name, (row, _)) in enumerate(SLOWED_CASES.items(), start=2):
        expected, how = slowdown_expected(row, OUT / f"{name}-slowed", OUT / f"{name}-base")
        table = verdicts(OUT / f"compare-{name}-slowed")
        describe(f"{number}. {' '.join(row)} slowed by 5%, against its base, {SLOWED_ROUNDS} rounds a side, "
                 "--threshold 0.02", table)
        summary.append(f"\nExpected ratio of the slowed row: {how}\n\n**{slowed_verdict(row, table, expected)}**")
        if name == AB_CASE:
            ab_expected = expected
    describe(f"{len(SLOWED_CASES) + 2}. ab, {' '.join(ab_row)}: plain against slowed, alternating processes, "
             "--threshold 0.02", verdicts(OUT / "ab"))
    summary.append(f"\n**{slowed_verdict(ab_row, verdicts(OUT / 'ab'), ab_expected)}** (expected ratio from the "
                   "base and slowed runs above; ab's own delay is calibrated in each of its processes)")
    rounds = OUT / "ci-lean-1" / "rounds.csv"
    if rounds.is_file() and pd.read_csv(rounds).gpu_source.notna().any():
        state = pd.read_csv(rounds)
        throttled = int(state.gpu_throttled.astype(object).fillna(False).astype(bool).sum())
        summary.append(f"\n### GPU state in run 1\n\nsource {', '.join(map(str, state.gpu_source.dropna().unique()))}; "
                       f"SM clock {state.gpu_sm_mhz.min():.0f}-{state.gpu_sm_mhz.max():.0f} MHz; "
                       f"temperature up to {state.gpu_temperature_c.max():.0f} C; power up to "
                       f"{state.gpu_power_w.max():.0f} W; throttled rounds {throttled} of {len(state)}")
    summary.append(f"\n### Sizes\n\nrun 1 report {size_kb(a)}; samples.csv.gz {size_kb(a / 'samples.csv.gz')}, "
                   f"rounds.csv {size_kb(a / 'rounds.csv')}")
    (OUT / "SUMMARY.md").write_text("\n".join(lines + summary) + "\n")
    print((OUT / "SUMMARY.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
