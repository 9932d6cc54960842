"""The tolerance of a training run: the reference's seed-to-seed spread, widened by rtol.

The reference is trained with several data-order seeds. Its *final loss* per seed is the mean
loss over the last ``tail`` (10%) of the steps. The band is centred on the seeds' mean ``m``,
with half-width ``h = max_i |final_i - m|`` (every reference seed lies inside it), widened by
``rtol * m``: ``H = h + rtol * m``. A candidate passes when ``|final - m| <= H``; its gap in
band units is ``(final - m) / H`` (within +-1 passes). Two-sided on purpose: a candidate that
ends well below the reference does not train like it either.

Per step, the same band is built from the seeds' *running loss* (the trailing mean over the same
window as the tail), and the first step where a candidate's running loss is outside it is
reported: at the last step the running loss is the final loss, so the two views agree there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TAIL_FRACTION = 0.1


def tail_window(steps: int) -> int:
    """Steps averaged into the final loss (and the running loss): 10% of the run, at least 1."""
    return max(1, int(math.ceil(TAIL_FRACTION * steps)))


def running_loss(losses: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` steps (shorter at the start); NaN once a loss is non-finite."""
    losses = np.asarray(losses, dtype=np.float64)
    cumsum = np.concatenate([[0.0], np.cumsum(losses)])
    idx = np.arange(1, len(losses) + 1)
    start = np.maximum(idx - window, 0)
    with np.errstate(invalid="ignore"):  # inf - inf after a diverged step: NaN, set below anyway
        out = (cumsum[idx] - cumsum[start]) / (idx - start)
    bad = ~np.isfinite(losses)
    if bad.any():
        out[np.argmax(bad):] = np.nan
    return out


def final_loss(losses: np.ndarray, window: int | None = None) -> float:
    losses = np.asarray(losses, dtype=np.float64)
    window = window or tail_window(len(losses))
    return float(np.mean(losses[-window:]))


def first_nonfinite(losses: np.ndarray) -> int | None:
    bad = ~np.isfinite(np.asarray(losses, dtype=np.float64))
    return int(np.argmax(bad)) if bad.any() else None


@dataclass(frozen=True)
class Band:
    mean: float
    spread: float  # h: the largest deviation of a reference seed from the mean
    rtol: float
    seed_finals: tuple[float, ...]

    @property
    def half_width(self) -> float:
        return self.spread + self.rtol * abs(self.mean)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def gap(self, final: float) -> float:
        """(final - mean) / half_width: within +-1 is inside the band."""
        if not math.isfinite(final):
            return math.nan
        if self.half_width > 0:
            return (final - self.mean) / self.half_width
        return 0.0 if final == self.mean else math.copysign(math.inf, final - self.mean)

    def contains(self, final: float) -> bool:
        return math.isfinite(final) and abs(final - self.mean) <= self.half_width


def make_band(reference_losses: list[np.ndarray], rtol: float, window: int | None = None) -> Band:
    """The band from the reference's per-seed loss curves (one array per seed, equal lengths)."""
    if not reference_losses:
        raise ValueError("the band needs at least one reference run")
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    finals = np.array([final_loss(losses, window) for losses in reference_losses])
    if not np.isfinite(finals).all():
        raise ValueError(f"a reference run did not finish with a finite loss (final losses {finals.tolist()})")
    mean = float(finals.mean())
    return Band(mean, float(np.abs(finals - mean).max()), rtol, tuple(float(f) for f in finals))


@dataclass(frozen=True)
class StepBand:
    """The band at every step, from the reference seeds' running losses."""

    mean: np.ndarray
    half_width: np.ndarray

    @property
    def low(self) -> np.ndarray:
        return self.mean - self.half_width

    @property
    def high(self) -> np.ndarray:
        return self.mean + self.half_width


def step_band(reference_losses: list[np.ndarray], rtol: float, window: int) -> StepBand:
    runs = np.stack([running_loss(losses, window) for losses in reference_losses])
    mean = runs.mean(axis=0)
    spread = np.abs(runs - mean).max(axis=0)
    return StepBand(mean, spread + rtol * np.abs(mean))


def first_step_outside(losses: np.ndarray, band: StepBand, window: int) -> int | None:
    """The first step whose running loss is outside the per-step band (or non-finite)."""
    run = running_loss(losses, window)
    n = min(len(run), len(band.mean))
    outside = ~(np.abs(run[:n] - band.mean[:n]) <= band.half_width[:n])  # NaN counts as outside
    return int(np.argmax(outside)) if outside.any() else None


@dataclass(frozen=True)
class Verdict:
    final: float
    gap: float
    passed: bool
    first_outside: int | None
    nonfinite_step: int | None


def judge(losses: np.ndarray, band: Band, steps_band: StepBand, window: int) -> Verdict:
    nonfinite = first_nonfinite(losses)
    final = final_loss(losses, window) if nonfinite is None else math.nan
    return Verdict(final, band.gap(final), nonfinite is None and band.contains(final),
                   first_step_outside(losses, steps_band, window), nonfinite)
