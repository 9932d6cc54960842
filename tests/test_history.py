"""The history store: reports added over commits (once each), series read back in run order with
their intervals, step changes told from spikes and noise, and the plot."""

import json
import sqlite3

import numpy as np
import pytest

from kernelbench.harness.rows import RoundSamples
from kernelbench.ops.base import UsageError
from kernelbench.report.history import add_report, flag_steps, history_table, load_series, plot_history
from kernelbench.report.plot import matplotlib_available
from kernelbench.report.samples import SAMPLES_CSV
from kernelbench.report.writer import ReportWriter


def test_steps_spikes_and_noise():
    flat = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    assert flag_steps(flat, [None] * 6, [None] * 6) == [""] * 6
    up = [1.0, 1.01, 0.99, 1.0, 1.2, 1.21, 1.19, 1.2]
    assert flag_steps(up, [None] * 8, [None] * 8) == ["", "", "", "", "step up +20%", "", "", ""]
    # After a step the new level is the reference: a second step down is found against it.
    down = [1.0, 1.0, 1.2, 1.2, 1.2, 0.9, 0.9]
    assert flag_steps(down, [None] * 7, [None] * 7) == ["", "", "step up +20%", "", "", "step down -25%", ""]
    spike = [1.0, 1.0, 1.0, 1.3, 1.0, 1.0]
    assert flag_steps(spike, [None] * 6, [None] * 6)[3] == "spike +30%"
    assert flag_steps([1.0, 1.0, 1.0, 1.12], [None] * 4, [None] * 4)[3] == "new level? +12%"
    # A jump whose own interval reaches back to the level is noise, not a step; the next, precise one is.
    labels = flag_steps([1.0, 1.0, 1.2, 1.2], [0.9, 0.9, 0.95, 1.15], [1.1, 1.1, 1.4, 1.25])
    assert labels == ["", "", "", "new level? +20%"]


def _report(folder, sha, utc, level, *, samples=True, gpu="NVIDIA H100 80GB HBM3", torch="2.11"):
    env = {"device": "cuda", "gpu_name": gpu, "gpu_uuid": "GPU-1", "torch": torch, "triton": "3.6", "git_sha": sha,
           "utc_time": utc, "hostname": "h"}
    writer = ReportWriter(folder, env, "run")
    rng = np.random.default_rng(abs(hash(sha)) % 2**32)
    for cand, scale in (("triton", 1.0), ("torch", 2.0)):
        rounds = [level * scale * (1 + 0.01 * rng.standard_normal(50)) for _ in range(3)]
        times = np.concatenate(rounds)
        key = {"op": "rmsnorm", "workload": "w", "mode": "fwd", "candidate": cand, "unit": "ms", "status": "ok"}
        for metric, q in (("time_median_ms", 0.5), ("time_p25_ms", 0.25), ("time_p75_ms", 0.75)):
            writer.add({**key, "metric": metric, "value": float(np.quantile(times, q))})
        writer.add({**key, "metric": "reps", "value": len(times), "unit": ""})
        for i, r in enumerate(rounds):
            writer.add_round(RoundSamples("rmsnorm", "w", "fwd", cand, "time_median_ms", i + 1, tuple(r)))
    writer.close("complete")
    if not samples:
        (folder / SAMPLES_CSV).unlink()
    return folder


def test_add_show_and_plot(tmp_path):
    store = tmp_path / "h.sqlite"
    levels = [1.0, 1.0, 1.0, 1.15, 1.15, 1.15]
    for i, level in enumerate(levels):
        added = add_report(store, _report(tmp_path / f"r{i}", f"{i:07d}abc", f"2026-11-2{i}T10:00:00+00:00", level,
                                          samples=i != 2, torch="2.12" if i == 5 else "2.11"))
        assert added.new and added.rows == 2
    again = add_report(store, tmp_path / "r0")
    assert not again.new and again.run_id == 1  # the same report twice is kept once
    series = load_series(store, "rmsnorm", workload="w")
    assert len(series) == 12 and list(series[series.candidate == "triton"]["git_sha"]) == [
        f"{i:07d}abc" for i in range(6)]
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (6,)
        intervals = [r[0] for r in db.execute("SELECT interval FROM timings WHERE candidate='triton' ORDER BY run_id")]
    assert intervals[2] == "p25-p75" and intervals[0] == "95% bootstrap interval of the median"
    table = history_table(series)
    triton = table[table.candidate == "triton"].reset_index(drop=True)
    assert triton.step.tolist() == ["", "", "", "step up +15%", "", ""]
    assert triton.loc[3, "vs previous"] == pytest.approx(1.15, abs=0.02)
    assert (triton.low < triton["median ms"]).all() and (triton["median ms"] < triton.high).all()
    assert triton.loc[5, "notes"] == "torch 2.11 -> 2.12" and triton.loc[0, "commit"] == "0000000"
    assert load_series(store, "rmsnorm", gpu="NVIDIA H200").empty
    if matplotlib_available():
        paths = plot_history(table, "rmsnorm", tmp_path / "plots")
        assert [p.name for p in paths] == ["history-rmsnorm-w-fwd.png"]
        assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_refuses_what_it_cannot_keep(tmp_path):
    empty = tmp_path / "empty"
    ReportWriter(empty, {"utc_time": "2026-11-26T00:00:00+00:00"}, "parity").close("complete")
    with pytest.raises(UsageError, match="no timed row"):
        add_report(tmp_path / "h.sqlite", empty)
    with pytest.raises(UsageError, match="no such report folder"):
        add_report(tmp_path / "h.sqlite", tmp_path / "missing")
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("hello " * 100)
    with pytest.raises(UsageError, match="not a kernelbench history store"):
        add_report(not_a_db, _report(tmp_path / "r", "abc", "2026-11-26T00:00:00+00:00", 1.0))
    with pytest.raises(UsageError, match="no history store there"):
        load_series(tmp_path / "absent.sqlite", "rmsnorm")
    json.loads((empty / "run.json").read_text())
