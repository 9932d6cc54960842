"""``compare BASE NEW``: the ratio of medians per matching row, and which rows regressed.

A row regressed when new/base exceeds 1 + threshold, the threshold being the larger of the
requested minimum (default 5%) and the relative IQR of either row: a slowdown inside the noise
of the measurements themselves is not called a regression. A parity check that passed in BASE
and fails in NEW is a regression too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..ops.base import UsageError
from .writer import load_report

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
    ok = rows[rows["status"].isin(["ok", "pass", "fail"])]
    wide = ok.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first")
    keep = [c for c in ("time_median_ms", "time_iqr_ms") if c in wide.columns]
    wide = wide[keep].dropna(subset=["time_median_ms"]) if "time_median_ms" in keep else wide.iloc[0:0]
    return wide


def _parity(rows: pd.DataFrame) -> pd.Series:
    return rows[rows["metric"] == "parity"].set_index(KEYS)["status"]


def fingerprint_mismatches(base_env: dict, new_env: dict) -> list[str]:
    out = []
    for key in FINGERPRINT_KEYS:
        if base_env.get(key) != new_env.get(key):
            out.append(f"{key}: {base_env.get(key)!r} in BASE, {new_env.get(key)!r} in NEW")
    return out


def compare_reports(base: Path, new: Path, *, min_threshold: float = 0.05, force: bool = False) -> Comparison:
    try:
        base_meta, base_rows = load_report(base)
        new_meta, new_rows = load_report(new)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    mismatches = fingerprint_mismatches(base_meta.get("environment", {}), new_meta.get("environment", {}))
    if mismatches and not force:
        raise UsageError("refusing to compare runs from different environments ("
                         + "; ".join(mismatches) + "): their times are not comparable. "
                         "Pass --force to compare anyway.")
    bt, nt = _times(base_rows), _times(new_rows)
    joined = bt.add_suffix("_base").join(nt.add_suffix("_new"), how="inner")
    table = pd.DataFrame(index=joined.index)
    table["base ms"] = joined["time_median_ms_base"]
    table["new ms"] = joined["time_median_ms_new"]
    table["ratio"] = table["new ms"] / table["base ms"]
    noise = pd.concat([
        joined.get("time_iqr_ms_base", 0) / joined["time_median_ms_base"],
        joined.get("time_iqr_ms_new", 0) / joined["time_median_ms_new"],
    ], axis=1).max(axis=1).fillna(0)
    table["threshold"] = noise.clip(lower=min_threshold)
    table["verdict"] = "same"
    table.loc[table["ratio"] > 1 + table["threshold"], "verdict"] = "regression"
    table.loc[table["ratio"] < 1 - table["threshold"], "verdict"] = "faster"

    bp, np_ = _parity(base_rows), _parity(new_rows)
    both = bp.to_frame("base").join(np_.to_frame("new"), how="inner")
    broke = both[(both["base"] == "pass") & (both["new"] != "pass")]
    for key, row in broke.iterrows():
        table.loc[key, ["verdict", "parity"]] = ["regression", f"parity {row['base']} -> {row['new']}"]
    table = table.reset_index()
    only_base = ["/".join(map(str, k)) for k in bt.index.difference(nt.index)]
    only_new = ["/".join(map(str, k)) for k in nt.index.difference(bt.index)]
    return Comparison(table, only_base, only_new, mismatches)
