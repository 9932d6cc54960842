"""``kernelbench train``: the reference with several data orders, then every candidate, then the verdicts.

Writes into the report folder, beside the rows it sends to ``sink`` (the report writer):
``losses.csv`` (one line per step, candidate and data-order seed, appended after each run) and
``train.json`` (the settings, the data's loss floor, the band and each candidate's verdict).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..harness.rows import ERROR, FAIL, NOT_MEASURED, OK, PASS, SKIPPED, Row, RowSink
from ..harness.runner import _error_message
from ..models import CONFIGS, LlamaConfig
from ..models.grid import model_config
from ..ops.base import UsageError, unknown_name_error
from . import fsdp
from .band import Band, StepBand, Verdict, judge, make_band, step_band, tail_window
from .data import DATA_SETS, ChainStats, SlowChainStats, make_stream
from .loop import ROLE_ANCHOR, ROLE_REFERENCE, RunLog, TrainCandidate, initial_state, train_run

LOSSES_CSV, TRAIN_JSON = "losses.csv", "train.json"
LOSS_COLUMNS = ("step", "candidate", "seed", "loss", "grad_norm", "step_ms")
MODE = "train"


# slow-chain's GPU default: llama-7m's layers over 512 tokens at lag 32, where official adam-mini first
# learns the chain at step 126-520 in 13 of 15 seeds; llama-7m's 4096 tokens take 450 steps to never in
# 1000 (results/2026-11-27-adam-mini-slow-chain-seeds).
SLOW_CHAIN_GPU_MODEL = "hidden=256,layers=6,heads=8,kv_heads=4,intermediate=768,vocab=512"


@dataclass(frozen=True)
class TrainSettings:
    model: str
    steps: int
    batch: int
    seq: int
    seed: int = 0
    lr: float | None = None
    rtol: float = 0.01
    ref_seeds: int = 3
    clip: float = 1.0
    successors: int = 8
    device: str = "cpu"
    data: str = "markov"  # the token stream: a key of kernelbench.train.data.DATA_SETS
    fsdp_nproc: int | None = None  # train every run with the model under FSDP2 on this many ranks

    @classmethod
    def defaults(cls, device: str, **given) -> TrainSettings:
        """The default model and sizes of a device (the GPU one, or a seconds-long CPU one),
        overridden by whatever is given (None means not given)."""
        if device == "cuda" and given.get("data") == "slow-chain":
            base = dict(model=SLOW_CHAIN_GPU_MODEL, steps=800, batch=32, seq=64)
        elif device == "cuda":
            base = dict(model="llama-7m", steps=500, batch=32, seq=256)
        else:
            base = dict(model="llama-tiny", steps=20, batch=4, seq=32)
        base.update({k: v for k, v in given.items() if v is not None})
        if given.get("seq") is None and base["model"] in CONFIGS:  # a default fits any model
            base["seq"] = min(base["seq"], CONFIGS[base["model"]].max_seq)
        return cls(device=device, **base)

    def validate(self) -> LlamaConfig:
        try:
            config = model_config(self.model)
        except ValueError as exc:
            raise UsageError(f"--model: {exc}") from None
        for name in ("steps", "batch", "seq", "ref_seeds"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.seq > config.max_seq:
            raise UsageError(f"--seq {self.seq}: model {self.model} takes at most {config.max_seq} positions")
        if self.rtol < 0:
            raise UsageError(f"--rtol {self.rtol}: must be >= 0")
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"--lr {self.lr}: must be > 0")
        if self.data not in DATA_SETS:
            raise unknown_name_error("data set", self.data, DATA_SETS)
        if self.data == "slow-chain" and self.seq < 2:
            raise UsageError(f"--seq {self.seq}: the slow chain needs at least 2 positions")
        if not 1 <= self.successors <= config.vocab_size:
            raise UsageError(f"successors {self.successors}: must be in [1, {config.vocab_size}]")
        return config


@dataclass
class Outcome:
    name: str
    role: str
    status: str  # pass / fail / error / skipped / ok (anchors)
    message: str
    log: RunLog | None = None
    verdict: Verdict | None = None


@dataclass
class TrainResult:
    settings: TrainSettings
    stats: ChainStats | SlowChainStats
    band: Band | None
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0  # every run, the reference's seeds included, and the data set-up

    @property
    def failures(self) -> list[str]:
        return [o.name for o in self.outcomes if o.status in (FAIL, ERROR)]

    @property
    def ran(self) -> int:
        return sum(o.log is not None for o in self.outcomes)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


class _Files:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.losses = self.folder / LOSSES_CSV
        pd.DataFrame(columns=list(LOSS_COLUMNS)).to_csv(self.losses, index=False)

    def add_run(self, log: RunLog) -> None:
        steps = len(log.losses)
        frame = pd.DataFrame({
            "step": np.arange(steps), "candidate": log.candidate, "seed": log.order_seed,
            "loss": log.losses, "grad_norm": log.grad_norms,
            "step_ms": log.step_ms if log.step_ms is not None else np.full(steps, np.nan),
        })
        frame.to_csv(self.losses, mode="a", header=False, index=False)

    def write_json(self, doc: dict) -> None:
        (self.folder / TRAIN_JSON).write_text(json.dumps(doc, indent=1, default=str))


def train(op_label: str, candidates: Sequence[TrainCandidate], settings: TrainSettings, sink: RowSink,
          folder: Path, *, on_progress: Callable[[str], None] | None = None) -> TrainResult:
    """Trains ``candidates[0]`` (the reference) with ``settings.ref_seeds`` data orders, then
    every other candidate with its own order seed (0 unless set), and judges each against the band.

    On the CPU the runs use one intra-op thread: the CPU configuration is tiny, and more threads
    only wait on each other (10-100x slower steps on a shared machine)."""
    import torch

    if settings.device != "cpu":
        return _train(op_label, candidates, settings, sink, folder, on_progress)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(op_label, candidates, settings, sink, folder, on_progress)
    finally:
        torch.set_num_threads(threads)


def _train(op_label, candidates, settings, sink, folder, on_progress) -> TrainResult:
    config = settings.validate()
    reference = candidates[0]
    if reference.role != ROLE_REFERENCE:
        raise ValueError("the first train candidate must be the reference")
    progress = on_progress or (lambda text: None)
    device = settings.device
    files = _Files(folder)
    started = time.perf_counter()
    window = tail_window(settings.steps)
    progress("sampling the token stream on the device")
    stream = make_stream(settings.data, config.vocab_size, n_sequences=settings.steps * settings.batch,
                         seq=settings.seq, seed=settings.seed, successors=settings.successors, device=device)
    init = initial_state(config, settings.seed, device)
    result = TrainResult(settings, stream.stats, None)

    sources = {c.name: c.source for c in candidates}

    def row(name: str, metric: str, value, unit: str, status: str, message: str = "") -> None:
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        sink.add(Row(op_label, settings.model, mode, name, metric, value, unit, status, message=message,
                     source=sources.get(name, "kernelbench")).as_dict())

    sharded_logs = None
    mode = f"{MODE}, fsdp {settings.fsdp_nproc} ranks" if settings.fsdp_nproc else MODE
    if settings.fsdp_nproc:
        # The candidates' runs in one launch of ranks. The reference makes the band on one device, in a
        # launch of one rank that sees one GPU: sharding changes no step's math, a plain-PyTorch
        # reference need not take DTensors, and official adam-mini takes the GPU count for its world.
        runs = [(c.name, c.order_seed) for c in candidates[1:] if not c.requires.unmet(device)]
        progress(f"train {op_label} under FSDP2 on {settings.fsdp_nproc} ranks: {len(runs)} runs, "
                 f"{settings.steps} steps each; the reference on one device")
        sharded_logs = fsdp.train_logs(op_label, runs, settings, folder) if runs else {}
        if not reference.requires.unmet(device):
            sharded_logs.update(fsdp.train_logs(op_label, [(reference.name, s) for s in range(settings.ref_seeds)],
                                                settings, folder, unsharded=True))

    def run(cand: TrainCandidate, order_seed: int) -> RunLog:
        if sharded_logs is not None:
            log = sharded_logs[(cand.name, order_seed)]
            if isinstance(log, str):
                raise RuntimeError(log)
        else:
            progress(f"train {op_label}: {cand.name} (data order {order_seed}), {settings.steps} steps")
            log = train_run(cand, config, init, stream, steps=settings.steps, batch=settings.batch, device=device,
                            clip=settings.clip, order_seed=order_seed)
        files.add_run(log)
        return log

    def skip_or_error(cand: TrainCandidate, status: str, message: str) -> None:
        result.outcomes.append(Outcome(cand.name, cand.role, status, message))
        row(cand.name, "parity", None, "", status, message)

    unmet = reference.requires.unmet(device)
    ref_logs: list[RunLog] = []
    if unmet:
        skip_or_error(reference, SKIPPED, f"reference {reference.name} cannot run here: {unmet}")
    else:
        try:
            ref_logs = [run(reference, s) for s in range(settings.ref_seeds)]
            band = make_band([log.losses for log in ref_logs], settings.rtol, window)
        except Exception as exc:  # the reference's failure is every candidate's error
            skip_or_error(reference, ERROR, f"reference {reference.name} did not train: {_error_message(exc)}")
            ref_logs = []
        else:
            result.band = band
    per_step = step_band([log.losses for log in ref_logs], settings.rtol, window) if result.band else None

    def judged(cand: TrainCandidate, log: RunLog) -> None:
        outcome = _judge(cand, log, result.band, per_step, window, settings, stream.stats)
        result.outcomes.append(outcome)
        _emit_rows(row, cand, outcome, settings)

    if result.band:
        judged(reference, ref_logs[0])
    for cand in candidates[1:]:
        unmet = cand.requires.unmet(device)
        if unmet:
            skip_or_error(cand, SKIPPED, unmet)
        elif not result.band:
            ref_skipped = result.outcomes[0].status == SKIPPED
            skip_or_error(cand, SKIPPED if ref_skipped else ERROR, "no band: the reference "
                          + ("cannot run here" if ref_skipped else "did not train") + " (see its row)")
        else:
            try:
                log = run(cand, cand.order_seed)
            except Exception as exc:  # one candidate's crash is its own error row
                skip_or_error(cand, ERROR, _error_message(exc))
            else:
                judged(cand, log)
    result.wall_s = time.perf_counter() - started
    files.write_json(_train_doc(op_label, settings, config, stream, result, window, candidates))
    return result


def _judge(cand: TrainCandidate, log: RunLog, band: Band, per_step: StepBand, window: int,
           settings: TrainSettings, stats: ChainStats | SlowChainStats) -> Outcome:
    v = judge(log.losses, band, per_step, window)
    band_text = (f"reference {band.mean:.4f} +- {band.half_width:.4f} (seed spread {band.spread:.4f} "
                 f"+ rtol {settings.rtol:g})")
    if v.first_outside is None:
        where = "in the band at every step"
    elif v.left_band is None:
        where = (f"running loss outside the band at {v.steps_outside} step(s) from step {v.first_outside}, "
                 f"never more than {window} in a row")
    else:
        where = (f"trajectory left the band at step {v.left_band} (more than {window} steps in a row outside; "
                 f"{v.steps_outside} steps outside in all)")
    if v.nonfinite_step is not None:
        message = f"loss non-finite from step {v.nonfinite_step}; {band_text}"
    else:
        message = (f"final {v.final:.4f} (floor {stats.entropy_rate:.4f}); {band_text}; "
                   f"gap {v.gap:+.2f} band; {where}")
    if cand.role == ROLE_REFERENCE:
        seeds = ", ".join(f"{f:.4f}" for f in band.seed_finals)
        return Outcome(cand.name, cand.role, PASS, f"reference: makes the band (final losses by data order "
                       f"{seeds}); {message}", log, v)
    if cand.role == ROLE_ANCHOR:
        return Outcome(cand.name, cand.role, OK, f"anchor (another algorithm), not judged: {message}", log, v)
    return Outcome(cand.name, cand.role, PASS if v.passed else FAIL, message, log, v)


def _emit_rows(row, cand: TrainCandidate, outcome: Outcome, settings: TrainSettings) -> None:
    log, v = outcome.log, outcome.verdict
    status = ERROR if v.nonfinite_step is not None and cand.role != ROLE_ANCHOR else OK
    window = tail_window(settings.steps)
    row(cand.name, "final_loss", v.final, "nats", status, f"mean loss over the last {window} steps")
    row(cand.name, "band_gap", v.gap, "band", status, "(final - reference mean) / band half-width")
    row(
        cand.name,
        "first_step_outside_band",
        v.first_outside,
        "step",
        OK,
        "stayed in the band" if v.first_outside is None else "first step whose running loss is outside",
    )
    row(cand.name, "step_left_band", v.left_band, "step", OK,
        "trajectory stayed in the band" if v.left_band is None
        else f"first step of more than {window} consecutive steps outside the band")
    row(
        cand.name,
        "nonfinite_step",
        v.nonfinite_step,
        "step",
        OK if v.nonfinite_step is None else ERROR,
        "loss finite at every step" if v.nonfinite_step is None else "first step with a NaN/Inf loss",
    )
    if log.step_ms is None:
        note = "Triton interpreter: time not measured"
        row(cand.name, "time_median_ms", None, "ms", NOT_MEASURED, note)
        row(cand.name, "tokens_per_s", None, "tokens/s", NOT_MEASURED, note)
    else:
        what = "CUDA events" if settings.device == "cuda" else "perf_counter"
        row(
            cand.name,
            "time_median_ms",
            log.median_step_ms,
            "ms",
            OK,
            f"median step (forward, backward, clip, optimizer step; {what}), first 2 steps excluded",
        )
        row(cand.name, "tokens_per_s", log.tokens_per_s, "tokens/s", OK, f"{log.tokens_per_step} tokens per step")
    row(cand.name, "state_bytes", log.state_bytes, "B", OK,
        "bytes of the optimizer's state tensors, plus buffers it keeps between steps (Muon's graph inputs/outputs)")
    row(cand.name, "wall_s", log.wall_s, "s", OK, "the whole run, set-up included")
    row(
        cand.name,
        "parity",
        1.0 if outcome.status == PASS else 0.0 if outcome.status == FAIL else None,
        "",
        outcome.status,
        outcome.message,
    )


def _train_doc(op_label, settings, config, stream, result: TrainResult, window, candidates) -> dict:
    band = result.band
    return {
        "op": op_label,
        "wall_s": result.wall_s,
        "settings": asdict(settings),
        "model": asdict(config) | {"n_params": config.n_params()},
        "data": asdict(stream.stats)
        | {"empirical_floor": stream.empirical_loss_floor(), "n_sequences": stream.n_sequences},
        "window": window,
        "band": None
        if band is None
        else asdict(band) | {"half_width": band.half_width, "low": band.low, "high": band.high},
        "candidates": [
            {
                "name": o.name,
                "role": o.role,
                "status": o.status,
                "message": o.message,
                "final_loss": None if o.verdict is None or not math.isfinite(o.verdict.final) else o.verdict.final,
                "gap": None if o.verdict is None or not math.isfinite(o.verdict.gap) else o.verdict.gap,
                "first_step_outside_band": None if o.verdict is None else o.verdict.first_outside,
                "step_left_band": None if o.verdict is None else o.verdict.left_band,
                "steps_outside_band": None if o.verdict is None else o.verdict.steps_outside,
                "nonfinite_step": None if o.verdict is None else o.verdict.nonfinite_step,
                "median_step_ms": None if o.log is None else o.log.median_step_ms,
                "tokens_per_s": None if o.log is None else o.log.tokens_per_s,
                "state_bytes": None if o.log is None else o.log.state_bytes,
                "hyperparams": next((dict(c.hyperparams) for c in candidates if c.name == o.name), None),
            }
            for o in result.outcomes
        ],
    }


def with_changes(
    candidate: TrainCandidate, name: str, *, order_seed: int | None = None, lr_factor: float | None = None
) -> TrainCandidate:
    """A copy of ``candidate`` under another name, judged as a candidate: another data order,
    or its learning rate scaled (how the band's sensitivity is tested)."""
    hp = dict(candidate.hyperparams)
    if lr_factor is not None:
        hp["lr"] = hp["lr"] * lr_factor
    return replace(
        candidate,
        name=name,
        hyperparams=hp,
        role="candidate",
        order_seed=candidate.order_seed if order_seed is None else order_seed,
    )


def result_table(result: TrainResult) -> pd.DataFrame:
    """One line per candidate, losses with 4 decimals (the band is often a few hundredths wide)."""
    lines = []
    for o in result.outcomes:
        v, log = o.verdict, o.log
        lines.append(
            {
                "candidate": o.name,
                "role": o.role,
                "final loss": _fmt(v.final) if v else "-",
                "gap (band)": "-" if v is None or not math.isfinite(v.gap) else f"{v.gap:+.2f}",
                "first outside": "-" if v is None or v.first_outside is None else str(v.first_outside),
                "left band at": "-" if v is None or v.left_band is None else str(v.left_band),
                "NaN/Inf at": "-" if v is None or v.nonfinite_step is None else str(v.nonfinite_step),
                "step ms": _fmt(log.median_step_ms, 2) if log else "-",
                "tokens/s": "-" if log is None or log.tokens_per_s is None else f"{log.tokens_per_s:,.0f}",
                "state MB": "-" if log is None else f"{log.state_bytes / 1e6:.3f}",
                "result": o.status,
                "details": o.message if o.log is None else "",
            }
        )
    table = pd.DataFrame(lines)
    return table.drop(columns="details") if not table.empty and not table["details"].any() else table
