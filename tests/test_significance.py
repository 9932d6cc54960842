"""The statistics behind compare's verdicts: the rank test against scipy and known values, the
two-stage bootstrap, and one synthetic case per verdict."""

import numpy as np
import pytest
import scipy.stats

from kernelbench.report.significance import (
    FASTER,
    INCONCLUSIVE,
    MIN_SAMPLES,
    SAME,
    SLOWER,
    bootstrap_medians,
    judge,
    mann_whitney_u,
    median_interval,
    ratio_interval,
)


def test_rank_test_known_values():
    # scipy.stats.mannwhitneyu's documented example (males vs females, method="asymptotic").
    u, p = mann_whitney_u(base=[20, 11, 17, 12], new=[19, 22, 16, 29, 24])
    assert u == 17.0 and p == pytest.approx(0.11134688653314041, rel=1e-12)
    # By hand: no ties, U = 9 of 9, z = (4.5 - 0.5) / sqrt(3 * 3 / 12 * 7), p = erfc(z / sqrt 2).
    u, p = mann_whitney_u(base=[1, 2, 3], new=[4, 5, 6])
    assert u == 9.0 and p == pytest.approx(0.0808555983700523, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_rank_test_matches_scipy_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    n_base, n_new = rng.integers(8, 400, size=2)
    base = rng.normal(1.0, 0.05, n_base)
    new = rng.normal(1.0 + 0.01 * seed, 0.05, n_new)
    if seed % 2:  # quantized times: many ties
        base, new = np.round(base, 2), np.round(new, 2)
    ours = mann_whitney_u(base, new)
    ref = scipy.stats.mannwhitneyu(new, base, method="asymptotic", use_continuity=True)
    assert ours[0] == pytest.approx(ref.statistic, rel=1e-12)
    assert ours[1] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


def test_rank_test_edge_cases():
    assert mann_whitney_u([2.0] * 10, [2.0] * 12) == (60.0, 1.0)  # all tied: no evidence
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


def test_bootstrap_intervals_cover_the_truth_and_widen_with_rounds_that_disagree():
    rng = np.random.default_rng(1)
    base = rng.normal(1.0, 0.02, 600)
    new = rng.normal(1.1, 0.02, 600)
    low, high = ratio_interval(base, new, level=0.99)
    assert low < 1.1 < high and low > 1.05
    lo, hi = median_interval(base, level=0.95)
    assert lo < np.median(base) < hi and hi - lo < 0.01
    # Three rounds whose levels differ by 3%: the reps alone look precise, the rounds do not.
    rounds = np.repeat([1, 2, 3], 200)
    shifted = base * np.repeat([0.97, 1.0, 1.03], 200)
    flat = ratio_interval(shifted, new)
    clustered = ratio_interval(shifted, new, base_clusters=rounds)
    assert (clustered[1] - clustered[0]) > 2 * (flat[1] - flat[0])


def test_bootstrap_is_deterministic_and_handles_uneven_rounds():
    values = np.arange(1.0, 31.0)
    rounds = np.array([1] * 5 + [2] * 20 + [3] * 5)
    a = bootstrap_medians(values, rounds, resamples=300)
    b = bootstrap_medians(values, rounds, resamples=300)
    assert np.array_equal(a, b) and a.shape == (300,)
    assert values.min() <= a.min() and a.max() <= values.max()
    with pytest.raises(ValueError):
        bootstrap_medians(values, rounds[:-1])


def _rounds(rng, level, n_rounds=3, reps=100, noise=0.01, drift=0.003, offsets=None):
    """Per-rep times of a kernel of median ``level``: an offset per round (random, or the given
    ones), noise per rep."""
    offsets = offsets if offsets is not None else drift * rng.standard_normal(n_rounds)
    times = np.concatenate([level * (1 + o) * (1 + noise * rng.standard_normal(reps)) for o in offsets])
    return times, np.repeat(np.arange(1, len(offsets) + 1), reps)


def test_one_synthetic_case_per_verdict():
    rng = np.random.default_rng(7)
    base, br = _rounds(rng, 1.0)
    cases = {
        SLOWER: _rounds(rng, 1.10),
        FASTER: _rounds(rng, 0.90),
        SAME: _rounds(rng, 1.0),
        # 5% slower, but its rounds disagree by +-6%: it can't tell whether that is above the threshold
        INCONCLUSIVE: _rounds(rng, 1.05, offsets=[-0.06, 0.0, 0.06]),
    }
    for expected, (new, nr) in cases.items():
        verdict = judge(base, new, br, nr, threshold=0.05)
        assert verdict.verdict == expected, (expected, verdict)
    slower = judge(base, cases[SLOWER][0], br, cases[SLOWER][1], threshold=0.05)
    assert slower.ratio == pytest.approx(1.10, abs=0.01) and slower.low > 1.05 and slower.p_value < 1e-6
    few = judge(base[: MIN_SAMPLES - 1], base[: MIN_SAMPLES - 1] * 2)
    assert few.verdict == INCONCLUSIVE and "fewer than" in few.reason and few.ratio == pytest.approx(2.0)


def test_a_known_five_percent_slowdown_is_slower_at_a_two_percent_threshold_only():
    rng = np.random.default_rng(3)
    base, br = _rounds(rng, 1.0, noise=0.005, drift=0.002)
    new, nr = _rounds(rng, 1.05, noise=0.005, drift=0.002)
    strict = judge(base, new, br, nr, threshold=0.02)
    assert strict.verdict == SLOWER and strict.low < 1.05 < strict.high
    # At the default 5% the interval straddles the threshold: not called slower.
    assert judge(base, new, br, nr, threshold=0.05).verdict == INCONCLUSIVE


def test_identical_kernels_are_never_called_slower():
    calls = [judge(*_pair(seed)) for seed in range(40)]
    assert not [c for c in calls if c.verdict == SLOWER]
    assert sum(c.verdict == SAME for c in calls) >= 36


def _pair(seed):
    rng = np.random.default_rng(100 + seed)
    (b, br), (n, nr) = _rounds(rng, 1.0), _rounds(rng, 1.0)
    return b, n, br, nr
