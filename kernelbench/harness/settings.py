"""How a run times its candidates: every default and every bound a user's value must meet, in one
place. The CLI's options and a suite's ``[suite]`` table both read them from here.

Imports neither torch nor pandas, so the CLI checks values and writes its help without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TimingConfig:
    """warmup_ms: warm-up time per candidate and round; rep_ms: timed time per candidate over
    all rounds; rounds: interleaved rounds (A B A B ...) per workload; reps per candidate are kept
    within [min_reps, max_reps] over all rounds; flush_l2: a cold L2 before each rep (CUDA);
    cuda_graph: time replays of a CUDA graph; settle_ms: untimed interleaved rounds before the
    timed ones, until the candidates have run this long (a GPU at its power cap runs its first
    second or two after idle faster, then slower: without settling, that lands on whichever
    candidate comes first)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    rounds: int = 3
    min_reps: int = 10
    max_reps: int = 1000
    flush_l2: bool = True
    cuda_graph: bool = False
    settle_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_TIMING = TimingConfig()


@dataclass(frozen=True)
class Bound:
    """A lower bound: ``value >= minimum``, or ``value > minimum`` when not inclusive."""

    minimum: float
    inclusive: bool = True

    def holds(self, value: float) -> bool:
        return value >= self.minimum if self.inclusive else value > self.minimum

    def words(self) -> str:
        return f"{'at least' if self.inclusive else 'greater than'} {self.minimum:g}"


@dataclass(frozen=True)
class Setting:
    """A timing setting a user may give: its type and bound."""

    kind: type | tuple[type, ...]
    bound: Bound | None = None


# What a CLI option or a suite's [suite] table may set.
USER_SETTINGS: dict[str, Setting] = {
    "warmup_ms": Setting((int, float), Bound(0)),
    "rep_ms": Setting((int, float), Bound(0, inclusive=False)),
    "rounds": Setting(int, Bound(1)),
    "cuda_graph": Setting(bool),
    "flush_l2": Setting(bool),
    "settle_ms": Setting((int, float), Bound(0)),
}
PARITY_STEPS = 10  # optimizer steps / input draws a parity check compares by default
PARITY_STEPS_BOUND = Bound(1)
PARITY_DETAIL = ("worst", "full")  # per-tensor rows a parity check keeps (see harness.runner)
DEFAULT_PARITY_DETAIL = PARITY_DETAIL[0]


def out_of_bounds(values: Mapping[str, Any]) -> list[tuple[str, Any, Bound]]:
    """(key, value, bound) of every given value of ``USER_SETTINGS`` outside its bound."""
    out = []
    for key, value in values.items():
        setting = USER_SETTINGS.get(key)
        if value is None or setting is None or setting.bound is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and not setting.bound.holds(value):
            out.append((key, value, setting.bound))
    return out


def timing_config(values: Mapping[str, Any], base: TimingConfig = DEFAULT_TIMING) -> TimingConfig:
    """``base`` with the given values (None: not given) of ``USER_SETTINGS`` in place."""
    given = {k: v for k, v in values.items() if k in USER_SETTINGS and v is not None}
    return TimingConfig(**{**base.as_dict(), **given})
