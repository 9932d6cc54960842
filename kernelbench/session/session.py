"""A session runs one request into one report folder and says how it ended.

It resolves the device, plans the entries through the registry (knowing no op), opens the
report, runs the harness (timing, parity) and the ops that start their own processes, closes the
report however the run ends (done, a bad value found late, Ctrl-C, SIGTERM / SIGHUP), and
returns an :class:`~kernelbench.session.request.Outcome` whose status a front end maps to an
exit code. What should be shown while it runs goes to its
:class:`~kernelbench.session.request.Listener`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..harness.rows import ERROR, FAIL, NOT_MEASURED, OK, PASS, SKIPPED, SUSPECT
from ..ops import get_op
from ..ops.base import UsageError
from .plan import is_launched, plan, workload_names
from .request import Listener, Outcome, RunRequest, Status, TrainRequest
from .signals import interruption_name, interrupts

# Statuses that show a candidate ran (timed, checked, or run in the interpreter), and that it was timed.
_RAN = (OK, PASS, FAIL, SUSPECT, NOT_MEASURED)
_TIMED = (OK, PASS, FAIL, SUSPECT)


class Session:
    def __init__(self, listener: Listener | None = None) -> None:
        self.listener = listener or Listener()

    # -- run and parity -------------------------------------------------------------------------
    def run(self, request: RunRequest) -> Outcome:
        """Times ``request.bench`` and checks ``request.parity`` into one report."""
        from ..harness.envinfo import fingerprint
        from ..harness.runner import resolve_device

        launched = [e for e in request.bench if is_launched(e)]
        timed = [e for e in request.bench if not is_launched(e)]
        device = resolve_device(request.device)
        bench_plan = plan(timed, device, request.seed)
        # Under --fsdp the entries name models, not the op's workloads: the ranks check them.
        parity_plans = [] if request.fsdp_nproc else [(e, plan([e], device, request.seed)) for e in request.parity]
        launches = [(get_op(e.op), workload_names(e, device), self._launch_settings(e, device, request))
                    for e in launched]
        if device == "cpu" and (bench_plan or parity_plans):
            self.listener.note("No CUDA device: running on the CPU. CPU candidates are timed with perf_counter; "
                               "Triton kernels run in the Triton interpreter for parity only (their time is not "
                               "measured).", important=True)
        for op, _, _ in launches:
            note = op.device_note(device)
            if note:
                self.listener.note(note, important=True)
        recorded = dict(request.recorded)
        if bench_plan:
            recorded.update(request.timing.as_dict())
        if parity_plans or request.fsdp_nproc:
            recorded["parity_detail"] = request.output.parity_detail
        if request.fsdp_nproc:
            recorded["fsdp_nproc"] = request.fsdp_nproc
        for i, (op, _, settings) in enumerate(launches):  # a second table of the same op: its own key
            key = op.name if all(other.name != op.name for other, _, _ in launches[:i]) else f"{op.name} #{i + 1}"
            recorded[key] = settings

        def work(writer) -> None:
            with _clock_lock(self.listener, request.lock_clocks, device) as locked:
                if locked is not None:
                    writer.settings["lock_clocks"] = locked
                measure(writer)

        def measure(writer) -> None:
            if device == "cuda" and bench_plan:
                import torch

                from ..harness.ceilings import measure_ceilings

                self.listener.progress("measuring the device's copy bandwidth and bf16 matmul rate")
                writer.set_ceilings(measure_ceilings(torch.cuda.current_device()).as_dict())
            self._run_harness(request, device, bench_plan, parity_plans, writer)
            for op, names, settings in launches:
                for name in names:
                    self.listener.progress(op.progress_text(name, settings))
                    rows, error = op.run_workload(name, device, writer.folder, settings)
                    for row in rows:
                        writer.add(row)
                    if error:
                        self.listener.error(error)

        folder = request.output.folder or _default_folder(request.verb, request.label)
        writer, interruption = self._recorded(folder, fingerprint(device, request.seed), request.verb, recorded, work)
        return _run_outcome(request.verb, folder, writer.rows, interruption)

    @staticmethod
    def _launch_settings(entry, device: str, request: RunRequest) -> dict[str, Any]:
        """A launched op's settings for one entry: its table's options, then the command line's
        (which win), and its -c where the op takes it (its ranks run only those)."""
        op = get_op(entry.op)
        given = {**entry.options, **{k: v for k, v in request.op_options.items() if k in op.options}}
        settings = op.settings(device, given, request.timing)
        if entry.candidates and "-c/--candidate" in op.takes:
            settings["candidates"] = [c for c in op.candidates if c in entry.candidates]
        return settings

    def _run_harness(self, request: RunRequest, device: str, bench_plan, parity_plans, writer) -> None:
        from ..harness.runner import run_benchmarks, run_parity

        if bench_plan:
            run_benchmarks(bench_plan, device, writer, timing=request.timing, telemetry=request.telemetry,
                           on_progress=self.listener.progress)
        for entry, items in parity_plans:
            run_parity(items, device, writer, steps=entry.steps, atol=entry.atol, rtol=entry.rtol,
                       detail=request.output.parity_detail, on_progress=self.listener.progress)
        if request.fsdp_nproc:
            from ..train.fsdp import parity_rows

            for entry in request.parity:
                for row in parity_rows(entry.op, device=device, nproc=request.fsdp_nproc, folder=writer.folder,
                                       candidates=entry.candidates, tags=entry.tags, models=entry.workloads,
                                       steps=entry.steps, seed=request.seed, detail=request.output.parity_detail,
                                       atol=entry.atol, rtol=entry.rtol, on_progress=self.listener.progress):
                    writer.add(row)

    # -- train ----------------------------------------------------------------------------------
    def train(self, request: TrainRequest) -> Outcome:
        """Trains the op's candidates and judges each against the reference's band; the
        outcome's ``detail`` is the :class:`kernelbench.train.TrainResult` (None if interrupted)."""
        from ..harness.envinfo import fingerprint
        from ..harness.runner import resolve_device
        from ..train import TrainSettings, resolve
        from ..train import train as run_training

        device = resolve_device(request.device)
        settings = TrainSettings.defaults(device, model=request.model, steps=request.steps, batch=request.batch,
                                          seq=request.seq, seed=request.seed, lr=request.lr, rtol=request.rtol,
                                          ref_seeds=request.ref_seeds, fsdp_nproc=request.fsdp_nproc,
                                          data=request.data)
        config = settings.validate()
        candidates = resolve(request.op, config, lr=request.lr, names=request.candidates, tags=request.tags)
        folder = request.output.folder or _default_folder("train", request.op)
        result = None

        def work(writer) -> None:
            nonlocal result
            result = run_training(request.op, candidates, settings, writer, folder, on_progress=self.listener.progress)

        writer, interruption = self._recorded(folder, fingerprint(device, settings.seed), "train", {}, work)
        outcome = Outcome("train", folder, writer.rows, detail=result)
        if interruption:
            outcome.status, outcome.interruption = Status.INTERRUPTED, interruption
            outcome.message = (f"interrupted by {interruption}: {folder} holds the losses logged until then "
                               "(run.json says \"interrupted\")")
        elif result.failures:
            outcome.status = Status.PARITY_FAILED
            outcome.message = "did not train like the reference: " + ", ".join(result.failures)
        elif result.band is None:
            outcome.status = Status.NOTHING_RAN
            outcome.message = "the reference could not run here, so nothing was judged (see its row)"
        return outcome

    # -- the report's lifecycle -----------------------------------------------------------------
    def _recorded(self, folder: Path, fingerprint: dict, verb: str, settings: dict[str, Any],
                  work: Callable[[Any], None]):
        """Runs ``work(writer)`` into a report at ``folder`` and closes it however the work ends:
        (writer, the signal that interrupted it or None). A UsageError found on the way is
        raised after the report closes; a folder it made and left empty is removed."""
        from ..report.writer import ReportWriter

        created = not folder.exists()
        outcome, interruption, usage_error = "failed", None, None
        with interrupts() as signals:
            try:
                writer = ReportWriter(folder, fingerprint, verb, settings=settings)
            except OSError as exc:
                raise UsageError(f"--output-dir {folder}: cannot write the report there "
                                 f"({exc.strerror or exc})") from None
            try:
                work(writer)
                outcome = "complete"
            except UsageError as exc:
                usage_error = exc
            except KeyboardInterrupt as exc:
                outcome, interruption = "interrupted", interruption_name(exc)
            finally:
                signals.stop()  # the work has ended: closing the report is not interrupted
                writer.close(outcome, interruption)
        if usage_error is not None:
            if created and not writer.rows:
                shutil.rmtree(folder, ignore_errors=True)
            raise usage_error
        return writer, interruption


@contextmanager
def _clock_lock(listener: Listener, wanted: bool, device: str) -> Iterator[str | None]:
    """--lock-clocks: the application clocks locked while the run measures and put back after
    it (on an interruption too); yields what was done, or None when not asked."""
    if not wanted:
        yield None
        return
    if device != "cuda":
        listener.warn("--lock-clocks: no GPU in this run, nothing to lock")
        yield "no GPU: nothing locked"
        return
    import torch

    from ..harness.gpustate import ApplicationClockLock

    index = torch.cuda.current_device()
    lock = ApplicationClockLock(str(getattr(torch.cuda.get_device_properties(index), "uuid", "")) or None, index)
    message = lock.acquire()
    (listener.note if lock.locked else listener.warn)(message)
    try:
        yield message
    finally:
        restored = lock.release()
        if restored:
            listener.note(restored)


def _default_folder(verb: str, label: str) -> Path:
    from ..report.writer import default_output_dir

    return default_output_dir(verb, label)


def _run_outcome(verb: str, folder: Path, rows: list[dict[str, Any]], interruption: str | None) -> Outcome:
    """How a run ended, from its rows: interrupted, a failed check (parity, or the check of a
    timed result), nothing could run, nothing was timed, or complete."""
    outcome = Outcome(verb, folder, rows)

    def failed(metric: str) -> list[str]:
        return [f"{r['op']}/{r['workload']}/{r['mode']}/{r['candidate']}" for r in rows
                if r["metric"] == metric and r["status"] in (FAIL, ERROR)]

    failures = {"parity failed": failed("parity"), "a timed result is not one": failed("output_check")}
    statuses = {r["status"] for r in rows}
    if interruption:
        outcome.status, outcome.interruption = Status.INTERRUPTED, interruption
        outcome.message = (f"interrupted by {interruption}: {folder} holds what was measured until then "
                           "(run.json says \"interrupted\")")
    elif any(failures.values()):
        outcome.status = Status.PARITY_FAILED
        outcome.message = "; ".join(f"{what}: {', '.join(names)}" for what, names in failures.items() if names)
    elif not statuses & set(_RAN):
        reasons = {f"{r['candidate']}: {str(r['message']).splitlines()[0] if r['message'] else r['status']}": None
                   for r in rows if r["status"] in (SKIPPED, ERROR)}
        outcome.status, outcome.reasons = Status.NOTHING_RAN, list(reasons)
        outcome.message = "no requested candidate could run here" + (" (reasons above)" if reasons else
                                                                      ": nothing was selected")
    elif not statuses & set(_TIMED):
        outcome.status = Status.NOTHING_MEASURED
        outcome.message = ("nothing was measured: the candidates that ran are Triton kernels in the interpreter "
                           "(no GPU), whose time is not measured; check their numerics with parity, time them on "
                           "a GPU")
    return outcome
