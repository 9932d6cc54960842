"""kernelbench plot and the plots every report writes: which PNGs a folder gets, that they are
images, that summary.md links them, and what happens without matplotlib."""

from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.report import plot
from kernelbench.report.writer import ReportWriter

runner = CliRunner()
FINGERPRINT = {"device": "cuda", "gpu_name": "test GPU", "torch": "t", "triton": "t"}
SWEEP = [f"sweep-n{n}-bf16" for n in (256, 1024, 4096, 16384)]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


def _row(workload, candidate, metric, value, status="ok", mode="fwd", op="rmsnorm"):
    return {"op": op, "workload": workload, "mode": mode, "candidate": candidate, "metric": metric,
            "value": value, "unit": "", "status": status, "flags": "", "tensor": "", "message": ""}


def _run_rows(scale: float = 1.0):
    """An RMSNorm sweep as `run` writes it: times, % of copy, ratios to the anchor, parity."""
    rows = []
    for i, w in enumerate(SWEEP):
        for cand, ms in (("torch-compile", 0.14), ("triton", 0.13 * scale)):
            rows += [_row(w, cand, "time_median_ms", ms + 0.001 * i), _row(w, cand, "pct_copy_bw", 90 + i)]
        rows.append(_row(w, "triton", "ratio_vs_anchor", 0.13 * scale / 0.14))
    rows += [_row("32768x4096-bf16", "triton", "parity", 1.0, "pass"),
             _row("32768x4096-bf16", "triton", "parity_rel_fro", 3e-3, "pass"),
             _row("32768x4096-bf16", "liger", "parity", 0.0, "fail"),
             _row("32768x4096-bf16", "liger", "parity_rel_fro", 0.0, "fail")]
    return rows


def _write(folder, rows, verb="run"):
    writer = ReportWriter(folder, FINGERPRINT, verb)
    for r in rows:
        writer.add(r)
    writer.close("complete")
    return folder


def _is_png(path) -> bool:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.ndim == 3 and min(image.shape[:2]) > 100


def test_a_run_report_gets_ratio_sweep_and_parity_plots_linked_from_its_summary(tmp_path):
    folder = _write(tmp_path / "run", _run_rows())
    pngs = {p.name for p in folder.glob("*.png")}
    assert pngs == {"ratios-rmsnorm.png", "sweep-rmsnorm-fwd.png", "parity-rmsnorm.png"}
    assert all(_is_png(folder / p) for p in pngs)
    summary = (folder / "summary.md").read_text()
    assert "## Plots" in summary
    for p in pngs:
        assert f"]({p})" in summary


def test_two_workloads_are_no_sweep_and_unknown_workloads_are_skipped(tmp_path):
    rows = [r for r in _run_rows() if r["workload"] in SWEEP[:2]]
    rows += [_row(w, "triton", "time_median_ms", 1.0, op="not-an-op") for w in ("a", "b", "c")]
    folder = _write(tmp_path / "run", rows)
    assert {p.name for p in folder.glob("*.png")} == {"ratios-rmsnorm.png"}


def test_plot_command_redraws_reports_and_plots_compare(tmp_path):
    base, new = _write(tmp_path / "base", _run_rows()), _write(tmp_path / "new", _run_rows(scale=1.5))
    for png in base.glob("*.png"):
        png.unlink()
    result = invoke("compare", base, new, "--output-dir", tmp_path / "cmp")
    assert result.exit_code == 3, result.output  # triton 1.5x slower: a regression
    result = invoke("plot", base, tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    assert {p.name for p in base.glob("*.png")} == {"ratios-rmsnorm.png", "sweep-rmsnorm-fwd.png",
                                                   "parity-rmsnorm.png"}
    assert _is_png(tmp_path / "cmp" / "compare.png")
    assert "wrote" in result.output and "compare.png" in result.output


def test_plot_command_refuses_a_folder_that_is_no_report(tmp_path):
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2
    assert "not a report folder" in result.output


def test_without_matplotlib_the_summary_says_how_to_get_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)
    folder = _write(tmp_path / "run", _run_rows())
    assert not list(folder.glob("*.png"))
    summary = (folder / "summary.md").read_text()
    assert plot.INSTALL_HINT in summary and f"kernelbench plot {folder}" in summary
    result = invoke("plot", folder)
    assert result.exit_code == 2 and "pip install" in result.output


def test_a_failing_plot_does_not_cost_the_report_its_summary(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no ink")

    monkeypatch.setattr(plot, "plot_ratios", broken)
    folder = _write(tmp_path / "run", _run_rows())
    summary = (folder / "summary.md").read_text()
    assert "plotting failed: RuntimeError: no ink" in summary and "## Parity" in summary


def test_a_parity_report_gets_its_parity_plot(tmp_path):
    rows = [r for r in _run_rows() if r["metric"].startswith("parity")]
    folder = _write(tmp_path / "p", rows, "parity")
    assert {p.name for p in folder.glob("*.png")} == {"parity-rmsnorm.png"}


# -- errors, summary.md, and what the figures show ------------------------------------------------
def _error_lines(text):
    return [line for line in text.splitlines() if line.strip()]


def test_plot_on_a_damaged_or_empty_file_exits_2_with_one_line(tmp_path):
    header = ",".join(_row("w", "c", "m", 1.0))
    cases = {"results.csv": ["", 'a,b\n"1,2\n3,4,5,6\n', "op,workload\nrmsnorm,w\n", header[:30]],
             "losses.csv": [""]}
    for name, texts in cases.items():
        for i, text in enumerate(texts):
            folder = tmp_path / f"{name}-{i}"
            folder.mkdir()
            (folder / name).write_text(text)
            result = runner.invoke(app, ["plot", str(folder)], catch_exceptions=False)
            assert result.exit_code == 2, (name, text, result.output)
            lines = _error_lines(result.stderr)
            assert len(lines) == 1 and str(folder / name) in lines[0] and "Traceback" not in result.output


def test_plot_links_the_plots_from_a_summary_that_said_they_were_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)
    folder = _write(tmp_path / "run", _run_rows())
    assert plot.INSTALL_HINT in (folder / "summary.md").read_text()
    monkeypatch.undo()
    result = invoke("plot", folder)
    assert result.exit_code == 0, result.output
    summary = (folder / "summary.md").read_text()
    assert plot.INSTALL_HINT not in summary and summary.count("## Plots") == 1 and "## Parity" in summary
    assert all(f"]({p.name})" in summary for p in folder.glob("*.png"))
    assert "updated" in result.output


def _frame_holds_its_labels(fig):
    fig.canvas.draw()
    for ax in fig.axes:
        box = ax.get_window_extent()
        for text in ax.texts:
            inner = text.get_window_extent()
            assert box.x0 - 1 <= inner.x0 and inner.x1 <= box.x1 + 1, (text.get_text(), inner, box)


def _decade_aligned(ax, axis="x"):
    import math

    scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
    if scale == "linear":
        return True
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    return all(abs(math.log10(v) - round(math.log10(v))) < 1e-9 for v in (lo, hi))


def test_parity_plot_decade_axis_tolerance_marks_and_labels_in_the_frame():
    import pandas as pd

    rows = pd.DataFrame(_run_rows())
    rows.loc[(rows.metric == "parity_rel_fro") & (rows.candidate == "triton"), "message"] = "atol 1e-05, rtol 1e-05"
    rows.loc[(rows.metric == "parity_rel_fro") & (rows.candidate == "liger"), "message"] = "rel Frobenius <= 0.01"
    rows.loc[(rows.metric == "parity_rel_fro") & (rows.candidate == "liger"), "value"] = 5.8e-8
    fig = plot.parity_figure("rmsnorm", rows[rows.metric == "parity"], rows[rows.metric == "parity_rel_fro"])
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and _decade_aligned(ax) and ax.get_xlim()[0] <= 5.8e-8
    marks = ax.collections[0].get_offsets()
    assert sorted(float(x) for x, _ in marks) == [1e-5, 1e-2]
    _frame_holds_its_labels(fig)


def test_ratio_plot_names_the_anchor_on_a_linear_axis_from_zero():
    import pandas as pd

    rows = pd.DataFrame(_run_rows())
    ratios = rows[rows.metric == "ratio_vs_anchor"].assign(
        message="median / median of torch-compile in the same run (below 1: faster)")
    ratios.loc[ratios.index[0], "value"] = 2.5
    fig = plot.ratios_figure("rmsnorm", ratios)
    (ax,) = fig.axes
    assert "torch-compile" in ax.get_title() and "torch-compile" in ax.get_xlabel()
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    _frame_holds_its_labels(fig)


def test_every_report_plot_has_linear_or_decade_aligned_value_axes(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    folder = _write(tmp_path / "run", _run_rows())
    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (drawn.append(fig), save(fig, *a, **kw)))
    plot.write_plots(folder)
    assert len(drawn) == 3  # ratios, sweep, parity
    for fig in drawn:
        for ax in fig.axes:
            # x of a sweep is the size on a base-2 axis (every point a power of two)
            assert _decade_aligned(ax, "y") and (ax.get_xscale() == "log" or _decade_aligned(ax, "x")), ax.get_title()
