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
    "3 compare or ab found a row slower (or a parity check broken; with --strict, one inconclusive); "
    "4 nothing that was asked for could run here; "
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
    settle_ms: Annotated[float | None, typer.Option(
        help=_timing_help("settle_ms", "Untimed interleaved rounds before the timed ones until the candidates "
                                       "have run this long, ms: for steps that hold the GPU at its power cap, "
                                       "whose first second or two from idle run faster, then slower"))] = None,
    no_flush_l2: Annotated[bool, typer.Option("--no-flush-l2",
                                              help="Keep L2 warm between reps (the report says so).")] = False,
    parity_steps: Annotated[int | None, typer.Option(help="With an op: also check parity over this many optimizer "
                                                          "steps / input draws (the parity command's --steps) "
                                                          "[default: no parity].")] = None,
    parity_detail: ParityDetailOpt = None,
    lock_clocks: Annotated[bool, typer.Option("--lock-clocks", help="Lock the GPU's application clocks at their "
                                                                    "defaults for the run and put the old ones back "
                                                                    "after it, where the driver permits (it says "
                                                                    "so where not).")] = False,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="With an op whose optimizer reports telemetry "
                                                                "(adam-mini): record max |update|, max |m|, fp8 "
                                                                "scales after the timed steps.")] = False,
    nproc: Annotated[int | None, typer.Option("--nproc", help=op_option_help("--nproc"))] = None,
    steps: Annotated[int | None, typer.Option("--steps", help=op_option_help("--steps"))] = None,
    bucket_mb: Annotated[float | None, typer.Option("--bucket-mb", help=op_option_help("--bucket-mb"))] = None,
    gather_group: Annotated[bool | None, typer.Option("--gather-group/--no-gather-group",
                                                         help=op_option_help("--gather-group"))] = None,
    stall_s: Annotated[float | None, typer.Option("--stall-s", help=op_option_help("--stall-s"))] = None,
    seed: SeedOpt = None,
    sweep: SweepOpt = None,
    model: Annotated[str | None, typer.Option("--model", help="llama-step: a model of the grid (list --workloads) "
                                                              "or hidden=..,layers=..,heads=..,kv_heads=..,"
                                                              "intermediate=..,vocab=..")] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help="llama-step: batch x sequence, e.g. 4x2048 (of "
                                                                "--model, else of each -w).")] = None,
    plugin: PluginOpt = None,
) -> None:
    """Benchmark an op's candidates (or a suite) and write a report folder.

    Without an op: the suite given by --config, else configs/ci.toml on a CUDA machine and
    configs/quick.toml without one. Timing options (--rounds, --rep-ms, --warmup-ms, --settle-ms,
    --cuda-graph, --no-flush-l2) override the suite's; options that choose what runs (-c, -w, -m, --state,
    --telemetry, --parity-steps, --sweep) need an op. -w also takes a workload written as a shape
    (16384x4096:bf16) or, for optimizer ops, model:NAME or a parameter-list file (list --workloads
    says which op takes what). `dist-adamw` is multi-process:
    `kernelbench run dist-adamw --nproc 2` starts the ranks through torch.distributed.run and compares
    ShardedAdamW with all-reduce + torch fused AdamW; it takes -w, --device, -o, --format and the
    dist-adamw options only."""
    out = Output(fmt)
    with usage_errors(out):
        from .ops.llama_step import model_workload_texts

        workload = model_workload_texts(op, model, tokens, workload)
    launched = {"--nproc": nproc, "--steps": steps, "--bucket-mb": bucket_mb, "--gather-group": gather_group,
                "--stall-s": stall_s}
    options = RunOptions(
        op=op, config=config, candidates=candidate, workloads=workload, modes=mode, state=state,
        cuda_graph=cuda_graph or None, warmup_ms=warmup_ms, rep_ms=rep_ms, rounds=rounds,
        settle_ms=settle_ms, flush_l2=False if no_flush_l2 else None, parity_steps=parity_steps,
        telemetry=telemetry or None,
        seed=seed, parity_detail=parity_detail, sweep=sweep, plugins=plugin, device=device, output_dir=output_dir,
        lock_clocks=lock_clocks or None,
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


ThresholdOpt = Annotated[float, typer.Option(
    "--threshold", help="Smallest slowdown that fails, >= 0 (0.05 = 5%): a row is slower when the interval of its "
                        "new / base median lies wholly above 1 + threshold.")]
AlphaOpt = Annotated[float, typer.Option(
    "--alpha", help="Significance level of the rank test; the interval of the ratio covers 1 - alpha.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Fail (exit 3) on inconclusive rows too.")]


def _verdicts_end(out: Output, result, strict: bool) -> None:
    """The notes every comparison ends with, and its exit code: 3 for slower or broken rows (and
    inconclusive ones under --strict)."""
    def names(frame) -> str:
        return ", ".join("/".join(map(str, r)) for r in frame[["op", "workload", "mode", "candidate"]].values)

    for title, listed in (("only in BASE", result.only_base), ("only in NEW", result.only_new)):
        if listed:
            out.note(f"{title}: " + ", ".join(listed))
    if result.fallback_rows:
        out.warn(f"{result.fallback_rows} row(s) judged by the IQR rule (new / base against 1 + the larger of "
                 "--threshold and IQR / median): a side kept no per-rep samples (a report from before they were kept)")
    inconclusive = result.inconclusive
    if not inconclusive.empty:
        out.warn(f"{len(inconclusive)} inconclusive (the samples cannot tell whether the change exceeds the threshold"
                 f"{'' if strict else '; not failing without --strict'}): {names(inconclusive)}")
    failing = result.regressions
    if not failing.empty or (strict and not inconclusive.empty):
        counts = failing["verdict"].value_counts().to_dict()
        parts = [f"{n} {verdict}" for verdict, n in counts.items()]
        if strict and not inconclusive.empty:
            parts.append(f"{len(inconclusive)} inconclusive (--strict)")
        raise fail(out, ", ".join(parts) + (f": {names(failing)}" if not failing.empty else ""), Exit.REGRESSION)
    if result.table.empty:
        out.warn("no timed rows in common between the two sides (--allow-missing)")


@app.command(epilog=EXIT_CODES_HELP)
def compare(
    base: Annotated[Path, typer.Argument(help="Report folder of the baseline run.")],
    new: Annotated[Path, typer.Argument(help="Report folder of the new run.")],
    threshold: ThresholdOpt = 0.05,
    alpha: AlphaOpt = 0.01,
    strict: StrictOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Compare runs from different GPUs or torch/triton versions "
                                                        "anyway (the output says so).")] = False,
    allow_missing: Annotated[bool, typer.Option("--allow-missing", help="Accept rows of BASE absent from NEW, or no "
                                                                        "row in common (otherwise exit 2).")] = False,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="Also write compare.csv, compare.md "
                                                                               "and compare.png into this folder "
                                                                               "[default: none: print only].")] = None,
    process_noise: Annotated[float, typer.Option(
        "--process-noise", help="How far a row moves between two processes of one commit, >= 0: faster / slower "
                                "need the interval beyond 1 +- this too (0.03: the 95th percentile on H100s), and "
                                "host-bound rows get neither; `ab` measures it instead.")] = 0.03,
    fmt: FormatOpt = Format.table,
) -> None:
    """A verdict per matching timed row of two report folders: faster, slower, same or
    inconclusive; exit 3 when a row is slower.

    Rows are judged from both reports' per-rep samples: a Mann-Whitney U test and a bootstrap
    interval of new / base median (rounds resampled, then reps). slower: significant and the
    interval wholly above 1 + threshold; faster: below 1 - threshold; same: inside both;
    inconclusive otherwise (listed; it fails only with --strict). A row whose IQR / median
    exceeds the threshold is held to that spread instead. Each report is one process, and a
    process can sit at its own level: a row is held to --process-noise as well, and a host-bound
    row (its time the host's) is inconclusive rather than faster or slower; `ab`, with several
    processes a side, resamples them instead. Reports without samples fall back to
    new / base against 1 + the larger of the threshold and either row's IQR / median, and say so.
    A parity check that passed in BASE and fails in NEW, or a candidate that errors in NEW, is
    broken and fails too."""
    from .session.options import check_bound, check_output_dir

    out = Output(fmt)
    with usage_errors(out):
        check_bound("--threshold", threshold, Bound(0))
        check_bound("--process-noise", process_noise, Bound(0))
        check_output_dir(output_dir)
    from .report.compare import compare_reports, write_comparison

    with usage_errors(out):
        result = compare_reports(base, new, threshold=threshold, alpha=alpha, force=force, allow_missing=allow_missing,
                                 process_noise=process_noise)
    if result.mismatches:
        out.warn("--force: comparing across environments: " + "; ".join(result.mismatches))
    out.table(f"compare {base} -> {new}", result.table, name="compare")
    out.flush()
    if output_dir:
        with usage_errors(out):
            write_comparison(result, base, new, output_dir)
    _verdicts_end(out, result, strict)


@app.command(epilog=EXIT_CODES_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ab(
    ctx: typer.Context,
    base: Annotated[str, typer.Argument(help="The baseline: a git revision, a virtualenv folder or a Python "
                                             "executable.")],
    new: Annotated[str, typer.Argument(help="The new side, as BASE.")],
    rounds: Annotated[int, typer.Option("--rounds", help="Processes per side, alternating BASE NEW / NEW BASE, "
                                                         ">= 1.")] = 3,
    threshold: ThresholdOpt = 0.05,
    alpha: AlphaOpt = 0.01,
    strict: StrictOpt = False,
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Time BASE and NEW on this machine in alternating processes and give a verdict per row;
    exit 3 when a row is slower.

    What each process runs follows --: `kernelbench ab main HEAD -- rmsnorm -w 32768x4096-bf16`
    or `kernelbench ab main HEAD -- --config configs/ci.toml` (its [[bench]] tables only). A git
    revision is checked out into a temporary worktree and run by this Python; a virtualenv or an
    executable runs its own kernelbench. Each process writes a report folder under -o, beside
    compare.csv, ab.md and ab.json; verdicts as in compare, from every process's samples."""
    import shutil
    import tempfile

    from .report.writer import default_output_dir
    from .session.ab import (
        compare_sides,
        pool,
        prepare_run_args,
        remove_side,
        resolve_side,
        run_alternating,
        write_outputs,
    )
    from .session.options import check_bound, check_output_dir
    from .session.signals import interruption_name, interrupts

    out = Output(fmt)
    with usage_errors(out):
        check_bound("--rounds", rounds, Bound(1))
        check_bound("--threshold", threshold, Bound(0))
        check_output_dir(output_dir)
        if not 0 < alpha < 1:
            raise UsageError(f"--alpha {alpha:g}: must be between 0 and 1")
    folder = output_dir or default_output_dir("ab", "-".join(Path(s).name or s for s in (base, new))[:60])
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    with usage_errors(out):
        run_args = prepare_run_args(list(ctx.args), folder)
    sides, workdir = [], Path(tempfile.mkdtemp(prefix="kernelbench-ab-"))
    try:
        with usage_errors(out):
            sides = [resolve_side("BASE", base, workdir), resolve_side("NEW", new, workdir)]
        out.note(f"BASE: {sides[0].describe}; NEW: {sides[1].describe}; {rounds} process(es) each, alternating")
        shown = Shown(out)
        with interrupts(), shown.spinner():
            processes = run_alternating(*sides, run_args, rounds, folder, shown.progress)
    except KeyboardInterrupt as exc:
        raise fail(out, f"interrupted by {interruption_name(exc)}: {folder} holds the processes that finished",
                   interruption_code(interruption_name(exc))) from None
    finally:
        for side in sides:
            remove_side(side)
        shutil.rmtree(workdir, ignore_errors=True)
    pooled = {label: pool([Path(p.folder) for p in processes if p.side == label]) for label in ("BASE", "NEW")}
    for label, side in zip(("BASE", "NEW"), sides):
        if pooled[label].times.empty:
            logs = ", ".join(str(Path(p.folder).with_suffix(".log")) for p in processes if p.side == label)
            raise fail(out, f"{label} ({side.describe}) timed nothing: see {logs}", Exit.NOTHING_RAN)
        if pooled[label].processes_without_samples:
            out.warn(f"{label} keeps no per-rep samples (an older kernelbench): one sample per process, its median")
    result = compare_sides(pooled["BASE"], pooled["NEW"], threshold=threshold, alpha=alpha)
    if result.mismatches:
        out.warn("the two sides' environments differ: " + "; ".join(result.mismatches))
    write_outputs(folder, result, *sides, processes, run_args, threshold)
    out.table(f"ab {sides[0].describe} -> {sides[1].describe}", result.table, name="ab")
    out.flush()
    out.note(f"Report: {folder}")
    _verdicts_end(out, result, strict)


history_app = typer.Typer(help="Keep reports over commits in a local SQLite store, and show each candidate's "
                               "median over them.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(history_app, name="history")
StoreOpt = Annotated[Path | None, typer.Option("--store", help="The history file [default: $KERNELBENCH_HISTORY, "
                                                               "else kernelbench-history.sqlite here].")]


@history_app.command("add", epilog=EXIT_CODES_HELP)
def history_add(
    report_dirs: Annotated[list[Path], typer.Argument(help="Report folders of run (results.csv and run.json).")],
    store: StoreOpt = None,
) -> None:
    """Append reports to the store, keyed by GPU, torch / triton / CUDA versions and git sha (a
    report already there is not added twice)."""
    from .report.history import add_report, default_store

    out = Output(Format.table)
    path = store or default_store()
    for folder in report_dirs:
        with usage_errors(out):
            added = add_report(path, folder)
        out.note(f"{folder}: " + (f"{added.rows} timed row(s) of {added.sha or 'no git sha'} added to {path}"
                                  if added.new else f"already in {path} (run {added.run_id}): nothing added"))


@history_app.command("show", epilog=EXIT_CODES_HELP)
def history_show(
    op: Annotated[str, typer.Argument(help="The op whose history to show.")],
    workload: Annotated[str | None, typer.Option("--workload", "-w", help="Only this workload.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only runs on this GPU (its name as reports give "
                                                          "it).")] = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Smallest move from the current level called a "
                                                                 "step, >= 0.")] = 0.05,
    store: StoreOpt = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="Also write history-*.png and "
                                                                               "history.csv into this folder.")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Each candidate's median over the stored runs (oldest first) with its interval, the change
    from the run before, what changed in the environment, and step changes."""
    from .report.history import default_store, history_table, load_series, plot_history
    from .session.options import check_bound, check_output_dir

    out = Output(fmt)
    with usage_errors(out):
        check_bound("--threshold", threshold, Bound(0))
        check_output_dir(output_dir)
        series = load_series(store or default_store(), op, workload, gpu)
    if series.empty:
        raise fail(out, f"no stored timing of {op}" + (f" -w {workload}" if workload else "")
                   + (f" on {gpu}" if gpu else "") + f" in {store or default_store()}", Exit.NOTHING_RAN)
    table = history_table(series, threshold)
    out.table(f"history {op}", table, name="history")
    out.flush()
    steps = table[table["step"].str.startswith("step")]
    if not steps.empty:
        out.warn(f"{len(steps)} step change(s): " + "; ".join(
            f"{r.candidate} {r.workload} {r.mode} at {r.commit}: {r.step}" for r in steps.itertuples()))
    if output_dir:
        output_dir.mkdir(parents=True, exist_ok=True)
        table.to_csv(output_dir / "history.csv", index=False)
        from .report.plot import matplotlib_available

        if matplotlib_available():
            for path in plot_history(table, op, output_dir):
                out.note(f"wrote {path}")


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
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps per run (default: 500 on CUDA, 800 "
                                                              "with --data slow-chain, 20 on the CPU).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", help="Sequences per step (default: 32 on CUDA, 4 on the CPU).")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sequence (default: 256 on CUDA, 64 with --data slow-chain, 32 on the CPU).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the initial weights and of the token stream "
                                                           "[default: 0].")] = None,
    lr: Annotated[float | None, typer.Option(
        "--lr", help="Learning rate for every candidate (default: the op's).")] = None,
    rtol: Annotated[float | None, typer.Option("--rtol", help="The band is widened by rtol x the reference's final "
                                                              "loss on each side [default: 0.01].")] = None,
    ref_seeds: Annotated[int | None, typer.Option("--ref-seeds", help="Data orders the reference is trained with; "
                                                                      "their spread is the band [default: 3].")] = None,
    model: Annotated[str | None, typer.Option("--model", help="A model of the grid (list --workloads) or hidden=..,"
                                                              "layers=..,... (default: llama-7m on CUDA, its layers "
                                                              "over 512 tokens with --data slow-chain, llama-tiny on "
                                                              "the CPU).")] = None,
    data: Annotated[str | None, typer.Option(
        "--data", help="The token stream: markov (learnt in a few dozen steps) or slow-chain (hundreds) "
                       "[default: markov].")] = None,
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
                               rtol=rtol, ref_seeds=ref_seeds, data=data, candidates=candidate,
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
    """Write PNG plots beside each report: sweeps, ratios to the anchor, parity, loss curves, compare, and
    the spread of per-rep times."""
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
            paths = write_plots(folder, samples=True)
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
    op: Annotated[str, typer.Argument(help="rmsnorm, rotary or swiglu.")],
    shape: Annotated[str, typer.Option("--shape", help="rmsnorm: the input shape, e.g. 16x2048x4096; rotary: "
                                                       "BxHqxHkxSxDxROTARY_DIM; swiglu: gate's shape.")],
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    mode: Annotated[str, typer.Option("--mode", help="fwd or fwd+bwd.")] = "fwd+bwd",
    variant: Annotated[str, typer.Option("--variant", help="rmsnorm: residual (with the fused add); rotary: "
                                                           "<style>-<layout>, e.g. half-bhsd.")] = "",
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
