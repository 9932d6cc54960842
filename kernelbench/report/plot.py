"""PNG plots of report folders, written beside the report and linked from its summary.md.

What a folder holds decides what is drawn:

- ``losses.csv`` (``train``): ``losses.png``, each candidate's running loss against the step
  with the reference's band shaded and the loss floor dashed, and below it the gap to the
  reference mean in band units (inside +-1 passes).
- ``results.csv`` rows with speed figures (``run``): ``ratios-<op>.png``, each candidate's
  median over its anchor's in the same run; and for every (op, mode) measured on three or more
  workloads of one kind (a sweep), ``sweep-<op>-<mode>.png``: time and % of copy bandwidth
  against the workload's size, per candidate.
- parity rows (``parity``, ``run --parity-steps``): ``parity-<op>.png``, the worst relative
  Frobenius error of each check, pass and fail coloured.
- ``compare.csv`` (``compare -o``, ``ab``): ``compare.png``, new / base per row coloured by
  verdict, with the interval of the ratio where samples gave one.
- ``samples.csv.gz`` (asked for by ``kernelbench plot``, not drawn into every report):
  ``samples-<op>.png``, each row's per-rep times over its median, and each round's median.

matplotlib is optional (``pip install 'kernelbench[plot]'``); without it the summary says how to
get the plots. Figures are drawn through matplotlib's object API on the Agg canvas: no pyplot
state, no display needed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

INSTALL_HINT = "pip install 'kernelbench[plot]'"
KEYS = ["op", "workload", "mode", "candidate"]
_STATUS_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#6a1b9a"}
_VERDICT_COLOURS = {"faster": "#2e7d32", "same": "#757575", "slower": "#c62828", "regression": "#c62828",
                    "broken": "#6a1b9a", "inconclusive": "#ef6c00"}


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(name))


def decade_limits(values, *, room: int = 0) -> tuple[float, float]:
    """Log-axis limits on whole decades around the positive ``values`` (``room`` decades more
    above, for labels); (1e-1, 1e1) when there is none."""
    positive = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not positive:
        return 0.1, 10.0
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    return 10.0 ** lo, 10.0 ** max(hi + room, lo + 1)


def _decade_axis(axis, limits: tuple[float, float]) -> None:
    """A log axis with these limits, ticks on every decade and no minor labels."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, numticks=30))
    axis.set_major_formatter(LogFormatterSciNotation(base=10))
    axis.set_minor_formatter(NullFormatter())
    (axis.axes.set_xlim if axis is axis.axes.xaxis else axis.axes.set_ylim)(*limits)


def _colours(names) -> dict:
    from matplotlib import colormaps

    # tab10 without its grey (the colour of bands and reference lines), tab20 beyond nine names
    palette = [c for i, c in enumerate(colormaps["tab10"].colors) if i != 7]
    if len(names) > len(palette):
        palette = list(colormaps["tab20"].colors)
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


# ------------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------------


def plot_losses(folder: Path, losses: pd.DataFrame) -> Path | None:
    """losses.png from a train report's losses (its losses.csv) and train.json; None when no
    step was logged."""
    from ..train.band import running_loss, step_band, tail_window
    from ..train.run import TRAIN_JSON

    folder = Path(folder)
    if losses.empty:
        return None
    meta = _read_json(folder / TRAIN_JSON)
    settings = meta.get("settings", {})
    steps = int(losses["step"].max()) + 1
    window = int(meta.get("window") or tail_window(max(steps, 1)))
    rtol = float(settings.get("rtol", 0.01))
    roles = {c["name"]: c for c in meta.get("candidates", [])}
    reference = next((n for n, c in roles.items() if c["role"] == "reference"), None)
    if reference is None:
        reference = losses["candidate"].iloc[0]

    def curve(name: str, seed: int):
        part = losses[(losses["candidate"] == name) & (losses["seed"] == seed)].sort_values("step")
        return part["step"].to_numpy(), part["loss"].to_numpy(dtype=float)

    ref_runs = [curve(reference, s)[1] for s in sorted(losses.loc[losses["candidate"] == reference, "seed"].unique())]
    ref_runs = [r for r in ref_runs if len(r) == steps]
    band = step_band(ref_runs, rtol, window) if ref_runs else None

    fig = _figure(9, 7)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    names = list(dict.fromkeys(losses["candidate"]))
    colours = _colours(names)
    x = range(steps)
    if band is not None:
        top.fill_between(x, band.low, band.high, color="0.6", alpha=0.35, lw=0,
                         label=f"reference band ({len(ref_runs)} data orders, + rtol {rtol:g})")
        bottom.axhspan(-1, 1, color="0.6", alpha=0.35, lw=0)
        bottom.axhline(0, color="0.3", lw=0.8)
    floor = meta.get("data", {}).get("entropy_rate")
    if floor is not None:
        top.axhline(floor, color="0.2", ls="--", lw=1, label=f"loss floor {floor:.3f} (entropy rate)")
    for name in names:
        seeds = sorted(losses.loc[losses["candidate"] == name, "seed"].unique())
        own = roles.get(name, {})
        for seed in seeds[:1]:  # the judged run (the reference's other seeds are the band)
            steps_x, y = curve(name, seed)
            run = running_loss(y, window)
            label = name
            if own.get("final_loss") is not None:
                label += f": {own['final_loss']:.4f}, {own.get('status', '')}"
            elif own.get("status"):
                label += f": {own['status']}"
            top.plot(steps_x, y, color=colours[name], alpha=0.18, lw=0.7)
            top.plot(steps_x, run, color=colours[name], lw=1.6, label=label,
                     ls="-" if own.get("role") != "anchor" else ":")
            if band is not None:
                n = min(len(run), len(band.mean))
                gap = (run[:n] - band.mean[:n]) / band.half_width[:n]
                bottom.plot(steps_x[:n], gap, color=colours[name], lw=1.3,
                            ls="-" if own.get("role") != "anchor" else ":")
    top.set_ylabel("loss (nats; faint: per step, solid: running mean)")
    top.legend(fontsize=8, loc="best")
    top.grid(True, which="both", alpha=0.3)
    bottom.set_ylabel("gap to reference\n(band units, +-1 passes)")
    bottom.set_xlabel(f"step (running mean over {window} steps)")
    bottom.grid(True, alpha=0.3)
    if band is not None:
        lim = max(3.0, min(20.0, float(pd.Series(bottom.get_ylim()).abs().max())))
        bottom.set_ylim(-lim, lim)
    title = f"kernelbench train {meta.get('op', '')}: {settings.get('model', '')}, {steps} steps"
    if settings:
        title += f", batch {settings.get('batch')} x {settings.get('seq')} tokens"
    top.set_title(title)
    return _save(fig, folder / "losses.png")


# ------------------------------------------------------------------------------------------------
# run: ratios and sweeps
# ------------------------------------------------------------------------------------------------


_ANCHOR = re.compile(r"median of (\S+) in the same run")


def anchor_of(part: pd.DataFrame) -> str:
    """The anchor a ratio row was divided by, as its message names it."""
    names = {m.group(1) for m in (_ANCHOR.search(t) for t in part["message"] if isinstance(t, str)) if m}
    return ", ".join(sorted(names)) or "the op's anchor"


def ratios_figure(op: str, part: pd.DataFrame):
    """Each candidate's median over the anchor's, per workload and mode, on a linear axis from 0."""
    part = part.sort_values(["workload", "mode", "candidate"], kind="stable")
    anchor = anchor_of(part)
    labels = [f"{w} | {m} | {c}" for w, m, c in zip(part["workload"], part["mode"], part["candidate"])]
    colours = _colours(list(dict.fromkeys(part["candidate"])))
    fig = _figure(9, 1.4 + 0.28 * len(part))
    ax = fig.subplots()
    y = range(len(part))
    ax.barh(y, part["value"], color=[colours[c] for c in part["candidate"]])
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="0.2", lw=1)
    for yi, v in zip(y, part["value"]):
        ax.annotate(f"{v:.3g}", (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    # Room right of the longest bar for its label.
    ax.set_xlim(0, 1.2 * max(1.0, float(part["value"].max())))
    ax.set_xlabel(f"median / median of {anchor} in the same run (below 1: faster than {anchor})")
    ax.set_title(f"{op}: time relative to {anchor}")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def plot_ratios(rows: pd.DataFrame, folder: Path) -> list[Path]:
    """ratios-<op>.png: each candidate's ratio to its op's anchor, per workload and mode."""
    ratios = rows[(rows["metric"] == "ratio_vs_anchor") & (rows["status"] == "ok")].dropna(subset=["value"])
    return [_save(ratios_figure(op, part), folder / f"ratios-{_safe(op)}.png")
            for op, part in ratios.groupby("op", sort=False)]


def _workload_size(op_name: str, workload: str):
    """(x, what) for a workload from the op registry: its shape, or its total elements."""
    try:
        from ..ops import get_op

        op = get_op(op_name)
        found = op.workloads.get(workload) or op.custom_workload(workload)  # or written as a shape (16384x4096:bf16)
    except Exception:  # an op this version does not know, or a spec it does not read
        return None
    if found is None:  # a workload name this version does not know
        return None
    spec = found.spec
    if "shape" in spec:
        shape = tuple(spec["shape"])
        return shape, math.prod(shape), str(spec.get("dtype", ""))
    if "shapes" in spec:
        total = sum(math.prod(s) for _, s in spec["shapes"])
        return (total,), total, str(spec.get("dtype", ""))
    return None


def _sweep_axis(op: str, workloads: list[str]):
    """The x values and label of a sweep, or None when the workloads are not one."""
    sizes = {w: _workload_size(op, w) for w in workloads}
    if any(s is None for s in sizes.values()) or len({s[2] for s in sizes.values()}) != 1:
        return None
    numels = {s[1] for s in sizes.values()}
    shapes = [s[0] for s in sizes.values()]
    varying = ([i for i in range(len(shapes[0])) if len({shape[i] for shape in shapes}) > 1]
               if len({len(shape) for shape in shapes}) == 1 else [])
    if len(numels) == 1 and all(len(s[0]) >= 2 for s in sizes.values()):
        xs = {w: s[0][-1] for w, s in sizes.items()}
        label = f"N, the last dimension (M x N = {next(iter(numels)):,} elements)"
    elif len(varying) == 1:  # one dimension swept (--sweep), the others fixed
        xs = {w: s[0][varying[0]] for w, s in sizes.items()}
        label = _dimension_label(op, varying[0], shapes[0])
    else:
        xs = {w: s[1] for w, s in sizes.items()}
        label = "elements"
    if len(set(xs.values())) < 3:
        return None
    return xs, label


def _dimension_label(op_name: str, index: int, shape: tuple) -> str:
    """The swept dimension by the op's name for it, the others as they stood."""
    try:
        from ..ops import get_op

        names = get_op(op_name).dims.names
    except Exception:  # an op that does not name its dimensions
        names = tuple(f"dim {i}" for i in range(len(shape)))
    fixed = ", ".join(f"{n} = {v}" for i, (n, v) in enumerate(zip(names, shape)) if i != index)
    return f"{names[index]}" + (f" ({fixed})" if fixed else "")


def plot_sweeps(rows: pd.DataFrame, folder: Path) -> list[Path]:
    """sweep-<op>-<mode>.png: time, and the share of the binding roofline (copy bandwidth, or
    the bf16 matmul rate for FLOP-bound ops), against the workload size per candidate."""
    times = rows[(rows["metric"] == "time_median_ms") & (rows["status"] == "ok")].dropna(subset=["value"])
    out = []
    for (op, mode), part in times.groupby(["op", "mode"], sort=False):
        workloads = list(dict.fromkeys(part["workload"]))
        if len(workloads) < 3:
            continue
        axis = _sweep_axis(op, workloads)
        if axis is None:
            continue
        xs, label = axis
        mine = rows[(rows["op"] == op) & (rows["mode"] == mode)]
        roof = {m: mine[mine["metric"] == m].dropna(subset=["value"]) for m in ("pct_copy_bw", "pct_matmul")}
        bound = max((m for m in roof if not roof[m].empty), key=lambda m: roof[m]["value"].median(), default=None)
        sources = [part] + ([roof[bound]] if bound else [])
        fig = _figure(9, 7 if bound else 4.5)
        axes = fig.subplots(len(sources), 1, sharex=True, squeeze=False)[:, 0]
        names = list(dict.fromkeys(part["candidate"]))
        colours = _colours(names)
        for name in names:
            for ax, source in zip(axes, sources):
                points: dict = {}
                for w, v in zip(source.loc[source["candidate"] == name, "workload"],
                                source.loc[source["candidate"] == name, "value"]):
                    if w in xs:  # one point per size: a headline shape can repeat a sweep point
                        points.setdefault(xs[w], v)
                if points:
                    px = sorted(points)
                    ax.plot(px, [points[p] for p in px], marker="o", ms=3.5, color=colours[name], label=name)
        axes[0].set_yscale("log")
        _decade_axis(axes[0].yaxis, decade_limits(part["value"]))
        axes[0].set_ylabel("median ms")
        axes[0].set_title(f"{op} {mode}: sweep")
        axes[0].legend(fontsize=8)
        if bound:
            axes[1].set_ylabel("% of copy bandwidth" if bound == "pct_copy_bw" else "% of bf16 matmul rate")
            axes[1].axhline(100, color="0.3", lw=0.8, ls="--")
            axes[1].set_ylim(0, 1.1 * max(100.0, float(roof[bound]["value"].max())))
        for ax in axes:
            # Sweep sizes are powers of two: a base-2 axis puts every point on a tick.
            ax.set_xscale("log", base=2)
            ax.grid(True, which="major", alpha=0.3)
        axes[-1].set_xlabel(label)
        out.append(_save(fig, folder / f"sweep-{_safe(op)}-{_safe(mode)}.png"))
    return out


# ------------------------------------------------------------------------------------------------
# parity and compare
# ------------------------------------------------------------------------------------------------


_FRO = re.compile(r"rel Frobenius <= ([0-9.eE+-]+)")
_RTOL = re.compile(r"rtol ([0-9.eE+-]+)")


def tolerance_of(message: str) -> float | None:
    """The scale a check's relative Frobenius error is held to, from its tolerance text: the
    rel Frobenius bound, or rtol for an element-wise check (|d| <= atol + rtol |ref| everywhere
    keeps the relative Frobenius error near rtol or below)."""
    for pattern in (_FRO, _RTOL):
        match = pattern.search(str(message))
        if match:
            return float(match.group(1))
    return None


def parity_figure(op: str, checks: pd.DataFrame, fro: pd.DataFrame):
    """The worst relative Frobenius error of each check on decade-aligned log axes, its
    tolerance marked beside it, pass and fail coloured."""
    worst = fro.loc[fro.groupby(KEYS, sort=False)["value"].idxmax()].set_index(KEYS)
    checks = checks.set_index(KEYS)
    checks = checks[checks.index.isin(worst.index)]
    values = worst["value"].reindex(checks.index).astype(float)
    tolerances = [tolerance_of(m) for m in worst["message"].reindex(checks.index)]
    lo, hi = decade_limits([*values, *(t for t in tolerances if t)], room=1)
    if (values <= 0).any():
        lo /= 10  # bitwise-equal checks: no bar, "0" at the floor
    labels = [" | ".join(map(str, k[1:])) for k in checks.index]
    fig = _figure(9, 1.6 + 0.28 * len(checks))
    ax = fig.subplots()
    ax.set_xscale("log")
    y = list(range(len(checks)))
    ax.barh(y, [max(v, lo) - lo for v in values], left=lo,
            color=[_STATUS_COLOURS.get(s, "0.5") for s in checks["status"]])
    marked = [(t, yi) for t, yi in zip(tolerances, y) if t]
    if marked:
        ax.scatter([t for t, _ in marked], [yi for _, yi in marked], marker="|", s=160, color="0.1", zorder=3,
                   label="tolerance: the rel Frobenius bound, or rtol of an element-wise check")
        fig.legend(fontsize=8, loc="outside lower center")
    for yi, v, status in zip(y, values, checks["status"]):
        ax.annotate(f"{v:.2g} {status}" if v > 0 else f"0 {status}", (max(v, lo), yi), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    _decade_axis(ax.xaxis, (lo, hi))
    ax.set_xlabel("worst relative Frobenius error over tensors and steps")
    ax.set_title(f"{op}: parity against the reference")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    return fig


def plot_parity(rows: pd.DataFrame, folder: Path) -> list[Path]:
    """parity-<op>.png, see :func:`parity_figure`."""
    checks = rows[rows["metric"] == "parity"]
    fro = rows[rows["metric"] == "parity_rel_fro"].dropna(subset=["value"])
    if checks.empty or fro.empty:
        return []
    out = []
    for op, part in checks.groupby("op", sort=False):
        if part.set_index(KEYS).index.isin(fro.set_index(KEYS).index).any():
            out.append(_save(parity_figure(op, part, fro[fro["op"] == op]), folder / f"parity-{_safe(op)}.png"))
    return out


def compare_figure(table: pd.DataFrame):
    """New / base median per row on a linear axis from 0, coloured by verdict, with each row's threshold."""
    table = table.dropna(subset=["ratio"]).reset_index(drop=True)
    labels = [" | ".join(str(r[k]) for k in KEYS) for _, r in table.iterrows()]
    fig = _figure(9, 1.4 + 0.28 * max(len(table), 1))
    ax = fig.subplots()
    y = range(len(table))
    ax.barh(y, table["ratio"], color=[_VERDICT_COLOURS.get(v, "0.5") for v in table["verdict"]])
    if {"low", "high"} <= set(table.columns) and table["low"].notna().any():
        low, high = table["low"].astype(float), table["high"].astype(float)
        ax.errorbar(table["ratio"], y, xerr=[(table["ratio"] - low).fillna(0), (high - table["ratio"]).fillna(0)],
                    fmt="none", ecolor="0.1", elinewidth=1, capsize=2, label="interval of the ratio")
    if "threshold" in table:
        ax.scatter(1 + table["threshold"], y, marker="|", color="0.1", s=60, label="1 + threshold")
        fig.legend(fontsize=8, loc="outside lower center")
    ax.axvline(1.0, color="0.2", lw=1)
    for yi, v, verdict in zip(y, table["ratio"], table["verdict"]):
        ax.annotate(f"{v:.3g} {verdict}", (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlim(0, 1.3 * max(1.0, float(table["ratio"].max()) if len(table) else 1.0))
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("new median / base median (above 1: slower)")
    ax.set_title("compare: after / before")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def plot_compare(table: pd.DataFrame, folder: Path) -> Path:
    """compare.png, see :func:`compare_figure`."""
    return _save(compare_figure(table), Path(folder) / "compare.png")


def plot_samples(samples: pd.DataFrame, folder: Path) -> list[Path]:
    """samples-<op>.png: per row, its per-rep times over the row's median (a box of the reps,
    a dot per round's median): how noisy each row is, and whether its rounds agree."""
    timed = samples[samples["metric"] == "time_median_ms"]
    out = []
    for op, part in timed.groupby("op", sort=False):
        groups = list(part.groupby(KEYS[1:], sort=False))
        fig = _figure(9, 1.4 + 0.3 * len(groups))
        ax = fig.subplots()
        relative, labels = [], []
        for i, (key, rows) in enumerate(groups):
            median = rows["ms"].median()
            relative.append((rows["ms"] / median).to_numpy())
            labels.append(" | ".join(map(str, key)) + f" ({median:.3g} ms)")
            rounds = rows.groupby("round")["ms"].median() / median
            ax.scatter(rounds, [i + 1] * len(rounds), color="#c62828", s=12, zorder=3,
                       label="round median" if i == 0 else None)
        try:
            ax.boxplot(relative, orientation="horizontal", whis=(5, 95), showfliers=False, widths=0.6)
        except TypeError:  # matplotlib before 3.10 names it vert=False
            ax.boxplot(relative, vert=False, whis=(5, 95), showfliers=False, widths=0.6)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="0.2", lw=0.8)
        ax.set_xlabel("per-rep time / the row's median (box: quartiles, whiskers: 5th-95th percentile)")
        ax.set_title(f"{op}: spread of per-rep times")
        ax.legend(fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        out.append(_save(fig, folder / f"samples-{_safe(op)}.png"))
    return out


# ------------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------------


PLOTTED_FILES = ("results.csv", "losses.csv", "compare.csv")


def check_plottable(folder: Path) -> None:
    """ReportError unless ``folder`` holds a file plots are drawn from."""
    from .writer import ReportError

    if not folder.is_dir() or not any((folder / f).is_file() for f in PLOTTED_FILES):
        raise ReportError(f"{folder}: not a report folder (accepted: a folder holding {', '.join(PLOTTED_FILES[:-1])} "
                          f"or {PLOTTED_FILES[-1]})")


def write_plots(folder: Path, rows: pd.DataFrame | None = None, *, samples: bool = False) -> list[Path]:
    """Every plot the folder's files support (see the module docstring); the paths written.
    A file that cannot be read raises ReportError naming it. ``samples``: also the spread of
    per-rep times (left out of reports as they are written, to keep a CI report small)."""
    from ..harness.rows import ROW_FIELDS
    from .writer import read_csv

    folder = Path(folder)
    out: list[Path] = []
    if samples and (folder / "samples.csv.gz").is_file():
        from .samples import load_samples

        kept = load_samples(folder)
        if kept is not None and not kept.empty:
            out += plot_samples(kept, folder)
    if (folder / "losses.csv").is_file():
        losses = read_csv(folder / "losses.csv", ["step", "candidate", "seed", "loss"], what="losses")
        out += [p for p in [plot_losses(folder, losses)] if p is not None]
    if (folder / "compare.csv").is_file():
        table = read_csv(folder / "compare.csv", [*KEYS, "ratio", "verdict"], what="compare")
        if not table.empty:
            out.append(plot_compare(table, folder))
    if rows is None and (folder / "results.csv").is_file():
        rows = read_csv(folder / "results.csv", [c for c in ROW_FIELDS if c != "tensor"], what="results")
    if rows is not None and not rows.empty:
        rows = rows.assign(value=pd.to_numeric(rows["value"], errors="coerce"))
        out += plot_ratios(rows, folder)
        out += plot_sweeps(rows, folder)
        out += plot_parity(rows, folder)
    return out


PLOTS_HEADING = "## Plots"


def plots_section(paths: list[Path]) -> str:
    """summary.md's section linking the plots (empty without plots)."""
    if not paths:
        return ""
    links = "\n\n".join(f"![{p.stem}]({p.name})" for p in paths)
    return f"\n{PLOTS_HEADING}\n\n{links}\n"


def plots_markdown(folder: Path, rows: pd.DataFrame) -> str:
    """The report writer's hook: writes the plots when matplotlib is installed and returns the
    summary.md section linking them (or saying how to get them)."""
    if not matplotlib_available():
        return (f"\n{PLOTS_HEADING}\n\nmatplotlib is not installed: `{INSTALL_HINT}`, then "
                f"`kernelbench plot {folder}` draws this report's plots.\n")
    try:
        paths = write_plots(folder, rows)
    except Exception as exc:  # a plot must never cost the report its summary
        return f"\n{PLOTS_HEADING}\n\nplotting failed: {type(exc).__name__}: {exc}\n"
    return plots_section(paths)


def update_summary(folder: Path, paths: list[Path]) -> bool:
    """Puts the section linking ``paths`` in the folder's summary.md in place of its own (one
    that says how to get the plots, or links older ones); True when summary.md changed."""
    summary = Path(folder) / "summary.md"
    if not summary.is_file() or not paths:
        return False
    text = summary.read_text()
    start = text.find(f"\n{PLOTS_HEADING}\n")
    if start >= 0:
        end = text.find("\n## ", start + len(PLOTS_HEADING) + 2)
        text = text[:start] + (text[end:] if end >= 0 else "")
    summary.write_text(text.rstrip("\n") + "\n" + plots_section(paths))
    return True


def _read_json(path: Path) -> dict:
    """A report's JSON file ({} when there is none); ReportError when it is unreadable."""
    from .writer import ReportError

    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: expected a JSON object, found a {type(doc).__name__}")
    return doc
