"""Comparing a candidate's tensors with the reference's, per tensor, over several steps."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

# Denominator guard for relative error: |ref| below this counts as this, so exact zeros in the
# reference do not turn a 1e-12 difference into an infinite relative error.
REL_FLOOR = 1e-12
# A result must beat the trivial one, an all-zero tensor (relative Frobenius error exactly 1), by
# this factor: otherwise an element-wise tolerance whose atol dwarfs the reference's values (small
# gradients in bf16) would pass zeros. The loosest tolerance an op declares is 5e-2.
TRIVIAL_MARGIN = 10.0


@dataclass
class TensorDiff:
    """How one tensor differs from its reference at one step."""

    name: str
    max_abs: float
    max_rel: float
    mean_abs: float
    rel_fro: float
    n_outside: int
    numel: int
    nan_mismatch: int
    passed: bool
    beats_zero: bool = True  # rel_fro at most 1 / TRIVIAL_MARGIN of the all-zero output's

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def why(self) -> str:
        """Why it failed, in words ("" when it passed)."""
        if self.passed:
            return ""
        if self.nan_mismatch:
            return f"{self.nan_mismatch} NaN/Inf where the reference differs"
        if not self.beats_zero:
            return (f"no better than an all-zero output (relative error {self.rel_fro:.3g}; must be at most "
                    f"{1 / TRIVIAL_MARGIN:g}, {TRIVIAL_MARGIN:g}x below the zero output's 1)")
        if self.n_outside:
            return f"{self.n_outside} of {self.numel} elements outside tolerance"
        return f"relative Frobenius error {self.rel_fro:.3g} above its bound"


def compare_tensors(name: str, ref: torch.Tensor, cand: torch.Tensor, atol: float, rtol: float,
                    fro: float | None = None) -> TensorDiff:
    """Differences of ``cand`` from ``ref``, computed in fp64 on the CPU side of caution.

    Elements pass when |cand - ref| <= atol + rtol * |ref| (torch.isclose's rule); when ``fro``
    is given the tensor passes on ||cand - ref||_F / ||ref||_F <= fro instead. NaN and Inf must
    sit at the same places in both: any place where they do not counts in ``nan_mismatch`` and
    fails the tensor. Whatever the tolerance, a tensor whose relative Frobenius error is not
    TRIVIAL_MARGIN times below an all-zero tensor's fails (``beats_zero``).
    """
    if ref.shape != cand.shape:
        raise ValueError(f"{name}: shape {tuple(cand.shape)} differs from the reference's {tuple(ref.shape)}")
    r = ref.detach().to(torch.float64)
    c = cand.detach().to(device=r.device, dtype=torch.float64)
    r_nan, c_nan = torch.isnan(r), torch.isnan(c)
    r_inf, c_inf = torch.isinf(r), torch.isinf(c)
    special_mismatch = (r_nan != c_nan) | (r_inf != c_inf) | (r_inf & c_inf & (torch.sign(r) != torch.sign(c)))
    finite = torch.isfinite(r) & torch.isfinite(c)
    diff = torch.where(finite, (c - r).abs(), torch.zeros_like(r))
    rabs = torch.where(finite, r.abs(), torch.zeros_like(r))
    rel = diff / rabs.clamp_min(REL_FLOOR)
    outside = (diff > atol + rtol * rabs) & finite
    numel = r.numel()
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite, r, torch.zeros_like(r))))
    diff_norm = float(torch.linalg.vector_norm(diff))
    rel_fro = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    n_special = int(special_mismatch.sum())
    n_outside = int(outside.sum())
    beats_zero = ref_norm == 0 or rel_fro <= 1 / TRIVIAL_MARGIN
    if fro is not None:
        passed = rel_fro <= fro and n_special == 0
    else:
        passed = n_outside == 0 and n_special == 0
    passed = passed and beats_zero
    return TensorDiff(
        name=name,
        max_abs=float(diff.max()) if numel else 0.0,
        max_rel=float(rel.max()) if numel else 0.0,
        mean_abs=float(diff.mean()) if numel else 0.0,
        rel_fro=rel_fro,
        n_outside=n_outside,
        numel=numel,
        nan_mismatch=n_special,
        passed=passed,
        beats_zero=beats_zero,
    )


@dataclass
class TensorParity:
    """A tensor's worst differences over all steps, and the first step it failed (None: never)."""

    name: str
    worst: TensorDiff
    first_failed_step: int | None = None
    steps: int = 0
    first_failure: str = ""  # why it failed at first_failed_step

    @property
    def passed(self) -> bool:
        return self.first_failed_step is None


@dataclass
class ParityTracker:
    """Accumulates per-step comparisons of one candidate against the reference."""

    atol: float
    rtol: float
    fro: float | None = None
    tensors: dict[str, TensorParity] = field(default_factory=dict)
    not_compared: set[str] = field(default_factory=set)

    def update(self, step: int, ref: dict[str, torch.Tensor], cand: dict[str, torch.Tensor]) -> dict[str, TensorDiff]:
        """Compares this step's tensors and returns their diffs (the worst are kept)."""
        diffs = {}
        for name, c in cand.items():
            r = ref.get(name)
            if r is None or r.shape != c.shape:
                # e.g. a state tensor the reference keeps in another layout; listed in the report
                self.not_compared.add(name)
                continue
            diff = diffs[name] = compare_tensors(name, r, c, self.atol, self.rtol, self.fro)
            entry = self.tensors.get(name)
            if entry is None:
                entry = self.tensors[name] = TensorParity(name, diff)
            entry.worst = _worse(entry.worst, diff)
            entry.steps += 1
            if not diff.passed and entry.first_failed_step is None:
                entry.first_failed_step = step
                entry.first_failure = diff.why
        return diffs

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors.values())


def _worse(a: TensorDiff, b: TensorDiff) -> TensorDiff:
    """Element-wise worst of two diffs of the same tensor (each field its own maximum)."""
    return TensorDiff(
        name=a.name,
        max_abs=max(a.max_abs, b.max_abs),
        max_rel=max(a.max_rel, b.max_rel),
        mean_abs=max(a.mean_abs, b.mean_abs),
        rel_fro=max(a.rel_fro, b.rel_fro),
        n_outside=max(a.n_outside, b.n_outside),
        numel=a.numel,
        nan_mismatch=max(a.nan_mismatch, b.nan_mismatch),
        passed=a.passed and b.passed,
        beats_zero=a.beats_zero and b.beats_zero,
    )
