"""The report folder of one invocation: results.csv, run.json, summary.md, junit.xml, and where
anything was timed samples.csv.gz and rounds.csv (per-rep times, per-round medians and GPU
state: see :mod:`kernelbench.report.samples`).

``results.csv`` is appended row by row as results arrive (and flushed), so a crash, Ctrl-C or
SIGTERM keeps everything measured until then (the samples at most a few seconds less);
``run.json`` (the fingerprint, the ceilings, the outcome and a summary: the rows live in
``results.csv`` only) is rewritten at the start, every few seconds, and at the end; ``summary.md``
and ``junit.xml`` are written when the run closes, also when it closes on an exception or a signal.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from ..harness.rows import ROW_FIELDS, RoundSamples, Row
from ..ops.plugins import records as plugin_records
from .plot import plots_markdown
from .samples import SamplesFile
from .tables import bench_table, parity_table, to_markdown

RESULTS_CSV, RUN_JSON, SUMMARY_MD, JUNIT_XML = "results.csv", "run.json", "summary.md", "junit.xml"
# 2: run.json holds a summary instead of a copy of every row.
SCHEMA_VERSION = 2
_JSON_EVERY_S = 5.0


class ReportError(ValueError):
    """A folder that is no readable kernelbench report; the message says which file and why."""


def default_output_dir(verb: str, label: str, root: Path = Path("reports")) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}-{verb}-{label}"


class ReportWriter:
    """A row sink (see harness.rows.RowSink) that persists as it goes."""

    def __init__(self, folder: Path, fingerprint: dict, verb: str, *, settings: dict | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.verb = verb
        self.settings = dict(settings or {})
        self.interruption: str | None = None
        self.rows: list[dict] = []
        self.ceilings: dict | None = None
        self.outcome = "running"
        self._csv = self.folder / RESULTS_CSV
        pd.DataFrame(columns=list(ROW_FIELDS)).to_csv(self._csv, index=False)
        self.samples = SamplesFile(self.folder)
        self._last_json = 0.0
        self._write_json()

    def add(self, row: Row | dict) -> None:
        row = row.as_dict() if isinstance(row, Row) else {k: row.get(k) for k in ROW_FIELDS}
        self.rows.append(row)
        pd.DataFrame([row], columns=list(ROW_FIELDS)).to_csv(self._csv, mode="a", header=False, index=False)
        if time.monotonic() - self._last_json > _JSON_EVERY_S:
            self._write_json()

    def add_round(self, samples: RoundSamples) -> None:
        """One round's per-rep times and GPU state (see harness.rows.SampleSink)."""
        self.samples.add(samples)

    def set_ceilings(self, ceilings: dict) -> None:
        self.ceilings = ceilings
        self._write_json()

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(ROW_FIELDS))

    def close(self, outcome: str, interruption: str | None = None) -> None:
        """outcome: complete / interrupted / failed; interruption: what stopped it (SIGTERM...)."""
        self.outcome = outcome
        self.interruption = interruption
        self.samples.flush()
        self._write_json()
        markdown = self.summary_markdown() + plots_markdown(self.folder, self.frame())
        (self.folder / SUMMARY_MD).write_text(markdown)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a") as fh:
                fh.write(markdown + "\n")
        self._write_junit()

    # -- files ----------------------------------------------------------------------------------
    def _write_json(self) -> None:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "verb": self.verb,
            "outcome": self.outcome,
            "interruption": self.interruption,
            "environment": self.fingerprint,
            "settings": self.settings,
            "ceilings": self.ceilings,
            # Plugins this process loaded: what each brought (its rows say source = plugin:NAME), or why not.
            "plugins": plugin_records(),
            "summary": self.summary(),
        }
        tmp = self.folder / (RUN_JSON + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(self.folder / RUN_JSON)
        self._last_json = time.monotonic()

    def summary(self) -> dict:
        """Counts a reader (or a CI step) checks first; the rows themselves are in results.csv."""
        checks = [r["status"] for r in self.rows if r["metric"] == "parity"]
        timed = [r["status"] for r in self.rows if r["metric"] == "time_median_ms"]
        results = [r["status"] for r in self.rows if r["metric"] == "output_check"]
        return {
            "results_file": RESULTS_CSV,
            "rows": len(self.rows),
            "timed": {s: timed.count(s) for s in sorted(set(timed))},
            "parity_checks": {s: checks.count(s) for s in sorted(set(checks))},
            "timed_result_checks": {s: results.count(s) for s in sorted(set(results))},
            **self.samples.summary(),
        }

    def summary_markdown(self) -> str:
        env = self.fingerprint
        where = env.get("gpu_name") or f"CPU ({env.get('cpu', '?')})"
        lines = [
            f"# kernelbench {self.verb}: {self.outcome}",
            "",
            f"{where}; torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}; "
            f"kernelbench {env.get('kernelbench')} ({env.get('git_sha')}); {env.get('utc_time')} UTC",
            "",
            f"Command: `{env.get('command_line')}`",
            "",
        ]
        if self.interruption:
            lines += [f"**Interrupted** ({self.interruption}): the tables hold what was measured before.", ""]
        if self.ceilings:
            lines += [f"Ceilings measured in this run: copy {self.ceilings['copy_gbps']:.0f} GB/s, "
                      f"bf16 matmul {self.ceilings['matmul_tflops']:.0f} TFLOP/s.", ""]
        kept = self.samples.summary()
        if kept:
            throttled = kept["throttled_rows"]
            lines += [f"Per-rep times: `{kept['samples_file']}` ({kept['reps']} reps); per round: "
                      f"`{kept['rounds_file']}` (GPU state: {kept['gpu_state_source']}"
                      + (f"; clocks held down by power or heat in {kept['throttled_rounds']} round(s) of "
                         f"{len(throttled)} row(s), flagged `throttled`" if throttled else "") + ").", ""]
        frame = self.frame()
        bench, parity = bench_table(frame), parity_table(frame)
        if not bench.empty:
            lines += ["## Speed", "", "Median of per-rep times; `vs anchor` is median / median of the op's "
                      "anchor in the same run (below 1 is faster).", "", to_markdown(bench)]
        if not parity.empty:
            lines += ["## Parity", "", to_markdown(parity)]
        return "\n".join(lines)

    def _write_junit(self) -> None:
        # Parity checks, and the check of each timed candidate's result (a wrong one fails CI too).
        checks = [r for r in self.rows if r["metric"] in ("parity", "output_check")]
        suite = ET.Element("testsuite", name=f"kernelbench.{self.verb}", tests=str(len(checks)),
                           failures=str(sum(r["status"] == "fail" for r in checks)),
                           errors=str(sum(r["status"] == "error" for r in checks)),
                           skipped=str(sum(r["status"] == "skipped" for r in checks)))
        for r in checks:
            kind = "parity" if r["metric"] == "parity" else "timed-result"
            case = ET.SubElement(suite, "testcase", classname=f"kernelbench.{kind}.{r['op']}",
                                 name=f"{r['workload']}/{r['mode']}/{r['candidate']}")
            if r["status"] == "fail":
                ET.SubElement(case, "failure", message=str(r["message"])[:500]).text = str(r["message"])
            elif r["status"] == "error":
                ET.SubElement(case, "error", message=str(r["message"])[:500]).text = str(r["message"])
            elif r["status"] == "skipped":
                ET.SubElement(case, "skipped", message=str(r["message"]))
            else:
                ET.SubElement(case, "system-out").text = str(r["message"])
        root = ET.Element("testsuites")
        root.append(suite)
        ET.ElementTree(root).write(self.folder / JUNIT_XML, encoding="utf-8", xml_declaration=True)


def load_report(folder: Path) -> tuple[dict, pd.DataFrame]:
    """A report folder's run.json (environment, ceilings) and its rows from results.csv; reads
    reports of either schema. Raises ReportError naming the file when either is unreadable."""
    folder = Path(folder)
    csv_path, json_path = folder / RESULTS_CSV, folder / RUN_JSON
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such report folder")
    if not csv_path.is_file():
        raise ReportError(f"{folder}: no {RESULTS_CSV} (is this a kernelbench report folder?)")
    meta: dict = {}
    if json_path.is_file():
        try:
            meta = json.loads(json_path.read_text())
        except (ValueError, OSError) as exc:
            raise ReportError(f"{json_path}: not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise ReportError(f"{json_path}: expected a JSON object, found a {type(meta).__name__}")
        if not isinstance(meta.get("environment", {}), dict):
            raise ReportError(f"{json_path}: 'environment' is not an object")
    rows = read_csv(csv_path, [c for c in ROW_FIELDS if c not in ("tensor", "source")], what="results")
    if "tensor" not in rows.columns:
        rows["tensor"] = ""
    if "source" not in rows.columns:  # reports from before plugins: every row was kernelbench's
        rows["source"] = "kernelbench"
    return meta, rows


def read_csv(path: Path, columns, *, what: str) -> pd.DataFrame:
    """A report's CSV file with at least ``columns``; a ReportError names the file and what is
    wrong with it (unreadable, empty, cut short, other columns)."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        text = str(exc).strip()
        raise ReportError(f"{path}: not a readable {what} file ({type(exc).__name__}: "
                          f"{text.splitlines()[0] if text else 'empty'})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ReportError(f"{path}: not a kernelbench {what} file: no column {', '.join(missing)} "
                          f"(expected: {', '.join(columns)})")
    return frame
