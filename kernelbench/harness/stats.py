"""Summary statistics of per-rep times: median, quartiles, IQR, min, reps, and a noise flag."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

# torch.utils.benchmark warns at 10% and 25% relative IQR; we flag a row at the first.
NOISE_THRESHOLD = 0.10


@dataclass(frozen=True)
class Stats:
    median: float
    p25: float
    p75: float
    min: float
    max: float
    mean: float
    reps: int
    mode: str = ""

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    @property
    def relative_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        return self.relative_iqr > NOISE_THRESHOLD

    def as_dict(self) -> dict:
        return {**asdict(self), "iqr": self.iqr, "noisy": self.noisy}


def summarize(times_ms: list[float], mode: str = "") -> Stats:
    """Quantiles by linear interpolation (numpy's default), on a sorted copy."""
    if not times_ms:
        raise ValueError("summarize() needs at least one time")
    t = torch.tensor(sorted(times_ms), dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return Stats(
        median=float(q[1]), p25=float(q[0]), p75=float(q[2]),
        min=float(t[0]), max=float(t[-1]), mean=float(t.mean()), reps=len(times_ms), mode=mode,
    )
