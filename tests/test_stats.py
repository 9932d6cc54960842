import math

import pytest

from kernelbench.harness.stats import NOISE_THRESHOLD, summarize


def test_quantiles_of_a_known_sample():
    st = summarize([5.0, 1.0, 4.0, 2.0, 3.0], mode="x")
    assert (st.median, st.p25, st.p75, st.min, st.max, st.reps) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert st.iqr == 2.0
    assert st.mean == 3.0
    assert st.mode == "x"


def test_interpolated_quartiles_match_numpy_linear_rule():
    st = summarize([1.0, 2.0, 3.0, 4.0])
    assert st.median == 2.5
    assert st.p25 == pytest.approx(1.75)
    assert st.p75 == pytest.approx(3.25)


def test_noise_flag_at_ten_percent_relative_iqr():
    quiet = summarize([100.0, 101.0, 102.0, 103.0, 104.0])
    assert quiet.relative_iqr == pytest.approx(2 / 102)
    assert not quiet.noisy
    noisy = summarize([80.0, 90.0, 100.0, 110.0, 120.0])
    assert noisy.relative_iqr == pytest.approx(20 / 100)
    assert noisy.relative_iqr > NOISE_THRESHOLD and noisy.noisy


def test_single_sample_and_empty():
    st = summarize([0.5])
    assert st.median == st.min == st.max == 0.5 and st.iqr == 0 and st.reps == 1
    with pytest.raises(ValueError):
        summarize([])


def test_zero_median_is_infinitely_noisy_not_a_crash():
    assert math.isinf(summarize([0.0, 0.0, 0.0]).relative_iqr)
