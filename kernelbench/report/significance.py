"""Is NEW slower than BASE? A rank test and bootstrap intervals on per-rep times, and the verdict.

- :func:`mann_whitney_u`: NEW's U statistic against BASE, with average ranks for ties, and a
  two-sided p-value from the normal approximation with the tie and continuity corrections (what
  ``scipy.stats.mannwhitneyu(new, base, method="asymptotic")`` computes). The approximation is
  good from about 8 samples a side; :func:`judge` asks for at least that many.
- Bootstrap intervals resample the way the times were taken: processes first where a side has
  several (``ab``), then rounds within each drawn process, then reps within each drawn round, all
  with replacement, so that a difference between processes (cuBLAS's algorithm choice, the host's
  speed, the allocator's layout) or between rounds (the clocks, a neighbour on the GPU) widens the
  interval instead of hiding among hundreds of reps of one round. A side of one process carries no
  information on how far another process of the same code would sit: the caller holds such rows to
  a floor (:mod:`kernelbench.report.compare`).
- :func:`judge`: ``slower`` when the rank test rejects equality at ``alpha`` and the whole
  interval of new / base median lies above 1 + threshold (significantly slower by more than the
  threshold); ``faster`` likewise below 1 - threshold; ``same`` when the interval lies inside
  [1 - threshold, 1 + threshold] (any change is smaller than the threshold); ``inconclusive``
  otherwise: the samples cannot tell whether the change exceeds the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_SAMPLES = 8
RESAMPLES = 2000
ALPHA = 0.01
# Draws held in memory at once by the bootstrap (resamples x pooled sample size).
_CHUNK_ELEMENTS = 4_000_000

FASTER, SLOWER, SAME, INCONCLUSIVE = "faster", "slower", "same", "inconclusive"
VERDICTS = (FASTER, SLOWER, SAME, INCONCLUSIVE)


def mann_whitney_u(base, new) -> tuple[float, float]:
    """(U of NEW, two-sided p) by the normal approximation with tie and continuity corrections."""
    x, y = np.asarray(new, dtype=float), np.asarray(base, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs at least one sample on each side")
    _, inverse, counts = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    # A run of t equal values takes the mean of the ranks it spans.
    mean_rank = np.cumsum(counts) - (counts - 1) / 2
    u = float(mean_rank[inverse[:n1]].sum() - n1 * (n1 + 1) / 2)
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - float((counts**3 - counts).sum()) / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:  # every value equal: no evidence of any difference
        return u, 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def _groups(values, clusters) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values ordered by cluster, each cluster's start and size."""
    values = np.asarray(values, dtype=float)
    clusters = np.zeros(len(values), dtype=int) if clusters is None else np.asarray(clusters)
    if len(clusters) != len(values):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    order = np.argsort(clusters, kind="stable")
    _, sizes = np.unique(clusters[order], return_counts=True)
    return values[order], np.cumsum(sizes) - sizes, sizes


def bootstrap_medians(values, clusters=None, processes=None, *, resamples: int = RESAMPLES,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """Medians of ``resamples`` nested resamples: processes drawn with replacement (where there are
    several), from each as many clusters as an average process holds, then from each drawn cluster
    as many reps as an average cluster holds, every draw with replacement."""
    values = np.asarray(values, dtype=float)
    clusters = np.zeros(len(values), dtype=int) if clusters is None else np.asarray(clusters)
    if processes is not None and len(processes) != len(values):
        raise ValueError(f"{len(values)} values but {len(processes)} process labels")
    if processes is None or len(np.unique(processes)) < 2:
        return _two_stage(values, clusters, resamples, rng)
    if len(clusters) != len(values):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    _, process_index = np.unique(np.asarray(processes), return_inverse=True)
    _, cluster_index = np.unique(clusters, return_inverse=True)
    # One label per (process, cluster), ordered by process: round 1 of two processes is two clusters.
    stride = cluster_index.max() + 1
    labels = process_index * stride + cluster_index
    ordered, starts, sizes = _groups(values, labels)
    _, process_sizes = np.unique(np.unique(labels) // stride, return_counts=True)
    process_starts = np.cumsum(process_sizes) - process_sizes
    rng = rng if rng is not None else np.random.default_rng(0)
    n_processes = len(process_sizes)
    per_process = max(1, round(len(sizes) / n_processes))
    per_cluster = max(1, round(len(ordered) / len(sizes)))
    width = n_processes * per_process
    out = np.empty(resamples)
    chunk = max(1, _CHUNK_ELEMENTS // (width * per_cluster))
    for lo in range(0, resamples, chunk):
        b = min(chunk, resamples - lo)
        drawn = rng.integers(n_processes, size=(b, n_processes))
        within = (rng.random((b, n_processes, per_process)) * process_sizes[drawn][..., None]).astype(np.int64)
        cluster = (process_starts[drawn][..., None] + within).reshape(b, width)
        offsets = (rng.random((b, width, per_cluster)) * sizes[cluster][..., None]).astype(np.int64)
        picks = ordered[starts[cluster][..., None] + offsets]
        out[lo:lo + b] = np.median(picks.reshape(b, width * per_cluster), axis=1)
    return out


def _two_stage(values, clusters, resamples: int, rng: np.random.Generator | None) -> np.ndarray:
    """Clusters drawn with replacement, then from each drawn cluster as many reps as an average
    cluster holds: the resample of a side measured in one process."""
    ordered, starts, sizes = _groups(values, clusters)
    if len(ordered) == 0:
        raise ValueError("bootstrap_medians needs at least one value")
    rng = rng if rng is not None else np.random.default_rng(0)
    k = len(sizes)
    m = max(1, round(len(ordered) / k))
    out = np.empty(resamples)
    chunk = max(1, _CHUNK_ELEMENTS // (k * m))
    for lo in range(0, resamples, chunk):
        b = min(chunk, resamples - lo)
        drawn = rng.integers(k, size=(b, k))
        offsets = (rng.random((b, k, m)) * sizes[drawn][..., None]).astype(np.int64)
        picks = ordered[starts[drawn][..., None] + offsets]
        out[lo:lo + b] = np.median(picks.reshape(b, k * m), axis=1)
    return out


def median_interval(values, clusters=None, *, level: float = 0.95, resamples: int = RESAMPLES,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median at ``level``."""
    medians = bootstrap_medians(values, clusters, resamples=resamples, rng=np.random.default_rng(seed))
    tail = (1 - level) / 2
    return float(np.quantile(medians, tail)), float(np.quantile(medians, 1 - tail))


def ratio_interval(base, new, base_clusters=None, new_clusters=None, *, base_processes=None, new_processes=None,
                   level: float = 1 - ALPHA, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(new) / median(base) at ``level``; each side is
    resampled on its own (the two runs are independent)."""
    rng = np.random.default_rng(seed)
    ratios = (bootstrap_medians(new, new_clusters, new_processes, resamples=resamples, rng=rng)
              / bootstrap_medians(base, base_clusters, base_processes, resamples=resamples, rng=rng))
    tail = (1 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


@dataclass(frozen=True)
class Judgement:
    verdict: str
    ratio: float  # median(new) / median(base)
    low: float  # the interval of the ratio (NaN when not computed)
    high: float
    p_value: float
    n_base: int
    n_new: int
    reason: str


def judge(base, new, base_clusters=None, new_clusters=None, *, base_processes=None, new_processes=None,
          threshold: float = 0.05, alpha: float = ALPHA, seed: int = 0) -> Judgement:
    """The verdict on one row from both sides' per-rep times, their rounds and, where a side ran in
    several processes, the process of each (see the module docstring)."""
    base, new = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    nb, nn = len(base), len(new)
    if nb == 0 or nn == 0:
        raise ValueError("judge needs samples on both sides")
    nan = float("nan")
    if not np.median(base) > 0:
        return Judgement(INCONCLUSIVE, nan, nan, nan, nan, nb, nn, "BASE's median time is 0: no ratio")
    ratio = float(np.median(new) / np.median(base))
    if min(nb, nn) < MIN_SAMPLES:
        return Judgement(INCONCLUSIVE, ratio, nan, nan, nan, nb, nn,
                         f"fewer than {MIN_SAMPLES} samples on a side ({nb} / {nn}): no test")
    _, p = mann_whitney_u(base, new)
    low, high = ratio_interval(base, new, base_clusters, new_clusters, base_processes=base_processes,
                               new_processes=new_processes, level=1 - alpha, seed=seed)
    up, down = 1 + threshold, 1 - threshold
    if p < alpha and low > up:
        verdict, reason = SLOWER, f"interval above {up:.3g}"
    elif p < alpha and high < down:
        verdict, reason = FASTER, f"interval below {down:.3g}"
    elif low >= down and high <= up:
        verdict, reason = SAME, f"interval inside [{down:.3g}, {up:.3g}]"
    elif low < up < high or low < down < high:
        verdict, reason = INCONCLUSIVE, f"interval crosses {up if low < up < high else down:.3g}"
    else:
        verdict, reason = INCONCLUSIVE, f"interval outside [{down:.3g}, {up:.3g}] but the rank test gives p={p:.2g}"
    return Judgement(verdict, ratio, low, high, p, nb, nn, reason)
