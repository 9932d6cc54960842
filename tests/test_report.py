"""The report folder's schema: what CI archives and what compare reads back."""

import json
import xml.etree.ElementTree as ET

import pandas as pd

from kernelbench.harness.rows import ROW_FIELDS
from kernelbench.report.writer import SCHEMA_VERSION, ReportWriter, load_report


def _row(**kw):
    base = {"op": "adamw", "workload": "tiny", "mode": "step", "candidate": "c", "metric": "time_median_ms",
            "value": 1.5, "unit": "ms", "status": "ok", "flags": "", "tensor": "", "message": ""}
    return {**base, **kw}


def test_schema_of_every_file(tmp_path, monkeypatch):
    step_summary = tmp_path / "gh_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    env = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6"}
    writer = ReportWriter(tmp_path / "rep", env, "run")
    writer.set_ceilings({"copy_gbps": 3000.0, "matmul_tflops": 700.0})
    writer.add(_row())
    writer.add(_row(metric="parity", value=1.0, unit="", status="pass", message="3 tensors"))
    writer.add(_row(candidate="d", metric="parity", value=0.0, unit="", status="fail", message="w0 (step 2)"))
    writer.add(_row(candidate="e", metric="parity", value=None, unit="", status="error", message="boom"))
    writer.close("complete")
    folder = tmp_path / "rep"

    csv = pd.read_csv(folder / "results.csv")
    assert list(csv.columns) == list(ROW_FIELDS) and len(csv) == 4

    doc = json.loads((folder / "run.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["outcome"] == "complete" and doc["verb"] == "run"
    assert doc["environment"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert doc["ceilings"]["copy_gbps"] == 3000.0
    assert "rows" not in doc  # the rows live in results.csv only
    assert doc["summary"]["rows"] == 4 and doc["summary"]["parity_checks"] == {"error": 1, "fail": 1, "pass": 1}

    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("errors") == "1"
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names == ["tiny/step/c", "tiny/step/d", "tiny/step/e"]

    md = (folder / "summary.md").read_text()
    assert "copy 3000 GB/s" in md and "## Speed" in md and "## Parity" in md and "w0 (step 2)" in md
    assert step_summary.read_text().strip() == md.strip()

    meta, rows = load_report(folder)
    assert meta["environment"] == env and len(rows) == 4


def test_nan_and_inf_values_round_trip_through_results_csv(tmp_path):
    writer = ReportWriter(tmp_path, {}, "parity")
    writer.add(_row(value=float("nan")))
    writer.add(_row(value=float("inf")))
    writer.close("complete")
    json.loads((tmp_path / "run.json").read_text())  # valid JSON whatever the rows hold
    _, rows = load_report(tmp_path)
    assert rows.value.isna().iloc[0] and rows.value.iloc[1] == float("inf")
