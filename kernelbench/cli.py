"""kernelbench's command line: parse, call the session or the reports, print, exit with a documented code.

A command is one function below: it turns its options into a request (kernelbench.session.options
checks them), runs it, prints the outcome and maps its status to an exit code. What commands
share lives at the top: the option types (``DeviceOpt``, ``FormatOpt``...), ``Output`` (tables as
text / Markdown / JSON / CSV, one-line errors, full width without a terminal), ``fail`` and
``usage_errors`` (exit 2 with one line). Nothing here imports torch or pandas at module level:
``--help``, ``list`` and argument errors answer without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Annotated

import typer

from .harness.settings import DEFAULT_TIMING, PARITY_STEPS, USER_SETTINGS, Bound
from .ops import load_builtin
from .ops.base import UsageError
from .report.output import Format, Output
from .session import Listener, Outcome, Session, Status, TrainRequest
from .session.options import (
    OutputSettings,
    RunOptions,
    check_fsdp,
    check_train,
    load_plugins,
    op_option_help,
    parity_request,
    run_request,
)
from .session.signals import interruption_code


class Exit(IntEnum):
    OK = 0
    PARITY_FAILED = 1
    USAGE = 2
    REGRESSION = 3
    NOTHING_RAN = 4


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a parity check failed, or a timed result was not one (train: a candidate left the band); "
    "2 usage or config error; "
    "3 regression found by compare; 4 nothing that was asked for could run here; "
    "130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP (the report is closed and says so)."
)
_EXIT_FOR = {Status.COMPLETE: Exit.OK, Status.NOTHING_MEASURED: Exit.OK, Status.PARITY_FAILED: Exit.PARITY_FAILED,
             Status.NOTHING_RAN: Exit.NOTHING_RAN}

app = typer.Typer(
    help="Benchmark and check GPU kernel candidates against PyTorch and official packages.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click output: usage errors on one line instead of a box drawn across the log.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


def fail(out: Output, message: str, code: Exit | int = Exit.USAGE) -> typer.Exit:
    out.error(message)
    return typer.Exit(int(code))


@contextmanager
def usage_errors(out: Output) -> Iterator[None]:
    try:
        yield
    except UsageError as exc:
        raise fail(out, str(exc)) from None


class Shown(Listener):
    """A session's notes, warnings and errors on the command's Output; its progress on a spinner."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._update = None

    def note(self, text: str, *, important: bool = False) -> None:
        self.out.note(text, "yellow" if important else None)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def error(self, text: str) -> None:
        self.out.error(text)

    def progress(self, text: str) -> None:
        if self._update is not None:
            self._update(text)

    @contextmanager
    def spinner(self) -> Iterator[None]:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=self.out.err, transient=True) as progress:
            task = progress.add_task("starting", total=None)
            self._update = lambda text: progress.update(task, description=text)
            try:
                yield
            finally:
                self._update = None


def finish(out: Output, outcome: Outcome, about: str = "") -> None:
    """The closing lines every run prints: its report, its tally, and why it exits as it does."""
    out.note(f"Report: {outcome.folder}" + (f" ({about})" if about else ""))
    out.note(outcome.tally.line())
    for reason in outcome.reasons:
        out.warn(f"  {reason}")
    if outcome.status is Status.INTERRUPTED:
        raise fail(out, outcome.message, interruption_code(outcome.interruption))
    if outcome.status is Status.NOTHING_MEASURED:
        out.warn(outcome.message)
    elif _EXIT_FOR[outcome.status] is not Exit.OK:
        raise fail(out, outcome.message, _EXIT_FOR[outcome.status])


# ------------------------------------------------------------------------------------------------
# Options shared by several commands.
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, or auto (cuda when visible).")]
CandidateOpt = Annotated[list[str] | None, typer.Option("--candidate", "-c",
                                                       help="Only these candidates (repeatable).")]
WorkloadOpt = Annotated[list[str] | None, typer.Option("--workload", "-w", help="Only these workloads (repeatable); "
                                                                                "default: the device's tier.")]
ModeOpt = Annotated[list[str] | None, typer.Option("--mode", "-m", help="Only these modes, e.g. fwd, fwd+bwd "
                                                                        "(repeatable).")]
StateOpt = Annotated[str | None, typer.Option("--state", help="Optimizer state dtype for ops that offer it "
                                                              "(adam-mini: fp32, bf16, fp8).")]
OutputOpt = Annotated[Path | None, typer.Option("--output-dir", "-o", help="Report folder (default reports/<UTC "
                                                                           "time>-<verb>-<op>/; made if missing).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Added to every workload's seed [default: 0].")]
FsdpOpt = Annotated[bool, typer.Option("--fsdp", help="Optimizer ops: the model's parameters sharded by FSDP2's "
                                                      "fully_shard over --nproc ranks (torch.distributed.run; CPU "
                                                      "ranks on Gloo without GPUs).")]
NprocOpt = Annotated[int | None, typer.Option("--nproc", help="Ranks of --fsdp, >= 1 [default: 2].")]
FormatOpt = Annotated[Format, typer.Option(
    "--format", case_sensitive=False,
    help="table (text), markdown, json (an array of objects, one per row, each naming its table) or csv. "
         "With json / csv, stdout carries only that; notes go to stderr.")]
PluginOpt = Annotated[list[str] | None, typer.Option(
    "--plugin", help="Load ops and candidates from path/to/file.py or a module name (repeatable); installed "
                     "packages' kernelbench.plugins entry points load without it.")]
SweepOpt = Annotated[str | None, typer.Option(
    "--sweep", help="Sweep one dimension of the op (see list --workloads): N=256..65536 (doubling) or "
                    "N=256,1000,4096, around the one -w shape given, else around the op's example shape.")]
ParityDetailOpt = Annotated[str | None, typer.Option(
    "--parity-detail",
    help="worst: per-tensor parity rows only for failing tensors and the 3 worst per measure; full: every tensor "
         "[default: worst].")]


def _timing_help(key: str, what: str) -> str:
    bound = USER_SETTINGS[key].bound
    return f"{what}, {bound.words()} [default: {getattr(DEFAULT_TIMING, key):g}, or the suite's]."


# Help text names kernelbench's own ops: --help loads no plugin.
def _layer_ops() -> str:
    return ", ".join(op.name for op in load_builtin().values() if op.model_layer)


def _optimizer_ops() -> str:
    return ", ".join(op.name for op in load_builtin().values() if op.kind == "optimizer")


# ------------------------------------------------------------------------------------------------
@app.command("list", epilog=EXIT_CODES_HELP)
def list_cmd(device: DeviceOpt = "auto",
             workloads: Annotated[bool, typer.Option("--workloads", help="Also list each op's workloads (tier, modes, "
                                                                         "seed) and how -w may write others (the "
                                                                         "op's dimensions).")] = False,
             fmt: FormatOpt = Format.table,
             plugin: PluginOpt = None) -> None:
    """Every op and candidate, and whether it can run here (and if not, why).

    "runs here" comes from the installed packages and, only where an NVIDIA device node exists
    (/dev/nvidia*) or with --device cuda, a CUDA probe (GPU count, compute capability): on a
    machine without a GPU, list imports neither torch nor CUDA."""
    from .session.catalog import candidate_rows, list_device, workload_form_rows, workload_rows

    out = Output(fmt)
    with usage_errors(out):
        dev = list_device(device)
        load_plugins(plugin, Shown(out))
    out.table(f"kernelbench candidates (device: {dev})", candidate_rows(dev), name="candidates")
    if workloads:
        out.table("workloads", workload_rows(), name="workloads")
        out.table("workloads written on the command line", workload_form_rows(), name="workload_forms")
    out.flush()
    from .ops import LOAD_ERRORS

    for module, error in LOAD_ERRORS.items():
        out.error(f"op module kernelbench.ops.{module} failed to import: {error}")


def _run_and_print(out: Output, request) -> None:
    """Runs a run / parity request and prints its tables and closing lines."""
    from .report.tables import bench_table, parity_table

    shown = Shown(out)
    with usage_errors(out):
        with shown.spinner():
            outcome = Session(shown).run(request)
    frame = _frame(outcome)
    out.table(f"{outcome.verb}: speed", bench_table(frame), name="speed")
    out.table(f"{outcome.verb}: parity", parity_table(frame), name="parity")
    out.flush()
    finish(out, outcome)


def _frame(outcome: Outcome):
    import pandas as pd

    from .harness.rows import ROW_FIELDS

    return pd.DataFrame(outcome.rows, columns=list(ROW_FIELDS))


@app.command(epilog=EXIT_CODES_HELP)
def run(
    op: Annotated[str | None, typer.Argument(help="Op to benchmark; omit it to run the default suite.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML suite (configs/*.toml).")] = None,
    candidate: CandidateOpt = None,
    workload: WorkloadOpt = None,
    mode: ModeOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="Time replays of a CUDA graph (L2 flush captured "
                                                                  "and subtracted).")] = False,
    warmup_ms: Annotated[float | None, typer.Option(
        help=_timing_help("warmup_ms", "Warm-up time per candidate and round, ms"))] = None,
    rep_ms: Annotated[float | None, typer.Option(
        help=_timing_help("rep_ms", "Timed time per candidate over all rounds, ms"))] = None,
    rounds: Annotated[int | None, typer.Option(
        help=_timing_help("rounds", "Interleaved rounds (A B A B ...) per workload"))] = None,
    no_flush_l2: Annotated[bool, typer.Option("--no-flush-l2",
                                              help="Keep L2 warm between reps (the report says so).")] = False,
    parity_steps: Annotated[int | None, typer.Option(help="With an op: also check parity over this many optimizer "
                                                          "steps / input draws (the parity command's --steps) "
                                                          "[default: no parity].")] = None,
    parity_detail: ParityDetailOpt = None,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="With an op whose optimizer reports telemetry "
                                                                "(adam-mini): record max |update|, max |m|, fp8 "
                                                                "scales after the timed steps.")] = False,
    nproc: Annotated[int | None, typer.Option("--nproc", help=op_option_help("--nproc"))] = None,
    steps: Annotated[int | None, typer.Option("--steps", help=op_option_help("--steps"))] = None,
    bucket_mb: Annotated[float | None, typer.Option("--bucket-mb", help=op_option_help("--bucket-mb"))] = None,
    gather_group: Annotated[bool | None, typer.Option("--gather-group/--no-gather-group",
                                                         help=op_option_help("--gather-group"))] = None,
    seed: SeedOpt = None,
    sweep: SweepOpt = None,
    plugin: PluginOpt = None,
) -> None:
    """Benchmark an op's candidates (or a suite) and write a report folder.

    Without an op: the suite given by --config, else configs/ci.toml on a CUDA machine and
    configs/quick.toml without one. Timing options (--rounds, --rep-ms, --warmup-ms, --cuda-graph,
    --no-flush-l2) override the suite's; options that choose what runs (-c, -w, -m, --state,
    --telemetry, --parity-steps, --sweep) need an op. -w also takes a workload written as a shape
    (16384x4096:bf16) or, for optimizer ops, model:NAME or a parameter-list file (list --workloads
    says which op takes what). `dist-adamw` is multi-process:
    `kernelbench run dist-adamw --nproc 2` starts the ranks through torch.distributed.run and compares
    ShardedAdamW with all-reduce + torch fused AdamW; it takes -w, --device, -o, --format and the
    dist-adamw options only."""
    out = Output(fmt)
    launched = {"--nproc": nproc, "--steps": steps, "--bucket-mb": bucket_mb, "--gather-group": gather_group}
    options = RunOptions(
        op=op, config=config, candidates=candidate, workloads=workload, modes=mode, state=state,
        cuda_graph=cuda_graph or None, warmup_ms=warmup_ms, rep_ms=rep_ms, rounds=rounds,
        flush_l2=False if no_flush_l2 else None, parity_steps=parity_steps, telemetry=telemetry or None,
        seed=seed, parity_detail=parity_detail, sweep=sweep, plugins=plugin, device=device, output_dir=output_dir,
        op_options={flag: value for flag, value in launched.items() if value is not None})
    with usage_errors(out):
        request = run_request(options, Shown(out))
    _run_and_print(out, request)


@app.command(epilog=EXIT_CODES_HELP)
def parity(
    op: Annotated[str, typer.Argument(help="Op to check.")],
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps (optimizers) or fresh input draws (functions) "
                                                       "compared, >= 1 (run's --parity-steps).")] = PARITY_STEPS,
    atol: Annotated[float | None, typer.Option(help="Override the op's absolute tolerance (>= 0).")] = None,
    rtol: Annotated[float | None, typer.Option(help="Override the op's relative tolerance (>= 0).")] = None,
    candidate: CandidateOpt = None,
    workload: WorkloadOpt = None,
    mode: ModeOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
    parity_detail: ParityDetailOpt = None,
    seed: SeedOpt = None,
    fsdp: FsdpOpt = False,
    nproc: NprocOpt = None,
    sweep: SweepOpt = None,
    plugin: PluginOpt = None,
) -> None:
    """Check every runnable candidate against the op's reference from identical seeded inputs.

    With --fsdp (optimizer ops): each candidate with its parameters sharded by FSDP2's fully_shard
    over --nproc ranks against itself on the unsharded model, from the same weights and gradients;
    -w names a kernelbench.models config (default: llama-7m on CUDA, llama-tiny on CPU ranks)."""
    out = Output(fmt)
    with usage_errors(out):
        request = parity_request(op, steps=steps, atol=atol, rtol=rtol, candidates=candidate, workloads=workload,
                                 modes=mode, state=state, device=device, output_dir=output_dir,
                                 parity_detail=parity_detail, seed=seed, fsdp=fsdp, nproc=nproc,
                                 sweep=sweep, plugins=plugin, listener=Shown(out))
    _run_and_print(out, request)


@app.command(epilog=EXIT_CODES_HELP)
def compare(
    base: Annotated[Path, typer.Argument(help="Report folder of the baseline run.")],
    new: Annotated[Path, typer.Argument(help="Report folder of the new run.")],
    threshold: Annotated[float, typer.Option(help="Smallest slowdown called a regression, >= 0 (0.05 = 5%); a row's "
                                                  "own noise (IQR / median) raises it.")] = 0.05,
    force: Annotated[bool, typer.Option("--force", help="Compare runs from different GPUs or torch/triton versions "
                                                        "anyway (the output says so).")] = False,
    allow_missing: Annotated[bool, typer.Option("--allow-missing", help="Accept rows of BASE absent from NEW, or no "
                                                                        "row in common (otherwise exit 2).")] = False,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="Also write compare.csv and compare.md "
                                                                               "into this folder [default: none: "
                                                                               "print only].")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Ratio of medians per matching row of two report folders; exit 3 on a regression.

    A row regressed when NEW / BASE exceeds 1 + the threshold (the larger of --threshold and
    either row's IQR / median); a parity check that passed in BASE and fails in NEW, or a
    candidate that errors in NEW, is a regression too."""
    from .session.options import check_bound, check_output_dir

    out = Output(fmt)
    with usage_errors(out):
        check_bound("--threshold", threshold, Bound(0))
        check_output_dir(output_dir)
    from .report.compare import compare_reports, write_comparison

    with usage_errors(out):
        result = compare_reports(base, new, min_threshold=threshold, force=force, allow_missing=allow_missing)
    if result.mismatches:
        out.warn("--force: comparing across environments: " + "; ".join(result.mismatches))
    out.table(f"compare {base} -> {new}", result.table, name="compare")
    out.flush()
    for title, names in (("only in BASE", result.only_base), ("only in NEW", result.only_new)):
        if names:
            out.note(f"{title}: " + ", ".join(names))
    if output_dir:
        with usage_errors(out):
            write_comparison(result, base, new, output_dir)
    if not result.regressions.empty:
        raise fail(out, f"{len(result.regressions)} regression(s)", Exit.REGRESSION)
    if result.table.empty:
        out.warn("no timed rows in common between the two reports (--allow-missing)")


@app.command(epilog=EXIT_CODES_HELP)
def env(
    device: DeviceOpt = "auto",
    ceilings: Annotated[bool, typer.Option("--ceilings", help="Also measure copy bandwidth and bf16 matmul rate (CUDA "
                                                              "only; takes a few seconds).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fingerprint as one JSON object (what run.json "
                                                         "records).")] = False,
) -> None:
    """The environment fingerprint that every report records."""
    import json

    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device

    out = Output(Format.json if as_json else Format.table)
    with usage_errors(out):
        dev = resolve_device(device)
    info = fingerprint(dev, seed=0)
    if ceilings:
        if dev != "cuda":
            raise fail(out, "--ceilings needs CUDA")
        import torch

        from .harness.ceilings import measure_ceilings

        info["ceilings"] = measure_ceilings(torch.cuda.current_device()).as_dict()
    if as_json:
        print(json.dumps(info, indent=1, default=str))
        return
    out.table("kernelbench env", [{"key": k, "value": str(v)} for k, v in info.items()], name="env")


@app.command("train", epilog=EXIT_CODES_HELP)
def train_cmd(
    op: Annotated[str, typer.Argument(help=f"An optimizer op ({_optimizer_ops()}) or a layer op ({_layer_ops()}).")],
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps per run (default: 500 on CUDA, 20 on "
                                                              "the CPU).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", help="Sequences per step (default: 32 on CUDA, 4 on the CPU).")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sequence (default: 256 on CUDA, 32 on the CPU).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the initial weights and of the token stream "
                                                           "[default: 0].")] = None,
    lr: Annotated[float | None, typer.Option(
        "--lr", help="Learning rate for every candidate (default: the op's).")] = None,
    rtol: Annotated[float | None, typer.Option("--rtol", help="The band is widened by rtol x the reference's final "
                                                              "loss on each side [default: 0.01].")] = None,
    ref_seeds: Annotated[int | None, typer.Option("--ref-seeds", help="Data orders the reference is trained with; "
                                                                      "their spread is the band [default: 3].")] = None,
    model: Annotated[str | None, typer.Option("--model", help="A kernelbench.models config (default: llama-7m on "
                                                              "CUDA, llama-tiny on the CPU).")] = None,
    candidate: CandidateOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
    fsdp: FsdpOpt = False,
    nproc: NprocOpt = None,
    plugin: PluginOpt = None,
) -> None:
    """Train a small Llama-style model with every candidate of OP (same weights, same batches) and
    judge each final loss against the band of the reference's seed-to-seed spread; exit 1 when one fails.
    A layer op's own candidates (a plugin's by default, any named with -c) replace that one layer
    of torch's layers.

    With --fsdp the candidates train with the model sharded by FSDP2's fully_shard over --nproc
    ranks, each rank an equal share of every batch (--batch a multiple of --nproc); the reference
    makes the band on one device, since sharding changes no step's math."""
    out = Output(fmt)
    with usage_errors(out):
        request = TrainRequest(op, device=device, model=model, steps=steps, batch=batch, seq=seq, seed=seed, lr=lr,
                               rtol=rtol, ref_seeds=ref_seeds, candidates=candidate,
                               tags={"state": state} if state else {}, output=OutputSettings(output_dir),
                               fsdp_nproc=check_fsdp(fsdp, nproc), plugins=plugin)
        check_train(request, Shown(out))
    shown = Shown(out)
    with usage_errors(out), shown.spinner():
        outcome = Session(shown).train(request)
    result, about = outcome.detail, ""
    if result is not None and outcome.status is not Status.INTERRUPTED:
        from .train.run import result_table

        out.note(f"data: {result.stats.describe()}")
        band = result.band
        if band is not None:
            out.note(f"band: reference final loss {band.mean:.4f} +- {band.half_width:.4f} (data orders "
                     + ", ".join(f"{f:.4f}" for f in band.seed_finals)
                     + f"; widened by rtol {result.settings.rtol:g})")
        out.table(f"train {op}: {result.settings.model}, {result.settings.steps} steps", result_table(result),
                  name="train")
        out.flush()
        about = f"{result.wall_s:.0f} s, the reference's data orders included"
    finish(out, outcome, about)


@app.command("plot", epilog=EXIT_CODES_HELP)
def plot_cmd(
    report_dirs: Annotated[list[Path], typer.Argument(help="Report folders (run, parity, train, or compare "
                                                           "--output-dir).")],
) -> None:
    """Write PNG plots beside each report: sweeps, ratios to the anchor, parity, loss curves, compare."""
    out = Output(Format.table)
    from .report.plot import INSTALL_HINT, check_plottable, matplotlib_available, update_summary, write_plots
    from .report.writer import ReportError

    if not matplotlib_available():
        raise fail(out, f"plot needs matplotlib: {INSTALL_HINT}")
    try:
        for folder in report_dirs:
            check_plottable(folder)
    except ReportError as exc:
        raise fail(out, str(exc)) from None
    for folder in report_dirs:
        try:
            paths = write_plots(folder)
        except ReportError as exc:
            raise fail(out, str(exc)) from None
        if not paths:
            out.note(f"{folder}: nothing to plot (no speed ratio, sweep, parity, loss or compare rows)")
        for path in paths:
            out.note(f"wrote {path}")
        if update_summary(folder, paths):
            out.note(f"updated {folder / 'summary.md'}: it links the plots")


@app.command(epilog=EXIT_CODES_HELP)
def autoselect(
    op: Annotated[str, typer.Argument(help="rmsnorm or rotary.")],
    shape: Annotated[str, typer.Option("--shape", help="rmsnorm: the input shape, e.g. 16x2048x4096; rotary: "
                                                       "BxHqxHkxSxDxROTARY_DIM.")],
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    mode: Annotated[str, typer.Option("--mode", help="fwd or fwd+bwd.")] = "fwd+bwd",
    variant: Annotated[str, typer.Option("--variant", help="rotary: <style>-<layout>, e.g. half-bhsd.")] = "",
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again and overwrite the cached choice.")] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Show (measuring once, then from the on-disk cache) which implementation auto picks for a shape."""
    out = Output(fmt)
    dtypes = ("bf16", "fp16", "fp32")
    if dtype not in dtypes:
        raise fail(out, f"--dtype {dtype}: accepted: {', '.join(dtypes)}")
    try:
        dims = tuple(int(d) for d in shape.lower().split("x"))
    except ValueError:
        raise fail(out, f"--shape {shape}: expected integers separated by x, e.g. 16x2048x4096") from None
    from .nn import autoselect_report
    from .ops.base import torch_dtype

    try:
        report = autoselect_report(op, dims, torch_dtype(dtype), mode=mode, variant=variant, refresh=refresh)
    except ValueError as exc:
        raise fail(out, str(exc)) from None
    rows = [{"implementation": impl + (" (chosen)" if impl == report["choice"] else ""),
             "median ms": "not measured" if ms is None else ms} for impl, ms in report["times_ms"].items()]
    out.table(f"autoselect {op} {shape} {dtype} {mode}", rows, name="autoselect")
    out.flush()
    out.note(f"choice: {report['choice']} ({report['reason']}); {_autoselect_source(report)}")


def _autoselect_source(report: dict) -> str:
    """Where an autoselect answer came from, naming the cache file only where it exists."""
    if not report.get("measured", True):
        return "source: not measured, so nothing was cached"
    source = {"measured": "measured now", "memory": "this process's earlier answer",
              "file": "the cache file"}.get(report["source"], report["source"])
    cache = Path(report["cache_file"])
    return f"source: {source}; " + (f"cache: {cache}" if cache.is_file() else f"not cached ({cache} was not written)")
