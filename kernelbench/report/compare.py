"""``compare BASE NEW``: the ratio of medians per matching row, and which rows regressed.

A row regressed when new/base exceeds 1 + threshold, the threshold being the larger of the
requested minimum (default 5%) and the relative IQR of either row: a slowdown inside the noise
of the measurements themselves is not called a regression. A parity check that passed in BASE
and fails in NEW is a regression too. Two reports with no row in common, or a NEW that lacks
rows BASE has (another op, a truncated file), are an error unless ``allow_missing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..ops.base import UsageError
from .writer import RUN_JSON, ReportError, load_report

KEYS = ["op", "workload", "mode", "candidate"]
# What must match for two runs' times to be comparable at all.
FINGERPRINT_KEYS = ("device", "gpu_name", "torch", "triton")


@dataclass
class Comparison:
    table: pd.DataFrame  # one line per matched row
    only_base: list[str]
    only_new: list[str]
    mismatches: list[str]

    @property
    def regressions(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == "regression"]


def _times(rows: pd.DataFrame) -> pd.DataFrame:
    """(op, workload, mode, candidate) -> median and IQR of the timed rows."""
    columns = ["time_median_ms", "time_iqr_ms"]
    ok = rows[rows["status"].isin(["ok", "pass", "fail"]) & rows["metric"].isin(columns)]
    if ok.empty:
        return pd.DataFrame(columns=columns, index=pd.MultiIndex.from_tuples([], names=KEYS), dtype=float)
    ok = ok.assign(value=pd.to_numeric(ok["value"], errors="coerce"))
    wide = ok.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first")
    return wide.reindex(columns=columns).dropna(subset=["time_median_ms"])


def _parity(rows: pd.DataFrame) -> pd.Series:
    return rows[rows["metric"] == "parity"].set_index(KEYS)["status"]


def fingerprint_mismatches(base_env: dict, new_env: dict) -> list[str]:
    out = []
    for key in FINGERPRINT_KEYS:
        if base_env.get(key) != new_env.get(key):
            out.append(f"{key}: {base_env.get(key)!r} in BASE, {new_env.get(key)!r} in NEW")
    return out


def compare_reports(base: Path, new: Path, *, min_threshold: float = 0.05, force: bool = False,
                    allow_missing: bool = False) -> Comparison:
    if min_threshold < 0:
        raise UsageError(f"--threshold {min_threshold:g}: must be >= 0 (0.05 = 5% slower)")
    try:
        base_meta, base_rows = load_report(base)
        new_meta, new_rows = load_report(new)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    for label, folder, rows in (("BASE", base, base_rows), ("NEW", new, new_rows)):
        if rows.empty:
            raise UsageError(f"{label} {folder}: the report has no rows: nothing to compare")
    unknown = [f"{label} {folder} has no run.json" if not (Path(folder) / RUN_JSON).is_file()
               else f"{label} {folder}/{RUN_JSON} records no environment"
               for label, folder, meta in (("BASE", base, base_meta), ("NEW", new, new_meta))
               if not meta.get("environment")]
    if unknown and not force:
        raise UsageError("; ".join(unknown) + ": which GPU and versions its times come from is unknown. "
                         "Pass --force to compare anyway.")
    mismatches = unknown or fingerprint_mismatches(base_meta.get("environment", {}), new_meta.get("environment", {}))
    if mismatches and not force:
        raise UsageError("refusing to compare runs from different environments ("
                         + "; ".join(mismatches) + "): their times are not comparable. "
                         "Pass --force to compare anyway.")
    try:
        bt, nt = _times(base_rows), _times(new_rows)
        bp, np_ = _parity(base_rows), _parity(new_rows)
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(
            f"{base} / {new}: rows that are no kernelbench results ({type(exc).__name__}: {exc})"
        ) from None
    joined = bt.add_suffix("_base").join(nt.add_suffix("_new"), how="inner")
    table = pd.DataFrame(index=joined.index)
    table["base ms"] = joined["time_median_ms_base"]
    table["new ms"] = joined["time_median_ms_new"]
    table["ratio"] = table["new ms"] / table["base ms"]
    noise = (
        pd.concat(
            [
                joined.get("time_iqr_ms_base", 0) / joined["time_median_ms_base"],
                joined.get("time_iqr_ms_new", 0) / joined["time_median_ms_new"],
            ],
            axis=1,
        )
        .max(axis=1)
        .fillna(0)
    )
    table["threshold"] = noise.clip(lower=min_threshold)
    table["verdict"] = "same"
    table.loc[table["ratio"] > 1 + table["threshold"], "verdict"] = "regression"
    table.loc[table["ratio"] < 1 - table["threshold"], "verdict"] = "faster"

    both = bp.to_frame("base").join(np_.to_frame("new"), how="inner")
    broke = both[(both["base"] == "pass") & (both["new"] != "pass")]
    for key, row in broke.iterrows():
        table.loc[key, ["verdict", "parity"]] = ["regression", f"parity {row['base']} -> {row['new']}"]
    # A row timed in BASE that errors in NEW is a regression, not a missing row.
    new_lead = new_rows[new_rows["metric"] == "time_median_ms"].drop_duplicates(KEYS).set_index(KEYS)
    broken = new_lead[new_lead["status"] == "error"].index.intersection(bt.index)
    for key in broken:
        table.loc[key, ["verdict", "parity"]] = [
            "regression",
            "error in NEW: " + str(new_lead.loc[key, "message"])[:200],
        ]
    table = table.reset_index()
    base_keys = bt.index.union(bp.index.drop_duplicates())
    new_keys = nt.index.union(np_.index.drop_duplicates())
    anywhere_in_new = pd.MultiIndex.from_frame(new_rows[KEYS].astype(str).drop_duplicates())
    base_str = (
        pd.MultiIndex.from_tuples([tuple(map(str, k)) for k in base_keys], names=KEYS) if len(base_keys) else base_keys
    )
    only_base = ["/".join(k) for k in base_str.difference(anywhere_in_new)]
    only_new = ["/".join(map(str, k)) for k in new_keys.difference(base_keys)]
    if not allow_missing:
        if table.empty and both.empty:
            raise UsageError(
                f"no rows in common between {base} and {new} (BASE has {len(base_keys)} "
                f"timed or checked rows, NEW {len(new_keys)}): are these runs of the same "
                "suite? Pass --allow-missing to accept it"
            )
        if only_base:
            raise UsageError(
                f"{len(only_base)} row(s) of BASE missing from NEW (first: {only_base[0]}): "
                "an incomplete or different run; pass --allow-missing to compare the rest"
            )
    return Comparison(table, only_base, only_new, mismatches)


def write_comparison(result: Comparison, base: Path, new: Path, folder: Path) -> None:
    """compare.csv and compare.md (and compare.png with matplotlib) into ``folder``."""
    from .plot import matplotlib_available, write_plots
    from .tables import to_markdown

    try:
        folder.mkdir(parents=True, exist_ok=True)
        result.table.to_csv(folder / "compare.csv", index=False)
        (folder / "compare.md").write_text(f"# compare {base} -> {new}\n\n" + to_markdown(result.table))
        if matplotlib_available():
            write_plots(folder)
    except OSError as exc:
        raise UsageError(f"--output-dir {folder}: cannot write there ({exc.strerror or exc})") from None
