"""``kernelbench ab BASE NEW -- RUN-ARGS``: both sides timed on one machine in alternating
processes, and a verdict per row.

A side is a git revision (checked out into a temporary worktree and run by this interpreter with
the worktree first on the import path), or an installed environment: a virtualenv folder or a
Python executable (a wrapper script that sets variables and execs Python counts too). Round i
runs ``python -m kernelbench run RUN-ARGS`` for one side and then the other, in alternating order
(BASE NEW, NEW BASE, ...), so that drift, the GPU's warmth and its clocks hit both alike; a
``--config`` suite is run without its [[parity]] tables. Each process writes its own report
folder. The verdicts (:func:`kernelbench.report.compare.judge_rows`) pool every process's
per-rep samples and resample processes, then their rounds, then reps, so a process that sits at its
own level widens the interval instead of passing for a difference between the sides; a side whose
kernelbench keeps no samples (an older revision) gives one sample per process, its median. With
``--rounds 1`` a side has one process, and the rows are held as ``compare`` holds two reports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import numpy as np
import pandas as pd

from ..ops.base import UsageError
from ..report.compare import BROKEN, KEYS, TIME_METRIC, Comparison, fingerprint_mismatches, judge_rows
from ..report.samples import load_samples
from ..report.significance import ALPHA
from ..report.tables import to_markdown
from ..report.writer import ReportError, load_report

FORBIDDEN_RUN_ARGS = ("-o", "--output-dir", "--format")


@dataclass
class Side:
    label: str  # BASE or NEW
    spec: str  # as given on the command line
    python: str
    describe: str
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    worktree: str | None = None


def _git(*args: str, cwd: Path | str | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise UsageError(f"git {' '.join(args)}: {said[-1] if said else 'failed'}")
    return done.stdout.strip()


def resolve_side(label: str, spec: str, workdir: Path, repo: Path | None = None) -> Side:
    """A virtualenv folder, a Python executable, or else a git revision of ``repo`` (default: the
    repository holding the working directory), checked out under ``workdir``."""
    path = Path(spec)
    # Absolute, but not resolved: a virtualenv's bin/python is a link to the base interpreter, and
    # only through the link does Python find the environment.
    if path.is_dir() and (path / "bin" / "python").is_file():
        return Side(label, spec, os.path.abspath(path / "bin" / "python"), f"environment {path}")
    if path.is_file():
        if not os.access(path, os.X_OK):
            raise UsageError(f"{label} {spec}: a file that is not executable (name a Python executable, a "
                             "virtualenv folder or a git revision)")
        return Side(label, spec, os.path.abspath(path), f"executable {path}")
    try:
        root = Path(_git("rev-parse", "--show-toplevel", cwd=repo))
    except (UsageError, OSError):
        raise UsageError(f"{label} {spec}: not a Python executable, a virtualenv folder, or a git revision (no git "
                         "repository here)") from None
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}", cwd=root)
    except UsageError:
        raise UsageError(f"{label} {spec}: not a Python executable, a virtualenv folder, or a revision of "
                         f"{root}") from None
    tree = Path(workdir) / f"{label.lower()}-{sha[:12]}"
    _git("worktree", "add", "--detach", "--quiet", str(tree), sha, cwd=root)
    python_path = os.pathsep.join([str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return Side(label, spec, sys.executable, f"git {sha[:12]} ({spec})", cwd=str(tree),
                env={"PYTHONPATH": python_path, "KERNELBENCH_GIT_SHA": sha}, worktree=str(tree))


def remove_side(side: Side) -> None:
    """Removes a side's worktree (a no-op for environments)."""
    if side.worktree:
        subprocess.run(["git", "worktree", "remove", "--force", side.worktree], cwd=side.worktree,
                       capture_output=True, timeout=120)
        shutil.rmtree(side.worktree, ignore_errors=True)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise UsageError(f"cannot carry {value!r} into the bench-only suite")


def bench_only_suite(config: Path, dest: Path) -> Path:
    """The suite's [suite] and [[bench]] tables, without [[parity]]: ab compares speed."""
    try:
        doc = tomllib.loads(Path(config).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--config {config}: not a readable suite ({exc})") from None
    if not doc.get("bench"):
        raise UsageError(f"--config {config}: no [[bench]] table: nothing to time")
    lines = [f"# The [[bench]] tables of {Path(config).resolve()}, for kernelbench ab", "", "[suite]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in doc.get("suite", {}).items()]
    for table in doc["bench"]:
        lines += ["", "[[bench]]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def prepare_run_args(run_args: list[str], out: Path) -> list[str]:
    """RUN-ARGS as each process gets them: a --config replaced by its bench-only copy."""
    if not run_args:
        raise UsageError("name what to time after --: an op and its options (kernelbench ab main HEAD -- rmsnorm "
                         "-w 32768x4096-bf16) or a suite (-- --config configs/ci.toml)")
    args = list(run_args)
    for flag in FORBIDDEN_RUN_ARGS:
        if flag in args or any(a.startswith(flag + "=") for a in args):
            raise UsageError(f"{flag} after --: ab gives each process its own report folder under -o and reads it")
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            args[i + 1] = str(bench_only_suite(Path(args[i + 1]), out / "suite-bench-only.toml"))
        elif arg.startswith("--config="):
            args[i] = "--config=" + str(bench_only_suite(Path(arg.split("=", 1)[1]), out / "suite-bench-only.toml"))
    return args


@dataclass
class Process:
    side: str
    round: int
    folder: str
    returncode: int
    seconds: float
    command: list[str]


def run_alternating(base: Side, new: Side, run_args: list[str], rounds: int, out: Path,
                    on_progress: Callable[[str], None] | None = None) -> list[Process]:
    """``rounds`` processes per side, alternating BASE NEW / NEW BASE; a log per process."""
    processes = []
    for i in range(rounds):
        for side in ((base, new) if i % 2 == 0 else (new, base)):
            folder = out / f"{side.label.lower()}-{i + 1}"
            command = [side.python, "-m", "kernelbench", "run", *run_args, "--output-dir", str(folder)]
            if on_progress:
                on_progress(f"round {i + 1}/{rounds}: {side.label} ({side.describe})")
            env = {**os.environ, **side.env, "PYTHONUNBUFFERED": "1"}
            start = time.monotonic()
            with open(out / f"{folder.name}.log", "w") as log:
                done = subprocess.run(command, cwd=side.cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
            processes.append(Process(side.label, i + 1, str(folder), done.returncode, time.monotonic() - start,
                                     command))
    return processes


@dataclass
class Pooled:
    times: pd.DataFrame  # keys -> time_median_ms, time_iqr_ms, flags
    samples: dict  # key -> (times, round cluster, process) per rep
    errors: dict  # key -> message, for keys that errored in every process
    processes_without_samples: int
    environment: dict


def pool(folders: list[Path]) -> Pooled:
    """Every process report of one side as one: its samples pooled, each rep labelled with its
    (process, round) cluster and its process."""
    chunks, medians, flags, errors, ok_keys, bare, env = [], [], {}, {}, set(), 0, {}
    for p, folder in enumerate(folders):
        try:
            meta, rows = load_report(folder)
            samples = load_samples(folder)
        except ReportError:
            continue  # a process that died before writing: its log says why
        env = env or meta.get("environment", {})
        lead = rows[rows["metric"] == TIME_METRIC].drop_duplicates(KEYS)
        for r in lead.itertuples(index=False):
            key = (str(r.op), str(r.workload), str(r.mode), str(r.candidate))
            if r.status == "ok":
                ok_keys.add(key)
                # What judge_rows acts on, from any process of the side.
                flags.setdefault(key, set()).update({"throttled", "host-bound"} & set(str(r.flags).split(",")))
                medians.append((*key, float(r.value), p))
            elif r.status == "error":
                errors.setdefault(key, str(r.message))
        if samples is not None:
            timed = samples[samples["metric"] == TIME_METRIC]
            chunks.append(timed.assign(cluster=p * 1000 + timed["round"], process=p))
        else:
            bare += 1
    with_samples = pd.concat(chunks) if chunks else pd.DataFrame(columns=[*KEYS, "ms", "cluster", "process"])
    groups = {key: (part["ms"].to_numpy(dtype=float), part["cluster"].to_numpy(), part["process"].to_numpy())
              for key, part in with_samples.groupby(KEYS, sort=False)}
    median_frame = pd.DataFrame(medians, columns=[*KEYS, "ms", "process"])
    for key, part in median_frame.groupby(KEYS, sort=False):
        if key not in groups:  # no samples kept by this side: one sample per process
            groups[key] = (part["ms"].to_numpy(dtype=float), part["process"].to_numpy() * 1000,
                           part["process"].to_numpy())
    lines = []
    for key, (values, _, _) in groups.items():
        q25, q50, q75 = np.quantile(values, [0.25, 0.5, 0.75])
        lines.append({**dict(zip(KEYS, key)), "time_median_ms": q50, "time_iqr_ms": q75 - q25,
                      "flags": ",".join(sorted(flags.get(key, ())))})
    times = pd.DataFrame(lines, columns=[*KEYS, "time_median_ms", "time_iqr_ms", "flags"]).set_index(KEYS)
    return Pooled(times, groups, {k: v for k, v in errors.items() if k not in ok_keys}, bare, env)


def compare_sides(base: Pooled, new: Pooled, *, threshold: float, alpha: float = ALPHA) -> Comparison:
    table = judge_rows(base.times, new.times, base.samples, new.samples, threshold=threshold, alpha=alpha,
                       noise_guard=False)
    broken = [{**dict(zip(KEYS, key)), "verdict": BROKEN, "why": "error in every NEW process: " + message[:200]}
              for key, message in new.errors.items() if key in base.times.index]
    if broken:
        table = pd.concat([table, pd.DataFrame(broken)], ignore_index=True)
    only_base = ["/".join(k) for k in base.times.index.difference(new.times.index) if k not in new.errors]
    only_new = ["/".join(k) for k in new.times.index.difference(base.times.index)]
    return Comparison(table, only_base, only_new,
                      fingerprint_mismatches(base.environment, new.environment))


def write_outputs(out: Path, comparison: Comparison, base: Side, new: Side, processes: list[Process],
                  run_args: list[str], threshold: float) -> None:
    """compare.csv (what ``kernelbench plot`` draws), ab.md and ab.json beside the process folders."""
    comparison.table.to_csv(out / "compare.csv", index=False)
    title = f"# kernelbench ab: {base.describe} -> {new.describe}"
    head = (f"{len(processes) // 2} alternating process(es) per side; run arguments `{' '.join(run_args)}`; "
            f"threshold {threshold:g}")
    (out / "ab.md").write_text(f"{title}\n\n{head}\n\n" + to_markdown(comparison.table))
    (out / "ab.json").write_text(json.dumps({
        "base": asdict(base), "new": asdict(new), "run_args": run_args, "threshold": threshold,
        "processes": [asdict(p) for p in processes], "environment_differences": comparison.mismatches,
        "verdicts": comparison.table["verdict"].value_counts().to_dict() if not comparison.table.empty else {},
    }, indent=1, default=str))
