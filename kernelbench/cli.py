"""kernelbench's command line: parse, call the harness, print, exit with a documented code.

A command is one function below. What commands share lives at the top: the option types
(``DeviceOpt``, ``FormatOpt``...), ``Output`` (tables as text / Markdown / JSON / CSV, one-line
errors, full width without a terminal), ``fail`` and ``usage_errors`` (exit 2 with one line),
``interrupts`` (SIGTERM / SIGHUP end a run the way Ctrl-C does). Nothing here imports torch or
pandas at module level: ``--help``, ``list`` and argument errors answer without them.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Annotated

import typer

from .ops import get_op, load_all
from .ops.base import UsageError
from .ops.launched_op import LaunchedOp, OpOption
from .report.output import Format, Output


class Exit(IntEnum):
    OK = 0
    PARITY_FAILED = 1
    USAGE = 2
    REGRESSION = 3
    NOTHING_RAN = 4


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a parity check failed (train: a candidate left the band); 2 usage or config error; "
    "3 regression found by compare; 4 nothing that was asked for could run here; "
    "130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP (the report is closed and says so)."
)

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


class Interrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP raised as an interruption, so a run closes its report as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interruption_name(exc: KeyboardInterrupt) -> str:
    return signal.Signals(exc.signum).name if isinstance(exc, Interrupted) else "SIGINT"


def interruption_code(name: str) -> int:
    return 128 + int(signal.Signals[name])


@contextmanager
def interrupts() -> Iterator[None]:
    """SIGTERM (CI runners, `timeout`) and SIGHUP raise Interrupted; a second one while the
    report closes is ignored."""
    def handler(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def check_range(option: str, value, *, minimum=None, above=None) -> None:
    """A numeric option's bounds, checked before anything is imported or run."""
    if value is None:
        return
    if minimum is not None and value < minimum:
        raise UsageError(f"{option} {value:g}: must be at least {minimum:g}")
    if above is not None and value <= above:
        raise UsageError(f"{option} {value:g}: must be greater than {above:g}")


def check_output_dir(path: Path | None) -> None:
    """-o names a folder that exists or can be made: not a file, not under a file."""
    if path is None:
        return
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"--output-dir {path}: is a file; name a folder (it is made if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--output-dir {path}: the folder is not writable")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--output-dir {path}: {parent} is a file, so no folder can be made under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output-dir {path}: cannot make it: {parent} is not writable")


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
FormatOpt = Annotated[Format, typer.Option(
    "--format", case_sensitive=False,
    help="table (text), markdown, json (an array of objects, one per row, each naming its table) or csv. "
         "With json / csv, stdout carries only that; notes go to stderr.")]
ParityDetailOpt = Annotated[str, typer.Option(
    "--parity-detail",
    help="worst: per-tensor parity rows only for failing tensors and the 3 worst per measure; full: every tensor.")]


# Options only some ops take (dist-adamw's --nproc...): declared by those ops, checked through them.
def _launched_ops() -> list[LaunchedOp]:
    return [op for op in load_all().values() if isinstance(op, LaunchedOp)]


_OP_OPTION_FLAGS = tuple(dict.fromkeys(flag for op in _launched_ops() for flag in op.options))


def _option_owners(flag: str) -> list[LaunchedOp]:
    return [op for op in _launched_ops() if flag in op.options]


def _option_owner(flag: str) -> OpOption:
    return _option_owners(flag)[0].options[flag]


def _op_option_help(flag: str) -> str:
    owners = _option_owners(flag)
    if not owners:
        return "(no op takes it)"
    return f"{', '.join(o.name for o in owners)} only: {owners[0].options[flag].help}"


def _foreign_options_error(given: dict) -> str:
    """Options of other ops given to an op that does not take them: whose they are, and any look-alike."""
    by_owner: dict[str, list[str]] = {}
    for flag in given:
        by_owner.setdefault(", ".join(o.name for o in _option_owners(flag)), []).append(flag)
    parts = [f"{', '.join(flags)}: {owner} options only (kernelbench run {owner.split(',')[0]} ...)"
             for owner, flags in by_owner.items()]
    hints = [_option_owner(flag).elsewhere_hint for flag in given if _option_owner(flag).elsewhere_hint]
    return "; ".join(parts + hints)


# ------------------------------------------------------------------------------------------------
def _nvidia_device_present() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _list_device(requested: str) -> str:
    """The device `list` judges for: no torch import and no CUDA probe unless asked for CUDA or
    an NVIDIA device node exists."""
    if requested not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {requested}: accepted values are cpu, cuda, auto")
    if requested == "cuda" or (requested == "auto" and _nvidia_device_present()):
        from .harness.runner import resolve_device

        return resolve_device(requested)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # what a CPU run sets before building kernels
    return "cpu"


@app.command("list", epilog=EXIT_CODES_HELP)
def list_cmd(device: DeviceOpt = "auto",
             workloads: Annotated[bool, typer.Option("--workloads", help="Also list each op's workloads (tier, modes, "
                                                                         "seed).")] = False,
             fmt: FormatOpt = Format.table) -> None:
    """Every op and candidate, and whether it can run here (and if not, why).

    "runs here" comes from the installed packages and, only where an NVIDIA device node exists
    (/dev/nvidia*) or with --device cuda, a CUDA probe (GPU count, compute capability): on a
    machine without a GPU, list imports neither torch nor CUDA."""
    out = Output(fmt)
    with usage_errors(out):
        dev = _list_device(device)
    rows = []
    for op in load_all().values():
        for cand in op.candidates.values():
            role = ", ".join(r for r, on in (("reference", cand.name == op.reference),
                                              ("anchor", cand.name == op.speed_anchor),
                                              ("baseline", cand.baseline)) if on)
            rows.append({"op": op.name, "candidate": cand.name,
                         "tags": ", ".join(f"{k}={v}" for k, v in cand.tags.items()),
                         "role": role, "runs here": op.availability(cand, dev), "what": cand.doc})
    out.table(f"kernelbench candidates (device: {dev})", rows, name="candidates")
    if workloads:
        wrows = [{"op": op.name, "workload": w.name, "tier": w.tier, "modes": ", ".join(op.modes()), "seed": w.seed}
                 for op in load_all().values() for w in op.workloads.values()]
        out.table("workloads", wrows, name="workloads")
    out.flush()
    from .ops import LOAD_ERRORS

    for module, error in LOAD_ERRORS.items():
        out.error(f"op module kernelbench.ops.{module} failed to import: {error}")


# ------------------------------------------------------------------------------------------------
def _plan(entries, device: str, seed: int):
    """PlanItems for config / CLI entries: names resolved, the device's tier by default."""
    import dataclasses

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


def _check_parity_candidates(op_name: str, names: list[str] | None) -> None:
    """Candidates named for parity must include one that takes part in it (the reference and
    anchors computing something else are not checked)."""
    op = get_op(op_name)
    if not names:
        return
    checked = [c.name for c in op.candidates.values() if c.parity and c.name != op.reference]
    if any(name in checked for name in names):
        return
    why = {name: ("the reference: the others are checked against it" if name == op.reference else
                  "an anchor computing something else, timed beside the others") for name in names}
    raise UsageError("no named candidate is checked for parity: " + "; ".join(f"'{n}' is {w}" for n, w in why.items())
                     + f". Checked candidates of '{op.name}': {', '.join(checked)}")


def _check_names(op_name: str, workloads: list[str] | None, modes: list[str] | None) -> None:
    """Workload and mode names, checked before torch is imported."""
    op = get_op(op_name)
    for name in workloads or []:
        op.workload(name)
    for mode in modes or []:
        if mode not in op.modes():
            raise UsageError(f"op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")


def _check_tags(op_name: str, names: list[str] | None, tags: dict) -> None:
    """-c with --state: every named candidate must have that state."""
    op = get_op(op_name)
    op.select(None, tags)  # the tag itself must exist
    for name in names or []:
        cand = op.get_candidate(name)
        for key, value in tags.items():
            if cand.tags.get(key) != value:
                raise UsageError(f"-c {name} has {key}={cand.tags.get(key, '(none)')}, not --{key} {value}: "
                                 f"drop one of the two")


@contextmanager
def _progress(out: Output) -> Iterator:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=out.err, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda text: progress.update(task, description=text)


def _open_report(out: Output, folder: Path, fingerprint: dict, verb: str, settings: dict):
    from .report.writer import ReportWriter

    try:
        return ReportWriter(folder, fingerprint, verb, settings=settings)
    except OSError as exc:
        raise fail(out, f"--output-dir {folder}: cannot write the report there ({exc.strerror or exc})") from None


def _report_end(out: Output, writer, folder: Path, interruption: str | None, failures: list[str]) -> None:
    """Exit code and the lines that explain it: interrupted, parity failed, nothing ran."""
    if interruption:
        raise fail(out, f"interrupted by {interruption}: {folder} holds what was measured until then "
                        "(run.json says \"interrupted\")", interruption_code(interruption))
    if failures:
        raise fail(out, "parity failed: " + ", ".join(failures), Exit.PARITY_FAILED)
    statuses = [r["status"] for r in writer.rows]
    if not any(s in ("ok", "pass", "fail", "suspect", "not-measured") for s in statuses):
        reasons = {}
        for r in writer.rows:
            if r["status"] in ("skipped", "error"):
                reasons.setdefault(f"{r['candidate']}: {r['message']}", None)
        for reason in reasons:
            out.warn(f"  {reason}")
        raise fail(out, "no requested candidate could run here" + (" (reasons above)" if reasons else
                        ": nothing was selected"), Exit.NOTHING_RAN)
    if not any(s in ("ok", "pass", "fail", "suspect") for s in statuses):
        out.warn("nothing was measured: the candidates that ran are Triton kernels in the interpreter "
                 "(no GPU), whose time is not measured; check their numerics with parity, time them on a GPU")


def _execute(out: Output, verb: str, label: str, bench_entries, parity_entries, settings: dict, device: str,
             output_dir: Path | None, seed: int, telemetry: bool = False, detail: str = "worst") -> None:
    """Runs a plan into a report folder, prints the tables and exits with the right code."""
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device, run_benchmarks, run_parity
    from .harness.timing import TimingConfig
    from .report.tables import bench_table, parity_table
    from .report.writer import default_output_dir

    launched = [e for e in bench_entries if isinstance(get_op(e.op), LaunchedOp)]
    bench_entries = [e for e in bench_entries if e not in launched]
    with usage_errors(out):
        dev = resolve_device(settings.get("device", device) if device == "auto" else device)
        bench_plan = _plan(bench_entries, dev, seed)
        parity_plans = [(e, _plan([e], dev, seed)) for e in parity_entries]
    if dev == "cpu":
        out.note("No CUDA device: running on the CPU. CPU candidates are timed with perf_counter; Triton "
                 "kernels run in the Triton interpreter for parity only (their time is not measured).", "yellow")
    timing = TimingConfig(
        warmup_ms=float(settings.get("warmup_ms", 25.0)), rep_ms=float(settings.get("rep_ms", 100.0)),
        cuda_graph=bool(settings.get("cuda_graph", False)), flush_l2=bool(settings.get("flush_l2", True)),
    )
    folder = output_dir or default_output_dir(verb, label)
    created = not folder.exists()
    recorded = {k: v for k, v in settings.items()} | {"parity_detail": detail}
    outcome, interruption, usage_error = "failed", None, None
    summaries = []
    with interrupts():
        writer = _open_report(out, folder, fingerprint(dev, seed), verb, recorded)
        try:
            with _progress(out) as on_progress:
                if dev == "cuda" and bench_plan:
                    import torch

                    from .harness.ceilings import measure_ceilings

                    on_progress("measuring the device's copy bandwidth and bf16 matmul rate")
                    writer.set_ceilings(measure_ceilings(torch.cuda.current_device()).as_dict())
                if bench_plan:
                    summaries.append(run_benchmarks(bench_plan, dev, writer, timing=timing,
                                                    rounds=int(settings.get("rounds", 3)), telemetry=telemetry,
                                                    on_progress=on_progress))
                for entry in launched:
                    _launch_entry(out, writer, folder, get_op(entry.op), entry.workloads, dev, on_progress)
                for entry, plan in parity_plans:
                    summaries.append(run_parity(plan, dev, writer, steps=entry.steps, atol=entry.atol,
                                                rtol=entry.rtol, detail=detail, on_progress=on_progress))
            outcome = "complete"
        except UsageError as exc:
            usage_error = str(exc)
        except KeyboardInterrupt as exc:
            outcome, interruption = "interrupted", interruption_name(exc)
        finally:
            writer.close(outcome, interruption)
    if usage_error is not None:
        if created and not writer.rows:
            shutil.rmtree(folder, ignore_errors=True)
        raise fail(out, usage_error)
    frame = writer.frame()
    out.table(f"{verb}: speed", bench_table(frame), name="speed")
    out.table(f"{verb}: parity", parity_table(frame), name="parity")
    out.flush()
    out.note(f"Report: {folder}")
    _report_end(out, writer, folder, interruption, [f for s in summaries for f in s.failures])


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
    warmup_ms: Annotated[float | None, typer.Option(help="Warm-up time per candidate and round, ms, >= 0 [default: "
                                                         "25, or the suite's].")] = None,
    rep_ms: Annotated[float | None, typer.Option(help="Timed time per candidate over all rounds, ms, > 0 [default: "
                                                      "100, or the suite's].")] = None,
    rounds: Annotated[int | None, typer.Option(help="Interleaved rounds (A B A B ...) per workload, >= 1 [default: 3, "
                                                    "or the suite's].")] = None,
    no_flush_l2: Annotated[bool, typer.Option("--no-flush-l2",
                                              help="Keep L2 warm between reps (the report says so).")] = False,
    parity_steps: Annotated[int | None, typer.Option(help="With an op: also check parity over this many optimizer "
                                                          "steps / input draws (the parity command's --steps) "
                                                          "[default: no parity].")] = None,
    parity_detail: ParityDetailOpt = "worst",
    telemetry: Annotated[bool, typer.Option("--telemetry", help="With an op whose optimizer reports telemetry "
                                                                "(adam-mini): record max |update|, max |m|, fp8 "
                                                                "scales after the timed steps.")] = False,
    nproc: Annotated[int | None, typer.Option("--nproc", help=_op_option_help("--nproc"))] = None,
    steps: Annotated[int | None, typer.Option("--steps", help=_op_option_help("--steps"))] = None,
    bucket_mb: Annotated[float | None, typer.Option("--bucket-mb", help=_op_option_help("--bucket-mb"))] = None,
    gather_group: Annotated[bool | None, typer.Option("--gather-group/--no-gather-group",
                                                         help=_op_option_help("--gather-group"))] = None,
    seed: SeedOpt = None,
) -> None:
    """Benchmark an op's candidates (or a suite) and write a report folder.

    Without an op: the suite given by --config, else configs/ci.toml on a CUDA machine and
    configs/quick.toml without one. Timing options (--rounds, --rep-ms, --warmup-ms, --cuda-graph,
    --no-flush-l2) override the suite's; options that choose what runs (-c, -w, -m, --state,
    --telemetry, --parity-steps) need an op. `dist-adamw` is multi-process:
    `kernelbench run dist-adamw --nproc 2` starts the ranks through torch.distributed.run and compares
    ShardedAdamW with all-reduce + torch fused AdamW; it takes -w, --device, -o, --format and the
    dist-adamw options only."""
    out = Output(fmt)
    given = {name: value for name, value in (
        ("-c/--candidate", candidate), ("-w/--workload", workload), ("-m/--mode", mode), ("--state", state),
        ("--cuda-graph", cuda_graph or None), ("--warmup-ms", warmup_ms), ("--rep-ms", rep_ms), ("--rounds", rounds),
        ("--no-flush-l2", no_flush_l2 or None), ("--parity-steps", parity_steps), ("--telemetry", telemetry or None),
        ("--nproc", nproc), ("--steps", steps), ("--bucket-mb", bucket_mb), ("--gather-group", gather_group),
        ("--seed", seed), ("--config", config),
        ("--parity-detail", None if parity_detail == "worst" else parity_detail)) if value is not None}
    op_options = {k: given[k] for k in _OP_OPTION_FLAGS if k in given}
    target = None
    with usage_errors(out):
        check_range("--rounds", rounds, minimum=1)
        check_range("--rep-ms", rep_ms, above=0)
        check_range("--warmup-ms", warmup_ms, minimum=0)
        check_range("--parity-steps", parity_steps, minimum=0)
        for flag, value in op_options.items():
            _option_owner(flag).check(value)
        if parity_detail not in ("worst", "full"):
            raise UsageError(f"--parity-detail {parity_detail}: accepted: worst, full")
        check_output_dir(output_dir)
        if op is not None and config is not None:
            raise UsageError("give an op or --config, not both")
        target = get_op(op) if op is not None else None
        if isinstance(target, LaunchedOp):
            wrong = [k for k in given if k not in target.takes and k not in target.options]
            if wrong:
                raise UsageError(f"{', '.join(wrong)}: not accepted by {target.name}, which takes "
                                 f"{target.accepted_text()}")
        elif op_options:
            raise UsageError(_foreign_options_error(op_options))
        if op is None:
            chooses = [k for k in ("-c/--candidate", "-w/--workload", "-m/--mode", "--state", "--telemetry",
                                   "--parity-steps") if k in given]
            if chooses:
                raise UsageError(f"{', '.join(chooses)}: choose what runs, so they need an op "
                                 "(kernelbench run OP ...); a suite's [[bench]] / [[parity]] tables choose for it")
    if isinstance(target, LaunchedOp):
        _run_launched(out, target, device, workload, op_options, output_dir)
        return
    from .config import Entry, configs_dir, load_suite

    settings: dict = {}
    with usage_errors(out):
        if op is None:
            if config is None:
                on_gpu = device == "cuda" or (device == "auto" and _nvidia_device_present() and _cuda_visible())
                if device not in ("auto", "cpu", "cuda"):
                    raise UsageError(f"--device {device}: accepted values are cpu, cuda, auto")
                config = configs_dir() / ("ci.toml" if on_gpu else "quick.toml")
                out.note(f"No op given: running the default suite {config}"
                         + ("" if on_gpu else " (the CPU suite: no CUDA device)"))
            suite = load_suite(config)
            settings = dict(suite.settings)
            bench, parity, label = suite.bench, suite.parity, config.stem
        else:
            tags = {"state": state} if state else {}
            get_op(op).select(candidate, tags)  # validates names and tags before anything runs
            _check_tags(op, candidate, tags)
            _check_names(op, workload, mode)
            bench = [Entry(op, workload, candidate, mode, tags)]
            parity = [Entry(op, workload, candidate, mode, tags, steps=parity_steps)] if parity_steps else []
            if parity:
                _check_parity_candidates(op, candidate)
            label = op
    # A value given on the command line wins over the suite's, even when it equals the default.
    settings.update({k: v for k, v in (("cuda_graph", cuda_graph or None), ("rounds", rounds),
                                       ("warmup_ms", warmup_ms), ("rep_ms", rep_ms),
                                       ("flush_l2", False if no_flush_l2 else None)) if v is not None})
    _execute(out, "run", label, bench, parity, settings, device, output_dir, seed or 0, telemetry, parity_detail)


def _launch_entry(out: Output, writer, folder: Path, op: LaunchedOp, workloads: list[str] | None, dev: str,
                  on_progress, given: dict | None = None) -> None:
    """Every workload of one launched op's entry into the report; a failed launch is an error row."""
    names = [op.workload(name).name for name in workloads] if workloads else [
        w.name for w in op.workloads_for("gpu" if dev == "cuda" else "cpu")]
    settings = op.settings(dev, given or {})
    for name in names:
        on_progress(op.progress_text(name, settings))
        rows, error = op.run_workload(name, dev, folder, settings)
        for row in rows:
            writer.add(row)
        if error:
            out.error(error)


def _run_launched(out: Output, op: LaunchedOp, device: str, workloads: list[str] | None, given: dict,
                  output_dir: Path | None) -> None:
    """An op that starts its own processes: one launch per workload; each becomes report rows."""
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device
    from .report.tables import bench_table
    from .report.writer import default_output_dir

    with usage_errors(out):
        dev = resolve_device(device)
        for name in workloads or []:
            op.workload(name)
    note = op.device_note(dev)
    if note:
        out.note(note, "yellow")
    settings = op.settings(dev, given)
    folder = output_dir or default_output_dir("run", op.name)
    outcome, interruption = "failed", None
    with interrupts():
        writer = _open_report(out, folder, fingerprint(dev, 0), "run", settings)
        try:
            with usage_errors(out), _progress(out) as on_progress:
                _launch_entry(out, writer, folder, op, workloads, dev, on_progress, given)
            outcome = "complete"
        except KeyboardInterrupt as exc:
            outcome, interruption = "interrupted", interruption_name(exc)
        finally:
            writer.close(outcome, interruption)
    out.table(f"run: {op.name}", bench_table(writer.frame()), name="speed")
    out.flush()
    out.note(f"Report: {folder}")
    if interruption:
        raise fail(out, f"interrupted by {interruption}: the ranks were stopped; {folder} says so",
                   interruption_code(interruption))
    if not any(r["status"] in ("ok", "not-measured") for r in writer.rows):
        raise fail(out, f"{op.name}: no run completed (see the error above and the error rows)", Exit.NOTHING_RAN)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


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
    out.note(f"choice: {report['choice']} ({report['reason']}); source: {report['source']}; "
             f"cache: {report['cache_file']}")


@app.command(epilog=EXIT_CODES_HELP)
def parity(
    op: Annotated[str, typer.Argument(help="Op to check.")],
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps (optimizers) or fresh input draws (functions) "
                                                       "compared, >= 1 (run's --parity-steps).")] = 10,
    atol: Annotated[float | None, typer.Option(help="Override the op's absolute tolerance (>= 0).")] = None,
    rtol: Annotated[float | None, typer.Option(help="Override the op's relative tolerance (>= 0).")] = None,
    candidate: CandidateOpt = None,
    workload: WorkloadOpt = None,
    mode: ModeOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
    parity_detail: ParityDetailOpt = "worst",
    seed: SeedOpt = None,
) -> None:
    """Check every runnable candidate against the op's reference from identical seeded inputs."""
    from .config import Entry

    out = Output(fmt)
    tags = {"state": state} if state else {}
    with usage_errors(out):
        check_range("--steps", steps, minimum=1)
        check_range("--atol", atol, minimum=0)
        check_range("--rtol", rtol, minimum=0)
        if parity_detail not in ("worst", "full"):
            raise UsageError(f"--parity-detail {parity_detail}: accepted: worst, full")
        check_output_dir(output_dir)
        if isinstance(get_op(op), LaunchedOp):
            raise UsageError(get_op(op).not_a_case())
        get_op(op).select(candidate, tags)
        _check_tags(op, candidate, tags)
        _check_names(op, workload, mode)
        _check_parity_candidates(op, candidate)
    entry = Entry(op, workload, candidate, mode, tags, steps=steps, atol=atol, rtol=rtol)
    _execute(out, "parity", op, [], [entry], {}, device, output_dir, seed or 0, detail=parity_detail)


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
    out = Output(fmt)
    with usage_errors(out):
        check_range("--threshold", threshold, minimum=0)
        check_output_dir(output_dir)
    from .report.compare import compare_reports
    from .report.tables import to_markdown

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
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
            result.table.to_csv(output_dir / "compare.csv", index=False)
            (output_dir / "compare.md").write_text(f"# compare {base} -> {new}\n\n" + to_markdown(result.table))
            from .report.plot import matplotlib_available, write_plots

            if matplotlib_available():
                write_plots(output_dir)
        except OSError as exc:
            raise fail(out, f"--output-dir {output_dir}: cannot write there ({exc.strerror or exc})") from None
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
    op: Annotated[str, typer.Argument(help="An optimizer op (adamw, adam-mini, adafactor, muon) or a layer op "
                                           "(rmsnorm, rotary, swiglu, cross-entropy).")],
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps per run (default: 500 on CUDA, 20 on "
                                                              "the CPU).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", help="Sequences per step (default: 32 on CUDA, 4 on the CPU).")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sequence (default: 256 on CUDA, 32 on the CPU).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the initial weights and of the token stream.")] = 0,
    lr: Annotated[float | None, typer.Option(
        "--lr", help="Learning rate for every candidate (default: the op's).")] = None,
    rtol: Annotated[float, typer.Option("--rtol", help="The band is widened by rtol x the reference's final loss on "
                                                       "each side.")] = 0.01,
    ref_seeds: Annotated[int, typer.Option("--ref-seeds", help="Data orders the reference is trained with; their "
                                                               "spread is the band.")] = 3,
    model: Annotated[str | None, typer.Option("--model", help="A kernelbench.models config (default: llama-7m on "
                                                              "CUDA, llama-tiny on the CPU).")] = None,
    candidate: CandidateOpt = None,
    state: StateOpt = None,
    device: DeviceOpt = "auto",
    output_dir: OutputOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Train a small Llama-style model with every candidate of OP (same weights, same batches) and
    judge each final loss against the band of the reference's seed-to-seed spread; exit 1 when one fails."""
    out = Output(fmt)
    with usage_errors(out):
        check_range("--rtol", rtol, minimum=0)
        check_output_dir(output_dir)
    from .harness.envinfo import fingerprint
    from .harness.runner import resolve_device
    from .report.writer import default_output_dir
    from .train import TrainSettings, resolve
    from .train import train as run_training
    from .train.run import result_table

    with usage_errors(out):
        dev = resolve_device(device)
        settings = TrainSettings.defaults(dev, model=model, steps=steps, batch=batch, seq=seq, seed=seed, lr=lr,
                                          rtol=rtol, ref_seeds=ref_seeds)
        config = settings.validate()
        candidates = resolve(op, config, lr=lr, names=candidate, tags={"state": state} if state else {})
    folder = output_dir or default_output_dir("train", op)
    outcome, interruption = "failed", None
    with interrupts():
        writer = _open_report(out, folder, fingerprint(dev, seed), "train", {})
        try:
            with _progress(out) as on_progress:
                result = run_training(op, candidates, settings, writer, folder, on_progress=on_progress)
            outcome = "complete"
        except KeyboardInterrupt as exc:
            outcome, interruption = "interrupted", interruption_name(exc)
        finally:
            writer.close(outcome, interruption)
    if interruption:
        raise fail(out, f"interrupted by {interruption}: {folder} holds the losses logged until then "
                        "(run.json says \"interrupted\")", interruption_code(interruption))
    out.note(f"data: {result.stats.describe()}")
    band = result.band
    if band is not None:
        out.note(f"band: reference final loss {band.mean:.4f} +- {band.half_width:.4f} (data orders "
                 + ", ".join(f"{f:.4f}" for f in band.seed_finals) + f"; widened by rtol {settings.rtol:g})")
    out.table(f"train {op}: {settings.model}, {settings.steps} steps", result_table(result), name="train")
    out.flush()
    out.note(f"Report: {folder} ({result.wall_s:.0f} s, the reference's data orders included)")
    if result.band is None and not result.failures:
        raise fail(out, "the reference could not run here, so nothing was judged (see its row)", Exit.NOTHING_RAN)
    if result.failures:
        raise fail(out, "did not train like the reference: " + ", ".join(result.failures), Exit.PARITY_FAILED)


@app.command("plot", epilog=EXIT_CODES_HELP)
def plot_cmd(
    report_dirs: Annotated[list[Path], typer.Argument(help="Report folders (run, parity, train, or compare "
                                                           "--output-dir).")],
) -> None:
    """Write PNG plots beside each report: sweeps, ratios to the anchor, parity, loss curves, compare."""
    out = Output(Format.table)
    from .report.plot import INSTALL_HINT, matplotlib_available, write_plots

    if not matplotlib_available():
        raise fail(out, f"plot needs matplotlib: {INSTALL_HINT}")
    for folder in report_dirs:
        if not folder.is_dir() or not any((folder / f).is_file() for f in ("results.csv", "compare.csv", "losses.csv")):
            raise fail(out, f"{folder}: not a report folder (accepted: a folder holding results.csv, losses.csv "
                            "or compare.csv)")
    for folder in report_dirs:
        paths = write_plots(folder)
        if not paths:
            out.note(f"{folder}: nothing to plot (no speed ratio, sweep, parity, loss or compare rows)")
        for path in paths:
            out.note(f"wrote {path}")
