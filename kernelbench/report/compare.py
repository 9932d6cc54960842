"""``compare BASE NEW``: a verdict per matching timed row, and which rows make the job fail.

Where both reports kept per-rep samples (``samples.csv.gz``), a row is judged by a rank test and a
bootstrap interval of new / base median (:func:`kernelbench.report.significance.judge`):
``faster``, ``slower``, ``same`` or ``inconclusive``. Only ``slower`` (significantly slower by more
than the threshold) fails a comparison; ``inconclusive`` rows are listed and fail only under
``strict``. A row whose clocks were held down by power or heat on either side (``throttled``) gets
no ``faster`` / ``slower`` verdict: ``inconclusive``.

Two report folders are two processes, one a side, and a process can sit at its own level for its
whole life (cuBLAS's algorithm choice, the host's speed, the allocator's layout): the samples of one
process cannot show how far the next would sit. So where a side has a single process:

- ``slower`` and ``faster`` need the interval beyond 1 +- ``process_noise`` too (default
  :data:`PROCESS_NOISE`, 3%): on H100s, rows not host-bound moved between processes by a median
  0.2% and a 95th percentile 3.2% (285 pairs of processes, 21 torch / liger rows, six CI-suite
  runs in ``results/2026-11-2[2-4]-h*``), a log-scale SD of 0.85%, and sqrt(2) x 2.58 x 0.85% = 3.1%.
- A row flagged ``host-bound`` on either side (its device time is the host's enqueue rate) is held
  to :data:`HOST_BOUND_NOISE` instead: such rows moved by a median 15% and up to 2.2x between
  processes in the same runs, and one moved 1.58x between two processes of one commit
  (``results/2026-11-26-h100-statistical-verdicts``). Only a move beyond 2.2x is ``slower``; one
  beyond the 3% but within that is ``inconclusive``, never ``same``. ``kernelbench ab`` times
  several processes a side and resamples them, which measures that spread instead of assuming it.
- A row whose reps spread wider than the threshold (IQR / median) is held to that spread.

Where a side has no samples (a report written before they were kept), the row falls back to the
rule those reports were judged by, and its ``method`` says so: slower when new / base exceeds
1 + the threshold, the threshold raised to either row's IQR / median.

A parity check that passed in BASE and fails in NEW, or a candidate that errors in NEW, is
``broken`` and fails the comparison too. Two reports with no row in common, or a NEW that lacks
rows BASE has (another op, a truncated file), are an error unless ``allow_missing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..ops.base import UsageError
from .samples import load_samples
from .significance import ALPHA, FASTER, INCONCLUSIVE, SAME, SLOWER, judge
from .writer import RUN_JSON, ReportError, load_report

KEYS = ["op", "workload", "mode", "candidate"]
# What must match for two runs' times to be comparable at all.
FINGERPRINT_KEYS = ("device", "gpu_name", "torch", "triton")
BROKEN = "broken"
RANK_TEST = "rank test + bootstrap"
IQR_RULE = "IQR rule (no samples)"
TIME_METRIC = "time_median_ms"
# What a row not host-bound moves between two processes of one commit (the module docstring).
PROCESS_NOISE = 0.03
# ... and a host-bound row: the largest move seen between processes (the module docstring).
HOST_BOUND_NOISE = 1.2
HOST_BOUND = "host-bound"
COLUMNS = [*KEYS, "base ms", "new ms", "ratio", "low", "high", "p", "threshold", "verdict", "method", "why"]


@dataclass
class Comparison:
    table: pd.DataFrame  # one line per matched row (COLUMNS)
    only_base: list[str]
    only_new: list[str]
    mismatches: list[str]

    @property
    def regressions(self) -> pd.DataFrame:
        """The rows that fail a comparison: slower, or broken."""
        return self.table[self.table["verdict"].isin([SLOWER, BROKEN])]

    @property
    def inconclusive(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == INCONCLUSIVE]

    @property
    def fallback_rows(self) -> int:
        return int((self.table["method"] == IQR_RULE).sum()) if not self.table.empty else 0


def _times(rows: pd.DataFrame) -> pd.DataFrame:
    """(op, workload, mode, candidate) -> median, IQR and flags of the timed rows."""
    columns = ["time_median_ms", "time_iqr_ms"]
    ok = rows[rows["status"].isin(["ok", "pass", "fail"]) & rows["metric"].isin(columns)]
    if ok.empty:
        return pd.DataFrame(columns=[*columns, "flags"], index=pd.MultiIndex.from_tuples([], names=KEYS), dtype=float)
    ok = ok.assign(value=pd.to_numeric(ok["value"], errors="coerce"))
    wide = ok.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first")
    wide = wide.reindex(columns=columns).dropna(subset=["time_median_ms"])
    flags = ok[ok["metric"] == "time_median_ms"].drop_duplicates(KEYS).set_index(KEYS)["flags"]
    return wide.assign(flags=flags.reindex(wide.index).astype(object).fillna("").astype(str))


def _parity(rows: pd.DataFrame) -> pd.Series:
    return rows[rows["metric"] == "parity"].set_index(KEYS)["status"]


def _sample_groups(samples: pd.DataFrame | None) -> dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """key -> (per-rep times, round of each, process of each) of the device-time rows of one
    report: one process."""
    if samples is None:
        return {}
    timed = samples[samples["metric"] == TIME_METRIC]
    return {key: (part["ms"].to_numpy(dtype=float), part["round"].to_numpy(), np.zeros(len(part), dtype=int))
            for key, part in timed.groupby(KEYS, sort=False)}


def fingerprint_mismatches(base_env: dict, new_env: dict) -> list[str]:
    out = []
    for key in FINGERPRINT_KEYS:
        if base_env.get(key) != new_env.get(key):
            out.append(f"{key}: {base_env.get(key)!r} in BASE, {new_env.get(key)!r} in NEW")
    return out


def _iqr_rule(base_median: float, new_median: float, base_iqr: float, new_iqr: float,
              threshold: float) -> tuple[str, float, str]:
    """The rule for reports without samples: (verdict, the threshold used, why)."""
    noises = [iqr / median for iqr, median in ((base_iqr, base_median), (new_iqr, new_median)) if median]
    used = max([threshold] + [x for x in noises if not np.isnan(x)])
    ratio = new_median / base_median
    verdict = SLOWER if ratio > 1 + used else FASTER if ratio < 1 - used else SAME
    return verdict, used, f"new / base {ratio:.4g} against 1 +- {used:.3g} (the threshold or IQR / median if larger)"


def _relative_iqr(values: np.ndarray) -> float:
    q25, q50, q75 = np.quantile(values, [0.25, 0.5, 0.75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


def _flagged(times: pd.Series, flag: str) -> bool:
    return flag in str(times.get("flags", "")).split(",")


def judge_rows(base_times: pd.DataFrame, new_times: pd.DataFrame, base_samples: dict, new_samples: dict, *,
               threshold: float, alpha: float = ALPHA, noise_guard: bool = True,
               process_noise: float = PROCESS_NOISE) -> pd.DataFrame:
    """A verdict for every key timed on both sides (COLUMNS, keys as columns). Samples are
    key -> (times, round, process) per rep. Where a side has one process, a row is held to
    ``process_noise``, a host-bound row to HOST_BOUND_NOISE (the module docstring). With
    ``noise_guard`` (two separate runs), a row whose reps spread wider than the threshold
    (IQR / median) is held to that spread; ``ab``, whose processes the bootstrap resamples,
    measures that and needs no guard."""
    lines = []
    for key in base_times.index.intersection(new_times.index):
        b, n = base_times.loc[key], new_times.loc[key]
        line = dict(zip(KEYS, key))
        if key in base_samples and key in new_samples:
            (bt, br, bp), (nt, nr, np_) = base_samples[key], new_samples[key]
            single = min(len(np.unique(bp)), len(np.unique(np_))) < 2
            host_bound = [side for side, t in (("BASE", b), ("NEW", n)) if _flagged(t, HOST_BOUND)]
            noise = max(_relative_iqr(bt), _relative_iqr(nt)) if noise_guard else 0.0
            floor = (HOST_BOUND_NOISE if host_bound else process_noise) if single else 0.0
            used = max(threshold, noise, floor)
            j = judge(bt, nt, br, nr, base_processes=bp, new_processes=np_, threshold=used, alpha=alpha)
            why, verdict = j.reason, j.verdict
            if used > threshold and used == noise:
                why += f" (a noisy row: held to its IQR / median, {noise:.1%})"
            elif used > threshold and host_bound:
                why += (f" (host-bound in {' and '.join(host_bound)}, one process a side: its time is the host's, "
                        f"which moves between processes by up to {1 + floor:.1f}x; time it with kernelbench ab)")
                tight = max(threshold, noise, process_noise)
                if verdict == SAME and not (1 - tight <= j.low and j.high <= 1 + tight):
                    verdict = INCONCLUSIVE
            elif used > threshold:
                why += f" (one process a side: held to the process noise, {floor:.1%})"
            line |= {"base ms": float(np.median(bt)), "new ms": float(np.median(nt)), "ratio": j.ratio,
                     "low": j.low, "high": j.high, "p": j.p_value, "threshold": used, "verdict": verdict,
                     "method": RANK_TEST, "why": why}
        else:
            verdict, used, why = _iqr_rule(b["time_median_ms"], n["time_median_ms"],
                                           b.get("time_iqr_ms", 0.0), n.get("time_iqr_ms", 0.0), threshold)
            missing = " and ".join(side for side, s in (("BASE", base_samples), ("NEW", new_samples)) if key not in s)
            line |= {"base ms": b["time_median_ms"], "new ms": n["time_median_ms"],
                     "ratio": n["time_median_ms"] / b["time_median_ms"], "low": np.nan, "high": np.nan, "p": np.nan,
                     "threshold": used, "verdict": verdict, "method": IQR_RULE,
                     "why": f"{why}; no samples in {missing}"}
        throttled = [side for side, t in (("BASE", b), ("NEW", n)) if _flagged(t, "throttled")]
        if throttled and line["verdict"] in (FASTER, SLOWER):
            line["why"] = (f"{line['verdict']} by the numbers, but the clocks were held down by power or heat in "
                           f"{' and '.join(throttled)} (flagged throttled): rerun; " + line["why"])
            line["verdict"] = INCONCLUSIVE
        lines.append(line)
    return pd.DataFrame(lines, columns=COLUMNS)


def compare_reports(base: Path, new: Path, *, threshold: float = 0.05, alpha: float = ALPHA, force: bool = False,
                    allow_missing: bool = False, process_noise: float = PROCESS_NOISE) -> Comparison:
    if threshold < 0:
        raise UsageError(f"--threshold {threshold:g}: must be >= 0 (0.05 = 5% slower)")
    if process_noise < 0:
        raise UsageError(f"--process-noise {process_noise:g}: must be >= 0 (0.03 = 3%)")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha:g}: must be between 0 and 1 (0.01: 1% false alarms per row at most)")
    try:
        base_meta, base_rows = load_report(base)
        new_meta, new_rows = load_report(new)
        base_samples, new_samples = load_samples(base), load_samples(new)
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
    table = judge_rows(bt, nt, _sample_groups(base_samples), _sample_groups(new_samples),
                       threshold=threshold, alpha=alpha, process_noise=process_noise).set_index(KEYS)

    both = bp.to_frame("base").join(np_.to_frame("new"), how="inner")
    broke = both[(both["base"] == "pass") & (both["new"] != "pass")]
    for key, row in broke.iterrows():
        table.loc[key, ["verdict", "why"]] = [BROKEN, f"parity {row['base']} -> {row['new']}"]
    # A row timed in BASE that errors in NEW is broken, not missing.
    new_lead = new_rows[new_rows["metric"] == TIME_METRIC].drop_duplicates(KEYS).set_index(KEYS)
    for key in new_lead[new_lead["status"] == "error"].index.intersection(bt.index):
        table.loc[key, ["verdict", "why"]] = [BROKEN, "error in NEW: " + str(new_lead.loc[key, "message"])[:200]]
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
