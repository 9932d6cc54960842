"""kernelbench's command line: parse, call the harness, print, exit with a documented code."""

from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .ops import get_op, load_all
from .ops.base import UsageError


class Exit(IntEnum):
    OK = 0
    PARITY_FAILED = 1
    USAGE = 2
    REGRESSION = 3
    NOTHING_RAN = 4


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a parity check failed; 2 usage or config error; "
    "3 regression found by compare; 4 no requested candidate could run."
)

app = typer.Typer(
    help="Benchmark and check GPU kernel candidates against PyTorch and official packages.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _fail(message: str, code: Exit = Exit.USAGE) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(int(code))


@contextmanager
def _usage_errors() -> Iterator[None]:
    try:
        yield
    except UsageError as exc:
        raise _fail(str(exc)) from None


# Options shared by run and parity.
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, or auto (cuda when visible).")]
CandidateOpt = Annotated[Optional[list[str]], typer.Option("--candidate", "-c", help="Only these candidates (repeatable).")]
WorkloadOpt = Annotated[Optional[list[str]], typer.Option("--workload", "-w", help="Only these workloads (repeatable); default: the device's tier.")]
ModeOpt = Annotated[Optional[list[str]], typer.Option("--mode", "-m", help="Only these modes, e.g. fwd, fwd+bwd (repeatable).")]
StateOpt = Annotated[Optional[str], typer.Option("--state", help="Optimizer state dtype for ops that offer it (adam-mini: fp32, bf16, fp8).")]
OutputOpt = Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Report folder (default results/<UTC time>-<verb>-<op>/).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Added to every workload's seed.")]


# ------------------------------------------------------------------------------------------------
@app.command("list")
def list_cmd(device: DeviceOpt = "auto",
             workloads: Annotated[bool, typer.Option("--workloads", help="Also list each op's workloads.")] = False) -> None:
    """Every op and candidate, and whether it can run on this machine (and if not, why)."""
    from .harness.runner import resolve_device

    with _usage_errors():
        dev = resolve_device(device)
    table = Table(title=f"kernelbench candidates (device: {dev})", header_style="bold")
    for col in ("op", "candidate", "tags", "role", "runs here", "what"):
        table.add_column(col, overflow="fold")
    for op in load_all().values():
        for cand in op.candidates.values():
            unmet = cand.requires.unmet(dev)
            if unmet:
                runs = f"[dim]no: {unmet}[/]"
            elif cand.requires.interpreted(dev):
                runs = "[yellow]interpreter: parity only[/]"
            else:
                runs = "[green]yes[/]"
            role = ", ".join(r for r, on in (("reference", cand.name == op.reference),
                                              ("anchor", cand.name == op.speed_anchor),
                                              ("baseline", cand.baseline)) if on)
            tags = ", ".join(f"{k}={v}" for k, v in cand.tags.items())
            table.add_row(op.name, cand.name, tags, role, runs, cand.doc)
    # dist-adamw runs several processes, so it is no registry op; listed here all the same.
    gpus = _gpu_count()
    dist_runs = ("[green]yes[/]" if gpus >= 2 else
                 "[yellow]CPU ranks on Gloo: a run-through, not a measurement[/]" if gpus == 0 else
                 f"[dim]no: needs 2 GPUs, {gpus} visible[/]")
    table.add_row(DIST_OP, "sharded-zero1, allreduce+torch-fused", "", "", dist_runs,
                  "ShardedAdamW vs all-reduce + fused AdamW: kernelbench run dist-adamw --nproc N")
    console.print(table)
    from .ops import LOAD_ERRORS

    for module, error in LOAD_ERRORS.items():
        err_console.print(f"[bold red]op module kernelbench.ops.{module} failed to import:[/] {error}")
    if workloads:
        wt = Table(title="workloads", header_style="bold")
        for col in ("op", "workload", "tier", "modes", "seed"):
            wt.add_column(col)
        for op in load_all().values():
            for w in op.workloads.values():
                wt.add_row(op.name, w.name, w.tier, ", ".join(op.modes()), str(w.seed))
        console.print(wt)


# ------------------------------------------------------------------------------------------------
def _plan(entries, device: str, seed: int):
    """PlanItems for config / CLI entries: names resolved, the device's tier by default."""
    from .harness.runner import PlanItem

    plan = []
    for e in entries:
        op = get_op(e.op)
        candidates = [c for c in op.select(e.candidates, e.tags) if c.name not in e.exclude]
        tier = "gpu" if device == "cuda" else "cpu"
        workloads = [op.workload(w) for w in e.workloads] if e.workloads else op.workloads_for(tier)
        if seed:
            workloads = [dataclasses.replace(w, seed=w.seed + seed) for w in workloads]
        modes = e.modes or list(op.modes())
        for mode in modes:
            if mode not in op.modes():
                raise UsageError(f"op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")
        if not workloads:
            raise UsageError(f"op '{op.name}' has no {tier} workload; pass --workload (its workloads: "
                             f"{', '.join(op.workloads)})")
        plan.append(PlanItem(op, candidates, workloads, modes))
    return plan


@contextmanager
def _progress() -> Iterator:
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda text: progress.update(task, description=text)


def _execute(verb: str, label: str, bench_entries, parity_entries, settings: dict, device: str,
             output_dir: Optional[Path], seed: int, telemetry: bool = False) -> None:
    """Runs a plan into a report folder, prints the tables and exits with the right code."""
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device, run_benchmarks, run_parity
    from .harness.timing import TimingConfig
    from .report.console import render
    from .report.tables import bench_table, parity_table
    from .report.writer import ReportWriter, default_output_dir

    with _usage_errors():
        dev = resolve_device(settings.get("device", device) if device == "auto" else device)
        bench_plan = _plan(bench_entries, dev, seed)
        parity_plans = [(e, _plan([e], dev, seed)) for e in parity_entries]
    if dev == "cpu":
        console.print("[yellow]No CUDA device: running on the CPU. CPU candidates are timed with "
                      "perf_counter; Triton kernels run in the Triton interpreter for parity only "
                      "(their time is not measured).[/]")
    timing = TimingConfig(
        warmup_ms=float(settings.get("warmup_ms", 25.0)), rep_ms=float(settings.get("rep_ms", 100.0)),
        cuda_graph=bool(settings.get("cuda_graph", False)), flush_l2=bool(settings.get("flush_l2", True)),
    )
    folder = output_dir or default_output_dir(verb, label)
    writer = ReportWriter(folder, fingerprint(dev, seed), verb)
    outcome = "interrupted"
    summaries = []
    try:
        with _progress() as on_progress:
            if dev == "cuda" and bench_plan:
                from .harness.ceilings import measure_ceilings
                import torch

                on_progress("measuring the device's copy bandwidth and bf16 matmul rate")
                writer.set_ceilings(measure_ceilings(torch.cuda.current_device()).as_dict())
            if bench_plan:
                summaries.append(run_benchmarks(bench_plan, dev, writer, timing=timing,
                                                rounds=int(settings.get("rounds", 3)), telemetry=telemetry,
                                                on_progress=on_progress))
            for entry, plan in parity_plans:
                with _usage_errors():
                    summaries.append(run_parity(plan, dev, writer, steps=entry.steps, atol=entry.atol,
                                                rtol=entry.rtol, on_progress=on_progress))
        outcome = "complete"
    finally:
        writer.close(outcome)
    frame = writer.frame()
    render(console, f"{verb}: speed", bench_table(frame))
    render(console, f"{verb}: parity", parity_table(frame))
    console.print(f"Report: {folder}")
    failures = [f for s in summaries for f in s.failures]
    measured = sum(s.measured for s in summaries) + sum(s.parity_checks for s in summaries)
    not_measured = sum(1 for r in writer.rows if r["status"] == "not-measured")
    if failures:
        raise _fail("parity failed: " + ", ".join(failures), Exit.PARITY_FAILED)
    if measured == 0 and not_measured == 0:
        raise _fail("no requested candidate could run here (see the skipped rows' reasons)", Exit.NOTHING_RAN)


@app.command()
def run(
    op: Annotated[Optional[str], typer.Argument(help="Op to benchmark; omit it to run the default suite.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML suite (configs/*.toml).")] = None,
    candidate: CandidateOpt = None,
    workload: WorkloadOpt = None,
    mode: ModeOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="Time replays of a CUDA graph (L2 flush captured and subtracted).")] = False,
    warmup_ms: Annotated[float, typer.Option(help="Warm-up time per candidate and round.")] = 25.0,
    rep_ms: Annotated[float, typer.Option(help="Timed time per candidate, over all rounds.")] = 100.0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (A B A B ...) per workload.")] = 3,
    no_flush_l2: Annotated[bool, typer.Option("--no-flush-l2", help="Keep L2 warm between reps (the report says so).")] = False,
    parity_steps: Annotated[int, typer.Option(help="With an op: also check parity over this many steps (0: no).")] = 0,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="Also record optimizer telemetry (adam-mini: max |update|, max |m|, fp8 scales) after the timed steps.")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="dist-adamw only: ranks (GPUs) to start through torch.distributed.run.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="dist-adamw only: timed steps per rank.")] = 50,
    bucket_mb: Annotated[Optional[float], typer.Option("--bucket-mb", help="dist-adamw only: ShardedAdamW bucket size in MiB (default: ShardedAdamW's, 256 with a gather group, 1024 without).")] = None,
    gather_group: Annotated[bool, typer.Option("--gather-group/--no-gather-group", help="dist-adamw only: ShardedAdamW all-gathers on a second communicator, beside the reduce-scatters.")] = True,
    seed: SeedOpt = 0,
) -> None:
    """Benchmark an op's candidates (or a suite) and write a report folder.

    `dist-adamw` is multi-process: `kernelbench run dist-adamw --nproc 2` starts the ranks through
    torch.distributed.run and compares ShardedAdamW with all-reduce + torch fused AdamW."""
    from .config import Entry, configs_dir, load_suite
    from .harness.runner import resolve_device

    settings: dict = {}
    if op is not None and config is not None:
        raise _fail("give an op or --config, not both")
    if op == DIST_OP:
        _run_distributed(nproc, (workload or ["model-370m"]), steps, bucket_mb, gather_group, output_dir, seed)
        return
    with _usage_errors():
        if op is None:
            if config is None:
                on_gpu = resolve_device(device) == "cuda"
                config = configs_dir() / ("ci.toml" if on_gpu else "quick.toml")
                console.print(f"No op given: running the default suite {config}"
                              + ("" if on_gpu else " (the CPU suite: no CUDA device)"))
            suite = load_suite(config)
            settings = dict(suite.settings)
            bench, parity, label = suite.bench, suite.parity, config.stem
        else:
            tags = {"state": state} if state else {}
            get_op(op).select(candidate, tags)  # validates names and tags before anything runs
            bench = [Entry(op, workload, candidate, mode, tags)]
            parity = [Entry(op, workload, candidate, mode, tags, steps=parity_steps)] if parity_steps else []
            label = op
    settings.update({k: v for k, v in (("cuda_graph", cuda_graph or None), ("rounds", rounds if rounds != 3 else None),
                                         ("warmup_ms", warmup_ms if warmup_ms != 25.0 else None),
                                         ("rep_ms", rep_ms if rep_ms != 100.0 else None),
                                         ("flush_l2", False if no_flush_l2 else None)) if v is not None})
    _execute("run", label, bench, parity, settings, device, output_dir, seed, telemetry)


DIST_OP = "dist-adamw"


def _run_distributed(nproc: int, workloads: list[str], steps: int, bucket_mb: Optional[float], gather_group: bool,
                     output_dir: Optional[Path], seed: int) -> None:
    """dist-adamw: one torch.distributed.run launch per workload; its JSON becomes report rows."""
    from .dist.launch import launch, result_rows
    from .harness.envinfo import fingerprint
    from .report.console import render
    from .report.tables import bench_table
    from .report.writer import ReportWriter, default_output_dir

    folder = output_dir or default_output_dir("run", DIST_OP)
    dev = "cuda" if _cuda_visible() else "cpu"
    writer = ReportWriter(folder, fingerprint(dev, seed), "run")
    outcome = "interrupted"
    try:
        for name in workloads:
            with _usage_errors(), _progress() as on_progress:
                on_progress(f"{DIST_OP} {name} on {nproc} ranks (torch.distributed.run)")
                try:
                    result = launch(nproc, name, steps, folder / f"{DIST_OP}-{name}.json", bucket_mb=bucket_mb,
                                    gather_group=gather_group)
                except RuntimeError as exc:
                    writer.add({"op": DIST_OP, "workload": name, "mode": f"{nproc} ranks", "candidate": "sharded-zero1",
                                "metric": "time_median_ms", "value": None, "unit": "ms", "status": "error",
                                "flags": "", "tensor": "", "message": str(exc)[-2000:]})
                    continue
            for row in result_rows(result):
                writer.add(row)
        outcome = "complete"
    finally:
        writer.close(outcome)
    render(console, f"run: {DIST_OP}", bench_table(writer.frame()))
    console.print(f"Report: {folder}")
    if not any(r["status"] in ("ok", "not-measured") for r in writer.rows):
        raise _fail(f"{DIST_OP}: no run completed (see the error rows)", Exit.NOTHING_RAN)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@app.command()
def autoselect(
    op: Annotated[str, typer.Argument(help="rmsnorm or rotary.")],
    shape: Annotated[str, typer.Option("--shape", help="rmsnorm: the input shape, e.g. 16x2048x4096; rotary: BxHqxHkxSxDxROTARY_DIM.")],
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    mode: Annotated[str, typer.Option("--mode", help="fwd or fwd+bwd.")] = "fwd+bwd",
    variant: Annotated[str, typer.Option("--variant", help="rotary: <style>-<layout>, e.g. half-bhsd.")] = "",
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again and overwrite the cached choice.")] = False,
) -> None:
    """Show (measuring once, then from the on-disk cache) which implementation auto picks for a shape."""
    import torch

    from .nn.autoselect import autoselect_report

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise _fail(f"--dtype {dtype}: accepted: {', '.join(dtypes)}")
    try:
        dims = tuple(int(d) for d in shape.lower().split("x"))
    except ValueError:
        raise _fail(f"--shape {shape}: expected integers separated by x, e.g. 16x2048x4096") from None
    try:
        report = autoselect_report(op, dims, dtypes[dtype], mode=mode, variant=variant, refresh=refresh)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"autoselect {op} {shape} {dtype} {mode}", header_style="bold")
    table.add_column("implementation")
    table.add_column("median ms", justify="right")
    for impl, ms in report["times_ms"].items():
        mark = " (chosen)" if impl == report["choice"] else ""
        table.add_row(impl + mark, "not measured" if ms is None else f"{ms:.4f}")
    console.print(table)
    console.print(f"choice: [bold]{report['choice']}[/] ({report['reason']}); source: {report['source']}; "
                  f"cache: {report['cache_file']}")


@app.command()
def parity(
    op: Annotated[str, typer.Argument(help="Op to check.")],
    steps: Annotated[int, typer.Option(help="Steps (optimizers) or fresh input draws (functions).")] = 10,
    atol: Annotated[Optional[float], typer.Option(help="Override the op's absolute tolerance.")] = None,
    rtol: Annotated[Optional[float], typer.Option(help="Override the op's relative tolerance.")] = None,
    candidate: CandidateOpt = None,
    workload: WorkloadOpt = None,
    mode: ModeOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Check every runnable candidate against the op's reference from identical seeded inputs."""
    from .config import Entry

    tags = {"state": state} if state else {}
    with _usage_errors():
        get_op(op).select(candidate, tags)
    entry = Entry(op, workload, candidate, mode, tags, steps=steps, atol=atol, rtol=rtol)
    _execute("parity", op, [], [entry], {}, device, output_dir, seed)


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="Report folder of the baseline run.")],
    new: Annotated[Path, typer.Argument(help="Report folder of the new run.")],
    threshold: Annotated[float, typer.Option(help="Smallest slowdown called a regression (0.05 = 5%); a row's own noise raises it.")] = 0.05,
    force: Annotated[bool, typer.Option("--force", help="Compare runs from different GPUs or torch/triton versions anyway.")] = False,
    output_dir: OutputOpt = None,
) -> None:
    """Ratio of medians per matching row of two report folders; exit 3 on a regression."""
    from .report.compare import compare_reports
    from .report.console import render
    from .report.tables import to_markdown

    with _usage_errors():
        result = compare_reports(base, new, min_threshold=threshold, force=force)
    if result.mismatches:
        console.print("[yellow]--force: comparing across environments: " + "; ".join(result.mismatches) + "[/]")
    render(console, f"compare {base} -> {new}", result.table)
    for title, names in (("only in BASE", result.only_base), ("only in NEW", result.only_new)):
        if names:
            console.print(f"{title}: " + ", ".join(names))
    if output_dir:
        output_dir.mkdir(parents=True, exist_ok=True)
        result.table.to_csv(output_dir / "compare.csv", index=False)
        (output_dir / "compare.md").write_text(f"# compare {base} -> {new}\n\n" + to_markdown(result.table))
    if not result.regressions.empty:
        raise _fail(f"{len(result.regressions)} regression(s)", Exit.REGRESSION)
    if result.table.empty:
        console.print("[yellow]no rows in common between the two reports[/]")


@app.command()
def env(
    device: DeviceOpt = "auto",
    ceilings: Annotated[bool, typer.Option("--ceilings", help="Also measure copy bandwidth and bf16 matmul rate (CUDA).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The environment fingerprint that every report records."""
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device

    with _usage_errors():
        dev = resolve_device(device)
    info = fingerprint(dev, seed=0)
    if ceilings:
        if dev != "cuda":
            raise _fail("--ceilings needs CUDA")
        import torch

        from .harness.ceilings import measure_ceilings

        info["ceilings"] = measure_ceilings(torch.cuda.current_device()).as_dict()
    if as_json:
        print(json.dumps(info, indent=1, default=str))
        return
    table = Table(title="kernelbench env", show_header=False)
    for key, value in info.items():
        table.add_row(key, str(value))
    console.print(table)


@app.command("train")
def train_cmd(
    op: Annotated[str, typer.Argument(help="An optimizer op (adamw, adam-mini, adafactor, muon) or a layer op (rmsnorm, rotary).")],
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps per run (default: 500 on CUDA, 20 on the CPU).")] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", help="Sequences per step (default: 32 on CUDA, 4 on the CPU).")] = None,
    seq: Annotated[Optional[int], typer.Option("--seq", help="Tokens per sequence (default: 256 on CUDA, 32 on the CPU).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the initial weights and of the token stream.")] = 0,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate for every candidate (default: the op's).")] = None,
    rtol: Annotated[float, typer.Option("--rtol", help="The band is widened by rtol x the reference's final loss on each side.")] = 0.01,
    ref_seeds: Annotated[int, typer.Option("--ref-seeds", help="Data orders the reference is trained with; their spread is the band.")] = 3,
    model: Annotated[Optional[str], typer.Option("--model", help="A kernelbench.models config (default: llama-15m on CUDA, llama-tiny on the CPU).")] = None,
    candidate: CandidateOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
) -> None:
    """Train a small Llama-style model with every candidate of OP (same weights, same batches) and
    judge each final loss against the band of the reference's seed-to-seed spread; exit 1 when one fails."""
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device
    from .report.console import render
    from .report.writer import ReportWriter, default_output_dir
    from .train import TrainSettings, resolve
    from .train import train as run_training
    from .train.run import result_table

    with _usage_errors():
        dev = resolve_device(device)
        settings = TrainSettings.defaults(dev, model=model, steps=steps, batch=batch, seq=seq, seed=seed, lr=lr,
                                          rtol=rtol, ref_seeds=ref_seeds)
        config = settings.validate()
        candidates = resolve(op, config, lr=lr, names=candidate, tags={"state": state} if state else {})
    folder = output_dir or default_output_dir("train", op)
    writer = ReportWriter(folder, fingerprint(dev, seed), "train")
    outcome = "interrupted"
    try:
        with _progress() as on_progress:
            result = run_training(op, candidates, settings, writer, folder, on_progress=on_progress)
        outcome = "complete"
    finally:
        writer.close(outcome)
    console.print(f"data: {result.stats.describe()}")
    band = result.band
    if band is not None:
        console.print(f"band: reference final loss {band.mean:.4f} +- {band.half_width:.4f} (data orders "
                      + ", ".join(f"{f:.4f}" for f in band.seed_finals) + f"; widened by rtol {settings.rtol:g})")
    render(console, f"train {op}: {settings.model}, {settings.steps} steps", result_table(result))
    console.print(f"Report: {folder} ({result.wall_s:.0f} s, the reference's data orders included)")
    if result.band is None and not result.failures:
        raise _fail("the reference could not run here, so nothing was judged (see its row)", Exit.NOTHING_RAN)
    if result.failures:
        raise _fail("did not train like the reference: " + ", ".join(result.failures), Exit.PARITY_FAILED)


@app.command("plot")
def plot_cmd(
    report_dirs: Annotated[list[Path], typer.Argument(help="Report folders (run, parity, train, or compare --output-dir).")],
) -> None:
    """Write PNG plots beside each report: sweeps, ratios to the anchor, parity, loss curves, compare."""
    from .report.plot import INSTALL_HINT, matplotlib_available, write_plots

    if not matplotlib_available():
        raise _fail(f"plot needs matplotlib: {INSTALL_HINT}")
    for folder in report_dirs:
        if not folder.is_dir() or not any((folder / f).is_file() for f in ("results.csv", "compare.csv", "losses.csv")):
            raise _fail(f"{folder}: not a report folder (accepted: a folder holding results.csv, losses.csv "
                        "or compare.csv)")
    for folder in report_dirs:
        paths = write_plots(folder)
        if not paths:
            console.print(f"{folder}: nothing to plot (no speed ratio, sweep, parity, loss or compare rows)")
        for path in paths:
            console.print(f"wrote {path}")


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
