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
- ``compare.csv`` (``compare -o``): ``compare.png``, new / base per row coloured by verdict.

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
_VERDICT_COLOURS = {"faster": "#2e7d32", "same": "#757575", "regression": "#c62828"}


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


def _plain_log_ticks(axis, minor: bool = True) -> None:
    """Log-scale ticks as plain numbers (4, 3, 2.5) rather than 4x10^0; minor ones labelled
    only where the axis spans less than a decade."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis.set_major_formatter(ScalarFormatter())
    if minor:
        axis.set_minor_formatter(ScalarFormatter())
        axis.set_minor_locator(LogLocator(subs=(0.2, 0.4, 0.6, 0.8)))
    else:
        axis.set_minor_formatter(NullFormatter())


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


def plot_losses(folder: Path) -> Path:
    """losses.png from a train report's losses.csv and train.json."""
    from ..train.band import running_loss, step_band, tail_window
    from ..train.run import LOSSES_CSV, TRAIN_JSON

    folder = Path(folder)
    losses = pd.read_csv(folder / LOSSES_CSV)
    meta = json.loads((folder / TRAIN_JSON).read_text()) if (folder / TRAIN_JSON).is_file() else {}
    settings = meta.get("settings", {})
    steps = int(losses["step"].max()) + 1 if not losses.empty else 0
    window = int(meta.get("window") or tail_window(max(steps, 1)))
    rtol = float(settings.get("rtol", 0.01))
    roles = {c["name"]: c for c in meta.get("candidates", [])}
    reference = next((n for n, c in roles.items() if c["role"] == "reference"), None)
    if reference is None and not losses.empty:
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
    top.set_yscale("log")
    _plain_log_ticks(top.yaxis)
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


def plot_ratios(rows: pd.DataFrame, folder: Path) -> list[Path]:
    """ratios-<op>.png: each candidate's ratio to its op's anchor, per workload and mode."""
    ratios = rows[(rows["metric"] == "ratio_vs_anchor") & (rows["status"] == "ok")].dropna(subset=["value"])
    out = []
    for op, part in ratios.groupby("op", sort=False):
        part = part.sort_values(["workload", "mode", "candidate"], kind="stable")
        labels = [f"{w} | {m} | {c}" for w, m, c in zip(part["workload"], part["mode"], part["candidate"])]
        colours = _colours(list(dict.fromkeys(part["candidate"])))
        fig = _figure(9, 1.2 + 0.28 * len(part))
        ax = fig.subplots()
        y = range(len(part))
        ax.barh(y, part["value"], color=[colours[c] for c in part["candidate"]])
        ax.set_yticks(list(y), labels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="0.2", lw=1)
        for yi, v in zip(y, part["value"]):
            ax.annotate(f"{v:.3g}", (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_xlabel("median / median of the anchor in the same run (below 1: faster)")
        ax.set_title(f"{op}: ratio to its anchor")
        ax.grid(True, axis="x", alpha=0.3)
        out.append(_save(fig, folder / f"ratios-{_safe(op)}.png"))
    return out


def _workload_size(op_name: str, workload: str):
    """(x, what) for a workload from the op registry: its shape, or its total elements."""
    try:
        from ..ops import get_op

        spec = get_op(op_name).workloads[workload].spec
    except Exception:  # an op or workload this version does not know
        return None
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
    if len(numels) == 1 and all(len(s[0]) >= 2 for s in sizes.values()):
        xs = {w: s[0][-1] for w, s in sizes.items()}
        label = f"N, the last dimension (M x N = {next(iter(numels)):,} elements)"
    else:
        xs = {w: s[1] for w, s in sizes.items()}
        label = "elements"
    if len(set(xs.values())) < 3:
        return None
    return xs, label


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
        _plain_log_ticks(axes[0].yaxis, minor=False)
        axes[0].set_ylabel("median ms")
        axes[0].set_title(f"{op} {mode}: sweep")
        axes[0].legend(fontsize=8)
        if bound:
            axes[1].set_ylabel("% of copy bandwidth" if bound == "pct_copy_bw" else "% of bf16 matmul rate")
            axes[1].axhline(100, color="0.3", lw=0.8, ls="--")
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        axes[-1].set_xlabel(label)
        out.append(_save(fig, folder / f"sweep-{_safe(op)}-{_safe(mode)}.png"))
    return out


# ------------------------------------------------------------------------------------------------
# parity and compare
# ------------------------------------------------------------------------------------------------


def plot_parity(rows: pd.DataFrame, folder: Path) -> list[Path]:
    """parity-<op>.png: the worst relative Frobenius error of each check (log scale)."""
    checks = rows[rows["metric"] == "parity"]
    fro = rows[rows["metric"] == "parity_rel_fro"].dropna(subset=["value"])
    if checks.empty or fro.empty:
        return []
    worst = fro.groupby(KEYS, sort=False)["value"].max()
    out = []
    for op, part in checks.groupby("op", sort=False):
        part = part.set_index(KEYS)
        part = part[part.index.isin(worst.index)]
        if part.empty:
            continue
        values = worst.reindex(part.index)
        tiny = 1e-12  # bitwise-equal checks sit on the axis' floor
        labels = [" | ".join(map(str, k[1:])) for k in part.index]
        fig = _figure(9, 1.2 + 0.28 * len(part))
        ax = fig.subplots()
        y = range(len(part))
        ax.barh(y, [max(v, tiny) for v in values], color=[_STATUS_COLOURS.get(s, "0.5") for s in part["status"]])
        for yi, v, s in zip(y, values, part["status"]):
            ax.annotate(f"{v:.2g} {s}", (max(v, tiny), yi), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)
        ax.set_yticks(list(y), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("worst relative Frobenius error over tensors and steps (0 drawn at 1e-12)")
        ax.set_title(f"{op}: parity against the reference")
        ax.grid(True, axis="x", alpha=0.3)
        out.append(_save(fig, folder / f"parity-{_safe(op)}.png"))
    return out


def plot_compare(table: pd.DataFrame, folder: Path) -> Path:
    """compare.png: new / base median per row, coloured by verdict, with each row's threshold."""
    table = table.dropna(subset=["ratio"]).reset_index(drop=True)
    labels = [" | ".join(str(r[k]) for k in KEYS) for _, r in table.iterrows()]
    fig = _figure(9, 1.2 + 0.28 * max(len(table), 1))
    ax = fig.subplots()
    y = range(len(table))
    ax.barh(y, table["ratio"], color=[_VERDICT_COLOURS.get(v, "0.5") for v in table["verdict"]])
    if "threshold" in table:
        ax.scatter(1 + table["threshold"], y, marker="|", color="0.1", s=60, label="1 + threshold")
        ax.legend(fontsize=8)
    ax.axvline(1.0, color="0.2", lw=1)
    for yi, v, verdict in zip(y, table["ratio"], table["verdict"]):
        ax.annotate(f"{v:.3g} {verdict}", (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("new median / base median (above 1: slower)")
    ax.set_title("compare: after / before")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, Path(folder) / "compare.png")


# ------------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------------


def write_plots(folder: Path, rows: pd.DataFrame | None = None) -> list[Path]:
    """Every plot the folder's files support (see the module docstring); the paths written."""
    folder = Path(folder)
    out: list[Path] = []
    if (folder / "losses.csv").is_file():
        out.append(plot_losses(folder))
    if (folder / "compare.csv").is_file():
        out.append(plot_compare(pd.read_csv(folder / "compare.csv"), folder))
    if rows is None and (folder / "results.csv").is_file():
        rows = pd.read_csv(folder / "results.csv")
    if rows is not None and not rows.empty:
        rows = rows.assign(value=pd.to_numeric(rows["value"], errors="coerce"))
        out += plot_ratios(rows, folder)
        out += plot_sweeps(rows, folder)
        out += plot_parity(rows, folder)
    return out


def plots_markdown(folder: Path, rows: pd.DataFrame) -> str:
    """The report writer's hook: writes the plots when matplotlib is installed and returns the
    summary.md section linking them (or saying how to get them)."""
    if not matplotlib_available():
        return (f"\n## Plots\n\nmatplotlib is not installed: `{INSTALL_HINT}`, then "
                f"`kernelbench plot {folder}` draws this report's plots.\n")
    try:
        paths = write_plots(folder, rows)
    except Exception as exc:  # a plot must never cost the report its summary
        return f"\n## Plots\n\nplotting failed: {type(exc).__name__}: {exc}\n"
    if not paths:
        return ""
    links = "\n\n".join(f"![{p.stem}]({p.name})" for p in paths)
    return f"\n## Plots\n\n{links}\n"
