"""The tolerance of a training run: the reference's seed-to-seed spread, widened by rtol.

The reference is trained with several data-order seeds. Its *final loss* per seed is the mean
loss over the last ``tail`` (10%) of the steps. The band is centred on the seeds' mean ``m``,
with half-width ``h = max_i |final_i - m|`` (every reference seed lies inside it), widened by
``rtol * m``: ``H = h + rtol * m``. A candidate passes when ``|final - m| <= H``; its gap in
band units is ``(final - m) / H`` (within +-1 passes). Two-sided on purpose: a candidate that
ends well below the reference does not train like it either.

Per step, the same band is built from the seeds' *running loss* (the trailing mean over the same
window as the tail). The trajectory *leaves* the band at the first step that starts a stretch of
more than ``window`` consecutive steps outside it (or ends the run outside): one noisy step moves
the running loss for ``window`` steps only, so it alone never counts. A candidate whose
trajectory leaves the band fails even when its final loss is inside. At the last step the
running loss is the final loss, so the two views agree there.
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


def steps_outside(losses: np.ndarray, band: StepBand, window: int) -> np.ndarray:
    """Per step: whether the running loss is outside the per-step band (NaN counts as outside)."""
    run = running_loss(losses, window)
    n = min(len(run), len(band.mean))
    return ~(np.abs(run[:n] - band.mean[:n]) <= band.half_width[:n])


def first_step_outside(losses: np.ndarray, band: StepBand, window: int) -> int | None:
    """The first step whose running loss is outside the per-step band (or non-finite)."""
    outside = steps_outside(losses, band, window)
    return int(np.argmax(outside)) if outside.any() else None


def first_step_leaving(losses: np.ndarray, band: StepBand, window: int) -> int | None:
    """The first step of the first stretch of more than ``window`` consecutive steps outside the
    band, or of a stretch outside that lasts to the end of the run; None if there is none."""
    outside = steps_outside(losses, band, window)
    start = None
    for step, out in enumerate(outside):
        if not out:
            start = None
            continue
        start = step if start is None else start
        if step - start + 1 > window:
            return start
    return start  # outside at the last step: the final loss is outside too


@dataclass(frozen=True)
class Verdict:
    final: float
    gap: float
    passed: bool
    first_outside: int | None  # the first step outside the band, however briefly
    nonfinite_step: int | None
    left_band: int | None = None  # where the trajectory left the band (first_step_leaving)
    steps_outside: int = 0  # steps whose running loss is outside the band


def judge(losses: np.ndarray, band: Band, steps_band: StepBand, window: int) -> Verdict:
    """Passes when every loss is finite, the final loss is in the band and the trajectory never
    leaves the band (first_step_leaving)."""
    nonfinite = first_nonfinite(losses)
    final = final_loss(losses, window) if nonfinite is None else math.nan
    left = first_step_leaving(losses, steps_band, window)
    passed = nonfinite is None and band.contains(final) and left is None
    return Verdict(final, band.gap(final), passed, first_step_outside(losses, steps_band, window), nonfinite,
                   left, int(steps_outside(losses, steps_band, window).sum()))
