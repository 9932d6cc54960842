import math

import pytest
import torch

from kernelbench.harness.parity import REL_FLOOR, ParityTracker, compare_tensors


def test_identical_tensors_pass_with_zero_differences():
    ref = torch.randn(50, generator=torch.Generator().manual_seed(0))
    d = compare_tensors("t", ref, ref.clone(), atol=0.0, rtol=0.0)
    assert d.passed and d.max_abs == 0 and d.max_rel == 0 and d.n_outside == 0 and d.rel_fro == 0


def test_one_element_outside_tolerance_is_counted_and_measured():
    ref = torch.tensor([1.0, 2.0, 4.0, -8.0])
    cand = torch.tensor([1.0, 2.0, 4.5, -8.0])
    d = compare_tensors("t", ref, cand, atol=1e-6, rtol=1e-3)
    assert not d.passed
    assert d.n_outside == 1
    assert d.max_abs == pytest.approx(0.5)
    assert d.max_rel == pytest.approx(0.5 / 4.0)
    assert d.mean_abs == pytest.approx(0.5 / 4)
    assert d.rel_fro == pytest.approx(0.5 / math.sqrt(1 + 4 + 16 + 64))


def test_tolerance_rule_is_atol_plus_rtol_times_reference():
    ref = torch.tensor([100.0])
    assert compare_tensors("t", ref, torch.tensor([100.9]), atol=0.0, rtol=1e-2).passed
    assert not compare_tensors("t", ref, torch.tensor([101.1]), atol=0.0, rtol=1e-2).passed
    assert compare_tensors("t", ref, torch.tensor([101.1]), atol=0.2, rtol=1e-2).passed


def test_relative_error_denominator_is_guarded_at_zero():
    d = compare_tensors("t", torch.tensor([0.0, 1.0]), torch.tensor([1e-9, 1.0]), atol=1e-6, rtol=0.0)
    assert d.passed
    assert d.max_rel == pytest.approx(1e-9 / REL_FLOOR)


def test_nan_and_inf_patterns_must_match():
    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    same = compare_tensors("t", ref, ref.clone(), atol=0.0, rtol=0.0)
    assert same.passed and same.nan_mismatch == 0
    moved = compare_tensors("t", ref, torch.tensor([float("nan"), 1.0, float("inf"), 2.0]), atol=1e9, rtol=1e9)
    assert not moved.passed and moved.nan_mismatch == 2
    flipped = compare_tensors("t", ref, torch.tensor([1.0, float("nan"), -float("inf"), 2.0]), atol=1e9, rtol=1e9)
    assert not flipped.passed and flipped.nan_mismatch == 1


def test_frobenius_mode_ignores_elementwise_outliers_within_the_norm():
    ref = torch.ones(100)
    cand = ref.clone()
    cand[0] = 1.1  # 10% off on one element, 1% of the norm
    assert not compare_tensors("t", ref, cand, atol=0, rtol=1e-3).passed
    d = compare_tensors("t", ref, cand, atol=0, rtol=1e-3, fro=2e-2)
    assert d.passed and d.rel_fro == pytest.approx(0.01)


def test_shape_mismatch_is_an_error_naming_the_tensor():
    with pytest.raises(ValueError, match="w0"):
        compare_tensors("w0", torch.zeros(3), torch.zeros(4), 0, 0)


def test_tracker_keeps_the_first_failing_step_and_the_worst_values():
    tracker = ParityTracker(atol=0.0, rtol=1e-3)
    ref = {"p": torch.tensor([1.0, 2.0]), "state": torch.tensor([3.0])}
    tracker.update(0, ref, {"p": torch.tensor([1.0, 2.0]), "state": torch.tensor([3.0])})
    tracker.update(1, ref, {"p": torch.tensor([1.5, 2.0]), "state": torch.tensor([3.0])})
    tracker.update(2, ref, {"p": torch.tensor([1.1, 2.0]), "state": torch.tensor([3.0]), "extra": torch.ones(2)})
    assert not tracker.passed
    assert tracker.tensors["p"].first_failed_step == 1
    assert tracker.tensors["p"].worst.max_abs == pytest.approx(0.5)
    assert tracker.tensors["p"].steps == 3
    assert tracker.tensors["state"].passed
    assert tracker.not_compared == {"extra"}
