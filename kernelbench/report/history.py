"""``history``: reports kept over commits in a local SQLite file (the standard library's sqlite3),
and each candidate's median over them with its interval and its step changes.

- ``runs``: one line per added report, keyed by the GPU, the torch / triton / CUDA versions, the
  git sha and the time it ran; adding the same report again changes nothing.
- ``timings``: one line per timed row of a run: the median, an interval, reps and flags. The
  interval is the 95% bootstrap interval of the median (rounds, then reps) where the report kept
  samples, else its p25-p75 (``interval`` says which).

A series is one (GPU, workload, mode, candidate) in the order the runs ran. A point is a step
when it moves more than the threshold from the median of the current level (up to the
:data:`LEVEL_WINDOW` points before it), its interval excludes that level, and the next point
stays on the same side; without a next point it is a ``new level?``; a jump the next point
undoes is a ``spike``.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..ops.base import UsageError
from .samples import load_samples
from .significance import median_interval
from .writer import ReportError, load_report

ENV_STORE = "KERNELBENCH_HISTORY"
DEFAULT_STORE = "kernelbench-history.sqlite"
LEVEL_WINDOW = 5
KEYS = ["op", "workload", "mode", "candidate"]
RUN_FIELDS = ("git_sha", "gpu_name", "gpu_uuid", "device", "torch", "triton", "cuda", "kernelbench", "driver",
              "hostname", "utc_time")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run_key TEXT UNIQUE NOT NULL,
    added_utc TEXT NOT NULL,
    report TEXT NOT NULL,
    {", ".join(f"{name} TEXT" for name in RUN_FIELDS)}
);
CREATE TABLE IF NOT EXISTS timings (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    op TEXT NOT NULL, workload TEXT NOT NULL, mode TEXT NOT NULL, candidate TEXT NOT NULL,
    median_ms REAL NOT NULL, low_ms REAL, high_ms REAL, interval TEXT, reps INTEGER, flags TEXT,
    PRIMARY KEY (run_id, op, workload, mode, candidate)
);
CREATE INDEX IF NOT EXISTS timings_by_op ON timings (op, workload);
"""


def default_store() -> Path:
    return Path(os.environ.get(ENV_STORE) or DEFAULT_STORE)


def _connect(store: Path) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(store)
        db.executescript(_SCHEMA)
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"--store {store}: not a kernelbench history store ({exc})") from None
    return db


@dataclass(frozen=True)
class Added:
    run_id: int
    new: bool  # False: the report was in the store already
    rows: int
    sha: str


def _timings(folder: Path, rows: pd.DataFrame) -> list[dict]:
    timed = rows[(rows["metric"].isin(["time_median_ms", "time_p25_ms", "time_p75_ms", "reps"]))
                 & (rows["status"] == "ok")]
    if timed.empty:
        return []
    wide = timed.assign(value=pd.to_numeric(timed["value"], errors="coerce")).pivot_table(
        index=KEYS, columns="metric", values="value", aggfunc="first")
    flags = timed[timed["metric"] == "time_median_ms"].drop_duplicates(KEYS).set_index(KEYS)["flags"]
    samples = load_samples(folder)
    groups = {}
    if samples is not None:
        device = samples[samples["metric"] == "time_median_ms"]
        groups = {key: part for key, part in device.groupby(KEYS, sort=False)}
    out = []
    for key, row in wide.dropna(subset=["time_median_ms"]).iterrows():
        part = groups.get(tuple(map(str, key)))
        if part is not None and len(part) >= 2:
            low, high = median_interval(part["ms"].to_numpy(), part["round"].to_numpy(), level=0.95)
            interval = "95% bootstrap interval of the median"
        else:
            low, high, interval = row.get("time_p25_ms"), row.get("time_p75_ms"), "p25-p75"
        flag = flags.get(key, "")
        out.append({**dict(zip(KEYS, key)), "median_ms": float(row["time_median_ms"]),
                    "low_ms": None if pd.isna(low) else float(low), "high_ms": None if pd.isna(high) else float(high),
                    "interval": interval, "reps": None if pd.isna(row.get("reps")) else int(row["reps"]),
                    "flags": "" if pd.isna(flag) else str(flag)})
    return out


def add_report(store: Path, folder: Path) -> Added:
    """Appends one report folder's timed rows to the store (creating it when missing)."""
    try:
        meta, rows = load_report(folder)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    env = meta.get("environment", {})
    if not env.get("utc_time"):
        raise UsageError(f"{folder}: run.json has no environment.utc_time: not a report kernelbench wrote")
    timings = _timings(Path(folder), rows)
    if not timings:
        raise UsageError(f"{folder}: no timed row (status ok) to keep: nothing was measured in that run")
    values = {name: None if env.get(name) is None else str(env.get(name)) for name in RUN_FIELDS}
    run_key = "|".join(str(values[k]) for k in ("utc_time", "hostname", "git_sha", "gpu_uuid", "gpu_name"))
    with closing(_connect(store)) as db, db:
        found = db.execute("SELECT id FROM runs WHERE run_key = ?", (run_key,)).fetchone()
        if found:
            return Added(found[0], False, 0, values["git_sha"] or "")
        cursor = db.execute(
            f"INSERT INTO runs (run_key, added_utc, report, {', '.join(RUN_FIELDS)}) "
            f"VALUES (?, ?, ?, {', '.join('?' * len(RUN_FIELDS))})",
            (run_key, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), str(Path(folder).resolve()),
             *(values[k] for k in RUN_FIELDS)))
        run_id = cursor.lastrowid
        db.executemany(
            "INSERT INTO timings (run_id, op, workload, mode, candidate, median_ms, low_ms, high_ms, interval, reps, "
            "flags) VALUES (:run_id, :op, :workload, :mode, :candidate, :median_ms, :low_ms, :high_ms, :interval, "
            ":reps, :flags)", [{**t, "run_id": run_id} for t in timings])
    return Added(run_id, True, len(timings), values["git_sha"] or "")


def load_series(store: Path, op: str, workload: str | None = None, gpu: str | None = None) -> pd.DataFrame:
    """Every stored timing of ``op`` (one workload, one GPU name when given), oldest run first."""
    if not Path(store).is_file():
        raise UsageError(f"--store {store}: no history store there (kernelbench history add REPORT_DIR makes one)")
    query = (f"SELECT r.id AS run_id, {', '.join('r.' + f for f in RUN_FIELDS)}, t.op, t.workload, t.mode, "
             "t.candidate, t.median_ms, t.low_ms, t.high_ms, t.interval, t.reps, t.flags "
             "FROM timings t JOIN runs r ON r.id = t.run_id WHERE t.op = ?")
    params: list = [op]
    if workload:
        query += " AND t.workload = ?"
        params.append(workload)
    if gpu:
        query += " AND r.gpu_name = ?"
        params.append(gpu)
    with closing(_connect(store)) as db:
        frame = pd.read_sql_query(query + " ORDER BY r.utc_time, r.id", db, params=params)
    return frame


def flag_steps(medians, lows, highs, threshold: float = 0.05) -> list[str]:
    """One label per point ('' for none): ``step up +12%``, ``step down -8%``, ``new level? +9%``
    (the last point, not yet confirmed), ``spike +15%`` (the next point came back)."""
    m = np.asarray(medians, dtype=float)
    lo = np.asarray([np.nan if v is None else v for v in lows], dtype=float)
    hi = np.asarray([np.nan if v is None else v for v in highs], dtype=float)
    labels = [""] * len(m)
    level_start = 0
    for i in range(1, len(m)):
        level = float(np.median(m[max(level_start, i - LEVEL_WINDOW):i]))
        change = m[i] / level - 1
        if abs(change) <= threshold or (lo[i] <= level <= hi[i]):
            continue
        direction = "up" if change > 0 else "down"
        if i + 1 == len(m):
            labels[i] = f"new level? {change:+.0%}"
        elif np.sign(m[i + 1] / level - 1) == np.sign(change) and abs(m[i + 1] / level - 1) > threshold:
            labels[i] = f"step {direction} {change:+.0%}"
            level_start = i
        else:
            labels[i] = f"spike {change:+.0%}"
    return labels


def _short(sha) -> str:
    sha = str(sha or "?")
    return sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")


def history_table(series: pd.DataFrame, threshold: float = 0.05) -> pd.DataFrame:
    """The series as printed: one line per (GPU, workload, mode, candidate, run), with the change
    from the previous run, what changed in the environment, and the step labels."""
    lines = []
    series = series.assign(gpu_name=series["gpu_name"].fillna("cpu"))
    for (gpu, workload, mode, cand), part in series.groupby(["gpu_name", "workload", "mode", "candidate"],
                                                           sort=False):
        part = part.reset_index(drop=True)
        steps = flag_steps(part["median_ms"], part["low_ms"], part["high_ms"], threshold)
        for i, r in part.iterrows():
            changed = []
            if i:
                prev = part.iloc[i - 1]
                changed = [f"{k} {prev[k]} -> {r[k]}" for k in ("torch", "triton", "driver") if prev[k] != r[k]]
            lines.append({"gpu": gpu, "workload": workload, "mode": mode, "candidate": cand,
                          "commit": _short(r["git_sha"]), "ran (UTC)": str(r["utc_time"])[:16],
                          "median ms": r["median_ms"], "low": r["low_ms"], "high": r["high_ms"],
                          "vs previous": None if i == 0 else r["median_ms"] / part["median_ms"].iloc[i - 1],
                          "step": steps[i], "notes": "; ".join(changed + ([r["flags"]] if r["flags"] else []))})
    return pd.DataFrame(lines)


def plot_history(table: pd.DataFrame, op: str, folder: Path) -> list[Path]:
    """history-<op>-<workload>-<mode>.png: each candidate's median per run with its interval,
    steps marked."""
    from .plot import _colours, _figure, _safe, _save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for (gpu, workload, mode), part in table.groupby(["gpu", "workload", "mode"], sort=False):
        runs = list(dict.fromkeys(zip(part["ran (UTC)"], part["commit"])))
        x_of = {run: i for i, run in enumerate(runs)}
        fig = _figure(max(6.0, 1.5 + 0.5 * len(runs)), 4.5)
        ax = fig.subplots()
        colours = _colours(list(dict.fromkeys(part["candidate"])))
        for cand, rows in part.groupby("candidate", sort=False):
            x = [x_of[(t, c)] for t, c in zip(rows["ran (UTC)"], rows["commit"])]
            y = rows["median ms"].to_numpy(dtype=float)
            low = (y - rows["low"].astype(float)).fillna(0).clip(lower=0)
            high = (rows["high"].astype(float) - y).fillna(0).clip(lower=0)
            ax.errorbar(x, y, yerr=[low, high], marker="o", ms=4, capsize=2, color=colours[cand], label=cand)
            for xi, yi, step in zip(x, y, rows["step"]):
                if step:
                    ax.annotate(step, (xi, yi), xytext=(4, 6), textcoords="offset points", fontsize=7,
                                color="#c62828" if step.startswith("step") else "0.3")
        ax.set_xticks(range(len(runs)), [f"{c}\n{t[5:10]}" for t, c in runs], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median ms (bars: interval)")
        ax.set_title(f"{op} {workload} {mode} on {gpu}: median over commits")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        out.append(_save(fig, folder / f"history-{_safe(op)}-{_safe(workload)}-{_safe(mode)}.png"))
    return out
