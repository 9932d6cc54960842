"""The result rows (long format) pivoted into the two tables people read: speed and parity."""

from __future__ import annotations

import pandas as pd

from .output import fmt, markdown_table  # noqa: F401  (fmt: part of this module's API)

KEYS = ["op", "workload", "mode", "candidate"]

BENCH_COLUMNS = {
    "time_median_ms": "median ms",
    "iqr_pct": "IQR %",
    "ratio_vs_anchor": "vs anchor",
    "gbps": "GB/s",
    "pct_copy_bw": "% copy",
    "tflops": "TFLOP/s",
    "pct_matmul": "% matmul",
    "peak_mem_delta_bytes": "peak MB",
    "peak_mem_bytes": "step peak MB",
    "peak_mem_requested_bytes": "step peak MB requested",
    "tokens_per_s": "tok/s",
    "state_bytes": "state MB",
}


def bench_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (op, workload, mode, candidate) with the speed metrics side by side, plus the
    row's status and notes (skipped / error / not-measured reasons, noise and ceiling flags)."""
    bench = rows[~rows["metric"].astype(str).str.startswith("parity")]
    if bench.empty:
        return pd.DataFrame()
    values = bench.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first", sort=False)
    lead = bench[bench["metric"] == "time_median_ms"].set_index(KEYS)
    table = pd.DataFrame(index=lead.index)
    for metric, title in BENCH_COLUMNS.items():
        if metric == "iqr_pct" and {"time_iqr_ms", "time_median_ms"} <= set(values.columns):
            table[title] = 100 * values["time_iqr_ms"] / values["time_median_ms"]
        elif metric in values.columns:
            col = values[metric]
            table[title] = col / 1e6 if metric.endswith("bytes") else col
    table["status"] = lead["status"]
    above = bench[(bench["status"] == "suspect") & bench["flags"].fillna("").astype(str).str.contains("above-ceiling")]
    suspect = above.groupby(KEYS)["metric"].apply(lambda m: "above ceiling: " + ",".join(m))
    notes = lead["flags"].fillna("").astype(str)
    notes = notes.where(lead["status"].isin(["ok"]), lead["message"].fillna("").astype(str))
    table["notes"] = notes
    if not suspect.empty:
        table.loc[suspect.index, "status"] = "suspect"
        table.loc[suspect.index, "notes"] = suspect
    table = table.dropna(axis=1, how="all")
    return table.reset_index()


def parity_table(rows: pd.DataFrame) -> pd.DataFrame:
    checks = rows[rows["metric"] == "parity"].set_index(KEYS)
    if checks.empty:
        return pd.DataFrame()
    table = pd.DataFrame(index=checks.index)
    table["result"] = checks["status"]
    # Worst over tensors and steps. max rel is not shown: near-zero reference elements make it
    # huge for correct results; the tolerance check itself uses atol + rtol * |ref|.
    for metric, title in (("parity_max_abs", "worst max abs"), ("parity_rel_fro", "worst rel Frobenius")):
        worst = rows[rows["metric"] == metric].groupby(KEYS)["value"].max()
        table[title] = worst.reindex(checks.index)
    table["details"] = checks["message"]
    return table.reset_index()


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table([str(c) for c in table.columns], table.to_dict("records"))
