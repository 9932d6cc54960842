"""Drives ops' cases through timing, memory and parity, and emits one result row per metric.

The runner knows the :class:`~kernelbench.ops.base.Op` interface and nothing of any op. Rows go
to a ``sink`` (the report writer) as soon as they exist, so an interrupted run keeps them. One
candidate that raises, or runs out of memory, becomes an ``error`` row; the others still run.

Both parity and timing run the guards of :mod:`.guards`. Timing draws fresh inputs each round for
pure cases (functions of their inputs) and checks the timed candidate's result against the
reference after each round, so that a result that is not one (zeros, the input, an earlier
result, one finished on a side stream) is an ``output_check`` failure, not a fast time.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ..ops.base import Candidate, Op, Tolerance, UsageError, Workload
from . import slowdown
from .ceilings import CEILING_SLACK, Ceilings, measure_ceilings
from .gpustate import GpuProbe, GpuState, open_probe
from .guards import Call, observe, passthrough, stale, synchronize
from .memory import peak_memory_delta
from .parity import ParityTracker, TensorDiff, compare_tensors
from .rows import ERROR, FAIL, NOT_MEASURED, OK, PASS, ROW_FIELDS, SKIPPED, SUSPECT, RoundSamples, Row, RowSink
from .settings import DEFAULT_PARITY_DETAIL, PARITY_DETAIL
from .stats import Stats, summarize
from .timing import HOST_MODE, TimingConfig, time_cpu, time_cuda, time_host

__all__ = ["ERROR", "FAIL", "NOT_MEASURED", "OK", "PASS", "ROW_FIELDS", "SKIPPED", "SUSPECT", "PlanItem", "Row",
           "RowSink", "RunSummary", "resolve_device", "run_benchmarks", "run_parity"]


@dataclass
class PlanItem:
    """What to run for one op: these candidates on these workloads in these modes."""

    op: Op
    candidates: list[Candidate]
    workloads: list[Workload]
    modes: list[str]


@dataclass
class RunSummary:
    rows: int = 0
    measured: int = 0
    errors: int = 0
    skipped: int = 0
    parity_checks: int = 0
    parity_failures: int = 0
    failures: list[str] = field(default_factory=list)


def resolve_device(requested: str | None) -> str:
    """``cuda`` when a GPU is visible, else ``cpu``; an explicit request is honoured or refused."""
    if requested in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif requested in ("cpu", "cuda"):
        if requested == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
        device = requested
    else:
        raise UsageError(f"--device {requested}: accepted values are cpu, cuda, auto")
    if device == "cpu":
        # Triton kernels run in the interpreter without a GPU; this must be set before any
        # module defining a kernel is imported, i.e. before the first candidate is built.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return device


def _row(op: Op, workload: Workload, mode: str, candidate: str, metric: str, value, unit: str,
         status: str, message: str = "", flags: str = "", tensor: str = "") -> Row:
    cand = op.candidates.get(candidate)
    source = cand.source if cand is not None else op.source
    return Row(op.name, workload.name, mode, candidate, metric, value, unit, status, flags, tensor, message, source)


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "out of memory: " + str(exc).splitlines()[0]
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Emitter:
    def __init__(self, sink: RowSink, summary: RunSummary) -> None:
        self.sink, self.summary = sink, summary

    def __call__(self, row: Row) -> None:
        self.summary.rows += 1
        self.sink.add(row.as_dict())

    def samples(self, samples: RoundSamples) -> None:
        """Per-rep times go to sinks that keep them (the report writer); others see rows only."""
        add_round = getattr(self.sink, "add_round", None)
        if add_round is not None:
            add_round(samples)

    def count_check(self, op: Op, workload: Workload, mode: str, candidate: str, passed: bool) -> None:
        self.summary.parity_checks += 1
        if not passed:
            self.summary.parity_failures += 1
            self.summary.failures.append(f"{op.name}/{workload.name}/{mode}/{candidate}")

    def check_failed(self, op: Op, workload: Workload, mode: str, candidate: str, message: str) -> None:
        """A parity check that could not finish: an error row, counted as a failed check."""
        self.count_check(op, workload, mode, candidate, passed=False)
        self.summary.errors += 1
        self(_row(op, workload, mode, candidate, "parity", None, "", ERROR, message))


# ------------------------------------------------------------------------------------------------
# Benchmarks
# ------------------------------------------------------------------------------------------------


def cuda_probe() -> GpuProbe:
    """A reader of the current CUDA device's clocks, temperature, power and throttle reasons."""
    index = torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "") or None
    return open_probe(uuid, index)


def run_benchmarks(plan: Iterable[PlanItem], device: str, sink: RowSink, *,
                   timing: TimingConfig = TimingConfig(), rounds: int | None = None, telemetry: bool = False,
                   on_progress: Callable[[str], None] | None = None,
                   gpu_probe: GpuProbe | None = None) -> RunSummary:
    """Times every (candidate, workload, mode) of the plan; candidates of one workload are
    interleaved in ``rounds`` rounds (A B C A B C ...; default ``timing.rounds``) so drift hits
    them all alike. With ``telemetry``, cases that report telemetry (optimizers that offer it) add
    its rows. On CUDA the GPU's state is read over every round (``gpu_probe``, by default NVML or
    nvidia-smi), and a row timed while power or heat held the clocks down is flagged ``throttled``."""
    rounds = timing.rounds if rounds is None else rounds
    slowdown.parse(os.environ.get(slowdown.ENV, ""))  # a malformed test hook stops the run before it starts
    summary = RunSummary()
    emit = _Emitter(sink, summary)
    ceilings = measure_ceilings(torch.cuda.current_device()) if device == "cuda" else None
    own_probe = gpu_probe is None
    probe = (cuda_probe() if device == "cuda" else GpuProbe()) if own_probe else gpu_probe
    try:
        for item in plan:
            for workload in item.workloads:
                for mode in item.modes:
                    if on_progress:
                        on_progress(f"{item.op.name} {workload.name} {mode}")
                    _bench_group(item.op, item.candidates, workload, mode, device, timing, rounds,
                                 ceilings, telemetry, emit, summary, probe)
                    _free_memory()
    finally:
        if own_probe:
            probe.close()
    return summary


def _bench_group(op: Op, candidates: list[Candidate], workload: Workload, mode: str, device: str,
                 timing: TimingConfig, rounds: int, ceilings: Ceilings | None, telemetry: bool,
                 emit: _Emitter, summary: RunSummary, probe: GpuProbe | None = None) -> None:
    probe = probe or GpuProbe()
    cases, states, runs, delays = {}, {}, {}, {}
    for cand in candidates:
        unmet = cand.requires.unmet(device)
        if unmet:
            summary.skipped += 1
            emit(_row(op, workload, mode, cand.name, "time_median_ms", None, "ms", SKIPPED, unmet))
            continue
        if cand.requires.interpreted(device):
            emit(_row(op, workload, mode, cand.name, "time_median_ms", None, "ms", NOT_MEASURED,
                      "Triton interpreter (no GPU): checked by parity only, time not measured"))
            if telemetry:
                _interpreted_telemetry(op, cand, workload, device, mode, emit, summary)
            continue
        try:
            case = op.make_case(cand, workload, device, mode)
            # The first call (lazy state, compilation) runs while this case is the newest one
            # alive, so an allocator-based state size counts this candidate's memory only.
            case.prepare()
            case.run()
            states[cand.name] = case.state_bytes()
            cases[cand.name] = case
            runs[cand.name] = case.run
            fraction = slowdown.requested(op.name, workload.name, mode, cand.name)
            if fraction:
                runs[cand.name], delays[cand.name] = slowdown.slowed(case.run, case.prepare, fraction, device)
        except Exception as exc:  # one failing candidate must not stop the others
            summary.errors += 1
            emit(_row(op, workload, mode, cand.name, "time_median_ms", None, "ms", ERROR, _error_message(exc)))
            _free_memory()

    timer = time_cuda if device == "cuda" else time_cpu
    per_round = dataclasses.replace(
        timing, rep_ms=timing.rep_ms / rounds, rounds=1,
        min_reps=max(1, timing.min_reps // rounds), max_reps=max(1, timing.max_reps // rounds),
    )
    # Per candidate, each round's per-rep times and the GPU's state over that round.
    rounds_of: dict[str, list[tuple[list[float], GpuState | None]]] = {name: [] for name in cases}
    host: dict[str, list[float]] = {name: [] for name in cases}
    modes: dict[str, str] = {}
    # Workloads marked host_timing also time each call on the host, in the same interleaved
    # rounds, so that the host's drift hits every candidate alike.
    per_call: dict[str, list[list[float]] | str] | None = (
        {name: [] for name in cases} if workload.spec.get("host_timing") else None)
    checked = [name for name, case in cases.items() if getattr(case, "pure", False) and op.get_candidate(name).parity]
    check = _OutputCheck(op, workload, mode, device, rounds) if checked else None

    def drop(name: str, exc: Exception) -> None:
        """One failing candidate: its error row; the others go on."""
        summary.errors += 1
        emit(_row(op, workload, mode, name, "time_median_ms", None, "ms", ERROR, _error_message(exc)))
        del cases[name], rounds_of[name], host[name]
        _free_memory()

    settled = _settle(cases, runs, timer, per_round, timing.settle_ms, drop)
    for round_index in range(rounds):
        if check is not None:
            check.next_round(round_index)
        for name in list(cases):
            case = cases[name]
            try:
                if check is not None and name in checked and round_index:
                    case.set_step(check.timed_step(round_index))  # fresh inputs, drawn untimed
                token = probe.start()
                sample = timer(runs[name], case.prepare, per_round)
                rounds_of[name].append((sample.times, probe.finish(token)))
                host[name].append(sample.host_ms)
                modes[name] = sample.mode
                if check is not None and name in checked:
                    check.after_round(name, case, round_index)
            except Exception as exc:
                drop(name, exc)
                continue
            if per_call is not None and isinstance(per_call[name], list):
                try:
                    per_call[name].append(time_host(runs[name], case.prepare, per_round).times)
                except Exception as exc:  # the device rows stand; the host row says what failed
                    per_call[name] = _error_message(exc)

    if settled:
        modes = {name: f"{label}, after {settled} untimed settling rounds" for name, label in modes.items()}
    stats = {name: summarize([t for times, _ in rounds_of[name] for t in times], modes[name]) for name in cases}
    for name, case in cases.items():
        cand = op.get_candidate(name)
        summary.measured += 1
        host_ms = sorted(host[name])[len(host[name]) // 2]
        verdict = check.verdict(name) if check is not None and name in checked else None
        throttling = [f"round {i + 1}: {', '.join(gpu.throttled_by)}"
                      for i, (_, gpu) in enumerate(rounds_of[name]) if gpu is not None and gpu.throttled]
        anchor_name = op.anchor_for(name)
        anchor = None
        if anchor_name in stats and anchor_name != name:
            anchor = _Anchor(anchor_name, stats[anchor_name],
                             _round_ratios(rounds_of[name], rounds_of[anchor_name]))
        for row in _timing_rows(op, cand, workload, mode, stats[name], host_ms, anchor, ceilings, device,
                                throttling, delays.get(name)):
            if verdict is not None and not verdict.passed and row.metric in _TIME_METRICS:
                flags = ",".join(filter(None, [row.flags, "wrong-output"]))
                row = dataclasses.replace(row, status=SUSPECT, flags=flags,
                                          message="the timed calls' result is not one: " + verdict.findings[0])
            emit(row)
        if verdict is not None:
            emit(_row(op, workload, mode, name, "output_check", 1.0 if verdict.passed else 0.0, "",
                      PASS if verdict.passed else FAIL, verdict.message))
            if not verdict.passed:
                summary.failures.append(f"{op.name}/{workload.name}/{mode}/{name} (timed result)")
        for i, (times, gpu) in enumerate(rounds_of[name]):
            emit.samples(RoundSamples(op.name, workload.name, mode, name, "time_median_ms", i + 1, tuple(times), gpu))
        if per_call is not None:
            _host_row(op, workload, mode, name, per_call[name], emit, summary)
        # Figures only the case can give (a model step's throughput, its optimizer's share).
        for metric, value, unit, message in getattr(case, "extra_rows", lambda _: [])(stats[name].median):
            emit(_row(op, workload, mode, name, metric, value, unit, OK, message))
        try:
            if device == "cuda":
                peak = peak_memory_delta(case.run, case.prepare)
                emit(_row(op, workload, mode, name, "peak_mem_delta_bytes", peak, "B", OK,
                          "allocator peak during one call minus what was allocated before it"))
            state = states.get(name)
            if state is not None:
                emit(_row(op, workload, mode, name, "state_bytes", state.nbytes, "B",
                          OK if state.trusted else SUSPECT, state.how))
            if telemetry:
                for row in _telemetry_rows(op, workload, mode, name, case):
                    emit(row)
        except Exception as exc:
            summary.errors += 1
            emit(_row(op, workload, mode, name, "peak_mem_delta_bytes", None, "B", ERROR, _error_message(exc)))
    cases.clear()


# A bound on settling rounds, for calls that take (or a timer that reports) no time.
MAX_SETTLE_ROUNDS = 100


def _settle(cases: dict, runs: dict[str, Callable[[], None]], timer: Callable, per_round: TimingConfig,
            settle_ms: float, drop: Callable[[str, Exception], None]) -> int:
    """Untimed rounds, interleaved as the timed ones, until the candidates have run ``settle_ms``
    between them; returns how many. From idle, a GPU at its power cap runs its first second or two
    faster, then slower: timed at once, that favours the first candidate of the first rounds and
    penalises the next (results/2026-11-29-2xh200-grid-settle)."""
    spent, done = 0.0, 0
    while cases and spent < settle_ms and done < MAX_SETTLE_ROUNDS:
        done += 1
        for name in list(cases):
            try:
                spent += sum(timer(runs[name], cases[name].prepare, per_round).times)
            except Exception as exc:
                drop(name, exc)
    return done


_TIME_METRICS = ("time_median_ms", "gbps", "pct_copy_bw", "tflops", "pct_matmul", "ratio_vs_anchor",
                 "ratio_round_min", "ratio_round_max")
STRADDLES = "straddles-1.0"


@dataclass(frozen=True)
class _Anchor:
    """The candidate a row's time is divided by, its stats, and the ratio of each round's medians."""

    name: str
    stats: Stats
    round_ratios: tuple[float, ...]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _round_ratios(rounds: list[tuple[list[float], GpuState | None]],
                  anchor_rounds: list[tuple[list[float], GpuState | None]]) -> tuple[float, ...]:
    """Per interleaved round, this candidate's median over the anchor's: their spread says
    whether the overall ratio is decided or moves around 1.0 with the machine's drift."""
    return tuple(_median(times) / _median(ref) for (times, _), (ref, _) in zip(rounds, anchor_rounds)
                 if times and ref and _median(ref) > 0)


@dataclasses.dataclass
class _Verdict:
    passed: bool
    findings: list[str]
    message: str


class _OutputCheck:
    """After each timing round, one more (untimed) call of each checked candidate on inputs it has
    not been timed on, its result compared with the reference's for them. It fails on what only a
    result that is not one does: no better than zeros, the input returned, the result of the
    inputs timed before (a cache), results finished on another stream (the buffer a new result
    lands in then still holds an earlier one), inputs overwritten. A result merely outside the op's
    tolerance is noted and left to parity, which judges tolerances.

    Round r times the inputs of step 2r (fresh each round) and checks on those of step 2r + 1."""

    def __init__(self, op: Op, workload: Workload, mode: str, device: str, rounds: int) -> None:
        self.op, self.workload, self.mode, self.device, self.rounds = op, workload, mode, device, rounds
        self.reference = None
        self.unavailable = ""
        self.timed_ref: dict | None = None
        self.checked_ref: dict | None = None
        self.findings: dict[str, list[str]] = {}
        self.outside: dict[str, set[str]] = {}
        try:
            self.reference = op.make_reference_case(workload, device, mode)
        except Exception as exc:  # the times stand; the row says why they were not checked
            self.unavailable = f"reference failed to build: {_error_message(exc)}"

    @staticmethod
    def timed_step(round_index: int) -> int:
        return 2 * round_index

    def next_round(self, round_index: int) -> None:
        """The reference's results for this round's timed and checked inputs."""
        self.timed_ref = self.checked_ref = None
        if self.reference is None:
            return
        try:
            # Each call makes new tensors, so the first round's results stay as they are.
            self.timed_ref = self._reference_at(self.timed_step(round_index))
            self.checked_ref = self._reference_at(self.timed_step(round_index) + 1)
        except Exception as exc:
            self.reference, self.timed_ref, self.checked_ref = None, None, None
            self.unavailable = f"reference failed at round {round_index}: {_error_message(exc)}"

    def _reference_at(self, step: int) -> dict:
        self.reference.set_step(step)
        self.reference.prepare()
        self.reference.run()
        synchronize(self.device)
        return self.reference.tensors()

    def after_round(self, name: str, case, round_index: int) -> None:
        findings = self.findings.setdefault(name, [])
        self.outside.setdefault(name, set())
        if self.checked_ref is None:
            return
        cand = self.op.get_candidate(name)
        case.set_step(self.timed_step(round_index) + 1)
        case.prepare()
        call = observe(case, self.device)
        diffs = self._compare(cand, self.checked_ref, call.tensors)
        new = list(call.findings) + passthrough(call, diffs)
        if any(not d.passed for d in diffs.values()):
            new += stale(diffs, self._compare(cand, self.timed_ref, call.tensors))
        new += [f"'{n}': {d.why}" for n, d in diffs.items() if not d.beats_zero or d.nan_mismatch]
        for text in new:
            if text not in findings:
                findings.append(f"round {round_index}: {text}")
        self.outside[name] |= {n for n, d in diffs.items() if not d.passed}

    def _compare(self, cand: Candidate, ref: dict, tensors: dict) -> dict[str, TensorDiff]:
        out = {}
        for tensor, value in tensors.items():
            r = ref.get(tensor)
            if r is None or r.shape != value.shape:
                continue
            tol = self.op.tolerance_for(cand, value.dtype, tensor)
            out[tensor] = compare_tensors(tensor, r, value, tol.atol, tol.rtol, tol.fro)
        return out

    def verdict(self, name: str) -> _Verdict:
        if self.unavailable and not self.findings.get(name):
            return _Verdict(True, [], f"not checked: {self.unavailable}")
        findings = self.findings.get(name, [])
        fresh = f"fresh inputs each of {self.rounds} rounds" if self.rounds > 1 else "one round"
        what = (f"{fresh}; after each, one more call on other inputs, its result read after a device "
                "synchronisation and checked against the reference")
        if findings:
            return _Verdict(False, findings, f"{what}: " + "; ".join(findings))
        outside = sorted(self.outside.get(name, ()))
        note = (f"; outside the op's tolerance for {', '.join(outside)} on these inputs (parity judges tolerances)"
                if outside else "")
        return _Verdict(True, [], what + ": a result of its inputs" + note)


def _host_row(op: Op, workload: Workload, mode: str, name: str, rounds: list[list[float]] | str,
              emit: _Emitter, summary: RunSummary) -> None:
    """Per-call host time (workloads marked ``host_timing``: inputs so small that the host, not
    the GPU, decides the speed), beside the device time of the same candidate; ``rounds``: each
    round's times, or the error that stopped them."""
    if isinstance(rounds, str) or not rounds:
        summary.errors += 1
        emit(_row(op, workload, mode, name, "host_per_call_ms", None, "ms", ERROR,
                  rounds or "no host time measured"))
        return
    st = summarize([t for times in rounds for t in times], HOST_MODE)
    emit(_row(op, workload, mode, name, "host_per_call_ms", st.median, "ms", OK,
              f"{HOST_MODE}; median of {st.reps} over interleaved rounds, IQR/median {st.relative_iqr:.1%}"))
    for i, times in enumerate(rounds):
        emit.samples(RoundSamples(op.name, workload.name, mode, name, "host_per_call_ms", i + 1, tuple(times)))


def _interpreted_telemetry(op: Op, cand: Candidate, workload: Workload, device: str, mode: str,
                           emit: _Emitter, summary: RunSummary) -> None:
    """Telemetry needs no timing: one untimed step in the interpreter gives it."""
    try:
        case = op.make_case(cand, workload, device, mode)
        case.prepare()
        case.run()
        for row in _telemetry_rows(op, workload, mode, cand.name, case):
            emit(row)
    except Exception as exc:
        summary.errors += 1
        emit(_row(op, workload, mode, cand.name, "telemetry", None, "", ERROR, _error_message(exc)))


def _telemetry_rows(op: Op, workload: Workload, mode: str, name: str, case) -> list[Row]:
    """Rows of a case's telemetry after the timed steps: {tensor: {key: value}} where numbers
    (0-d tensors included) become values and strings (e.g. a state dtype) the message."""
    report = case.telemetry() if hasattr(case, "telemetry") else None
    rows = []
    for tensor, entry in (report or {}).items():
        text = "; ".join(f"{k}={v}" for k, v in entry.items() if isinstance(v, str))
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                value = float(value.detach().float().max())
            if isinstance(value, (int, float)):
                rows.append(_row(op, workload, mode, name, f"telemetry_{key}", value, "", OK,
                                 text or "last timed step", tensor=tensor))
    return rows


# A call whose enqueueing (from an empty launch queue) takes the host at least this share of the
# device time may have kept the GPU waiting for launches (the L2 flush before it gives the host a
# head start of its own duration): its figure may include launch overhead, as do_bench's would.
HOST_BOUND_SHARE = 0.7


def _timing_rows(op: Op, cand: Candidate, workload: Workload, mode: str, st: Stats, host_ms: float,
                 anchor: _Anchor | None, ceilings: Ceilings | None, device: str,
                 throttling: list[str] | None = None, test_delay_ms: float | None = None) -> list[Row]:
    flags = ["noisy"] if st.noisy else []
    ratios = anchor.round_ratios if anchor is not None else ()
    straddles = len(ratios) > 1 and min(ratios) < 1.0 < max(ratios)
    if straddles:
        flags.append(STRADDLES)
    host_bound = device == "cuda" and host_ms >= HOST_BOUND_SHARE * st.median
    if host_bound:
        flags.append("host-bound")
    if throttling:
        flags.append("throttled")
    if test_delay_ms is not None:
        flags.append("test-slowdown")
    nbytes = op.bytes_moved(workload, cand, mode)
    if device == "cuda" and nbytes is not None:
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        if nbytes < l2:
            flags.append("fits-in-L2")
    flag_text = ",".join(flags)
    noise = f"IQR/median {st.relative_iqr:.1%}" + (" > 10%: noisy" if st.noisy else "")
    if throttling:
        noise += "; clocks held down by power or heat: " + "; ".join(throttling)
    name = cand.name
    rows = [
        _row(op, workload, mode, name, "time_median_ms", st.median, "ms", OK, f"{st.mode}; {noise}", flag_text),
        _row(op, workload, mode, name, "time_p25_ms", st.p25, "ms", OK),
        _row(op, workload, mode, name, "time_p75_ms", st.p75, "ms", OK),
        _row(op, workload, mode, name, "time_iqr_ms", st.iqr, "ms", OK),
        _row(op, workload, mode, name, "time_min_ms", st.min, "ms", OK),
        _row(op, workload, mode, name, "reps", st.reps, "", OK),
    ]
    if test_delay_ms is not None:
        rows.append(_row(op, workload, mode, name, "test_slowdown_ms", test_delay_ms, "ms", OK,
                         f"{slowdown.ENV}: idle work of this length followed every timed call (a test, not a result)",
                         "test-slowdown"))
    if device == "cuda":
        rows.append(_row(op, workload, mode, name, "host_enqueue_ms", host_ms, "ms", OK,
                         "median host time to enqueue one call, from an empty launch queue" + (
                             f" (>= {HOST_BOUND_SHARE:.0%} of the device time: launch overhead may be in the figure)"
                             if host_bound else "")))
    if anchor is not None:
        spread = (f"; per round {min(ratios):.3f}..{max(ratios):.3f} over {len(ratios)} rounds"
                  + (": straddles 1.0, faster in some rounds and slower in others" if straddles else "")
                  if ratios else "")
        rows.append(_row(op, workload, mode, name, "ratio_vs_anchor", st.median / anchor.stats.median, "x", OK,
                         f"median / median of {anchor.name} in the same run (below 1: faster){spread}",
                         STRADDLES if straddles else ""))
        if ratios:
            for metric, value in (("ratio_round_min", min(ratios)), ("ratio_round_max", max(ratios))):
                rows.append(_row(op, workload, mode, name, metric, value, "x", OK,
                                 f"of the per-round ratios of medians to {anchor.name}"))
    seconds = st.median * 1e-3
    nflops = op.flops(workload, cand, mode)
    if nbytes is not None and seconds > 0:
        rows += _roofline_rows(op, workload, mode, name, nbytes / seconds / 1e9, "gbps", "GB/s",
                               ceilings.copy_gbps if ceilings else None, "pct_copy_bw", "copy bandwidth")
    if nflops is not None and seconds > 0:
        rows += _roofline_rows(op, workload, mode, name, nflops / seconds / 1e12, "tflops", "TFLOP/s",
                               ceilings.matmul_tflops if ceilings else None, "pct_matmul", "bf16 matmul rate")
    return rows


def _roofline_rows(op, workload, mode, name, value, metric, unit, ceiling, pct_metric, what) -> list[Row]:
    """The rate, and its share of the ceiling measured in this run; above the ceiling it is a
    measurement error (cached data, unwritten output, a wrong model), flagged, never a win."""
    if ceiling is None:
        return [_row(op, workload, mode, name, metric, value, unit, OK)]
    status, message, flags = OK, "", ""
    if value > ceiling * CEILING_SLACK:
        status, flags = SUSPECT, "above-ceiling"
        message = (f"above the measured {what} ({ceiling:.0f} {unit}): a measurement error "
                   "(cached data, unwritten output or a wrong bytes/FLOP model), not a win")
    return [_row(op, workload, mode, name, metric, value, unit, status, message, flags),
            _row(op, workload, mode, name, pct_metric, 100 * value / ceiling, "%", status, message, flags)]


# ------------------------------------------------------------------------------------------------
# Parity
# ------------------------------------------------------------------------------------------------

PARITY_METRICS = (("max_abs", "parity_max_abs"), ("max_rel", "parity_max_rel"),
                  ("mean_abs", "parity_mean_abs"), ("rel_fro", "parity_rel_fro"),
                  ("n_outside", "parity_n_outside"), ("nan_mismatch", "parity_nan_mismatch"))
# Per-tensor rows of a check: every failing tensor plus the few worst passing ones by each of
# these measures ("worst"), or every tensor ("full"); a model has hundreds of tensors.
WORST_TENSORS = 3


def run_parity(plan: Iterable[PlanItem], device: str, sink: RowSink, *, steps: int,
               atol: float | None = None, rtol: float | None = None, detail: str = DEFAULT_PARITY_DETAIL,
               on_progress: Callable[[str], None] | None = None) -> RunSummary:
    """Runs the reference and every runnable candidate from identical seeded inputs for
    ``steps`` steps (optimizers: the same gradient stream; functions: fresh inputs per step)
    and compares every named tensor after each step."""
    if steps < 1:
        raise UsageError(f"--steps {steps}: must be at least 1")
    if detail not in PARITY_DETAIL:
        raise UsageError(f"--parity-detail {detail}: accepted: {', '.join(PARITY_DETAIL)}")
    summary = RunSummary()
    emit = _Emitter(sink, summary)
    override = None
    if atol is not None or rtol is not None:
        override = Tolerance(atol if atol is not None else 0.0, rtol if rtol is not None else 0.0,
                             reason="--atol/--rtol given on the command line")
    for item in plan:
        for workload in item.workloads:
            for mode in item.modes:
                if on_progress:
                    on_progress(f"parity {item.op.name} {workload.name} {mode}")
                _parity_group(item.op, item.candidates, workload, mode, device, steps, override, emit, summary,
                              detail)
                _free_memory()
    return summary


def _parity_group(op: Op, candidates: list[Candidate], workload: Workload, mode: str, device: str,
                  steps: int, override: Tolerance | None, emit: _Emitter, summary: RunSummary,
                  detail: str = DEFAULT_PARITY_DETAIL) -> None:
    def fail_all(message: str) -> None:
        for cand in runnable:
            emit.check_failed(op, workload, mode, cand.name, message)

    runnable = []
    for cand in candidates:
        if not cand.parity or cand.name == op.reference:
            continue  # an anchor computing something else, or the reference itself
        unmet = cand.requires.unmet(device)
        if unmet:
            summary.skipped += 1
            emit(_row(op, workload, mode, cand.name, "parity", None, "", SKIPPED, unmet))
        else:
            runnable.append(cand)
    if not runnable:
        return
    ref_name = op.reference if isinstance(op.reference, str) else "reference"
    try:
        reference = op.make_reference_case(workload, device, mode)
    except Exception as exc:
        fail_all(f"reference {ref_name} failed to build: {_error_message(exc)}")
        return
    cases, trackers = {}, {}
    for cand in runnable:
        try:
            cases[cand.name] = op.make_case(cand, workload, device, mode)
            trackers[cand.name] = CandidateTracker(op, cand, override)
        except Exception as exc:
            emit.check_failed(op, workload, mode, cand.name, _error_message(exc))
    previous_ref = None
    for step in range(steps):
        try:
            reference.set_step(step)
            reference.prepare()
            reference.run()
            synchronize(device)
            ref_tensors = reference.tensors()
        except Exception as exc:
            cases.clear()
            fail_all(f"reference {ref_name} failed at step {step}: {_error_message(exc)}")
            return
        for name in list(cases):
            case = cases[name]
            try:
                case.set_step(step)
                case.prepare()
                call = observe(case, device)
                stale_ref = previous_ref if getattr(case, "pure", False) else None
                trackers[name].update(step, ref_tensors, call, stale_ref)
            except Exception as exc:
                emit.check_failed(op, workload, mode, name, f"step {step}: {_error_message(exc)}")
                del cases[name]
        # A pure case's results depend on this step's inputs only, so the last step's reference
        # tells a cached result from a wrong one (the next step makes new tensors: these stay).
        previous_ref = ref_tensors
    for name in cases:
        tracker = trackers[name]
        emit.count_check(op, workload, mode, name, tracker.passed)
        for row in parity_rows(op, workload, mode, name, ref_name, tracker, steps, detail):
            emit(row)


def _finite(value) -> float:
    """Ranks NaN / inf first among the worst (they are the tensors a reader needs to see)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return float("inf") if value != value else value


class CandidateTracker:
    """One ParityTracker per tolerance, since a bf16 state tensor, an fp32 param and a reduced
    gradient of the same candidate can be held to different tolerances."""

    def __init__(self, op: Op, cand: Candidate, override: Tolerance | None) -> None:
        self.op, self.cand, self.override = op, cand, override
        self.by_tolerance: dict[Tolerance, ParityTracker] = {}
        self.findings: list[tuple[int, str]] = []  # (step, what a guard found), each text once

    def tolerance(self, dtype: torch.dtype, tensor: str) -> Tolerance:
        return self.override or self.op.tolerance_for(self.cand, dtype, tensor)

    def update(self, step: int, ref: dict, call: Call | dict, previous_ref: dict | None = None) -> None:
        """Compares one step's results (a guarded :class:`Call`, or bare tensors) with the reference's."""
        cand = call.tensors if isinstance(call, Call) else call
        groups: dict[Tolerance, dict] = {}
        for name, t in cand.items():
            groups.setdefault(self.tolerance(t.dtype, name), {})[name] = t
        diffs: dict[str, TensorDiff] = {}
        for tol, tensors in groups.items():
            tracker = self.by_tolerance.get(tol)
            if tracker is None:
                tracker = self.by_tolerance[tol] = ParityTracker(tol.atol, tol.rtol, tol.fro)
            diffs.update(tracker.update(step, ref, tensors))
        if not isinstance(call, Call):
            return
        found = list(call.findings) + passthrough(call, diffs)
        if previous_ref is not None and any(not d.passed for d in diffs.values()):
            before = {}
            for name, t in cand.items():
                r = previous_ref.get(name)
                if r is not None and r.shape == t.shape:
                    tol = self.tolerance(t.dtype, name)
                    before[name] = compare_tensors(name, r, t, tol.atol, tol.rtol, tol.fro)
            found += stale(diffs, before)
        known = {text for _, text in self.findings}
        self.findings += [(step, text) for text in found if text not in known]

    @property
    def tensors(self):
        for tol, tracker in self.by_tolerance.items():
            for entry in tracker.tensors.values():
                yield tol, entry

    @property
    def not_compared(self) -> set[str]:
        return set().union(*(t.not_compared for t in self.by_tolerance.values())) if self.by_tolerance else set()

    @property
    def passed(self) -> bool:
        entries = list(self.tensors)
        return bool(entries) and all(e.passed for _, e in entries) and not self.findings


def parity_rows(op: Op, workload: Workload, mode: str, name: str, ref_name: str,
                 tracker: CandidateTracker, steps: int, detail: str = DEFAULT_PARITY_DETAIL) -> list[Row]:
    rows = []
    failing = []
    entries = list(tracker.tensors)
    shown = {id(e) for _, e in entries if detail == "full" or not e.passed}
    for attr in ("rel_fro", "max_abs", "max_rel"):
        ranked = sorted(entries, key=lambda te: -_finite(getattr(te[1].worst, attr)))
        shown.update(id(e) for _, e in ranked[:WORST_TENSORS])
    for step, finding in tracker.findings:
        rows.append(_row(op, workload, mode, name, "parity_guard", step, "step", FAIL, finding))
    for tol, entry in tracker.tensors:
        status = PASS if entry.passed else FAIL
        if not entry.passed:
            failing.append(f"{entry.name} (step {entry.first_failed_step}: {entry.first_failure})")
        tol_text = (f"rel Frobenius <= {tol.fro:g}" if tol.fro is not None
                    else f"atol {tol.atol:g}, rtol {tol.rtol:g}")
        if tol.reason:
            tol_text += f" ({tol.reason})"
        if id(entry) not in shown:
            continue
        worst = entry.worst
        for attr, metric in PARITY_METRICS:
            rows.append(_row(op, workload, mode, name, metric, getattr(worst, attr), "", status,
                             tol_text, tensor=entry.name))
        if not entry.passed:
            rows.append(_row(op, workload, mode, name, "parity_first_failed_step",
                             entry.first_failed_step, "step", status, tol_text, tensor=entry.name))
    compared = len(entries)
    message = f"{compared} tensors vs {ref_name} over {steps} step(s)"
    if detail != "full" and len(shown) < compared:
        message += (f"; per-tensor rows for the failing and the {WORST_TENSORS} worst by each measure "
                    f"({len(shown)} of {compared}; --parity-detail full for all)")
    if tracker.findings:
        message = ("; ".join(f"step {step}: {text}" for step, text in tracker.findings[:3])
                   + (" ..." if len(tracker.findings) > 3 else "") + "; " + message)
    if failing:
        message += "; failing: " + ", ".join(failing[:8]) + (" ..." if len(failing) > 8 else "")
    if tracker.not_compared:
        names = sorted(tracker.not_compared)
        message += "; not compared (absent from the reference or another shape): " + ", ".join(names[:6])
        message += " ..." if len(names) > 6 else ""
    if compared == 0:
        message = f"no tensor in common with {ref_name}: nothing was compared"
    worst_rel = max((e.worst.max_rel for _, e in tracker.tensors), default=None)
    rows.append(_row(op, workload, mode, name, "parity", 1.0 if tracker.passed else 0.0, "",
                     PASS if tracker.passed else FAIL, message))
    if worst_rel is not None:
        rows.append(_row(op, workload, mode, name, "parity_worst_max_rel", worst_rel, "",
                         PASS if tracker.passed else FAIL, "largest max_rel over all tensors and steps"))
    return rows
