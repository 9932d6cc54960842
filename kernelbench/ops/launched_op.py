"""Ops whose run starts processes of their own (the ranks of a distributed step).

Such an op hands the harness no :class:`~kernelbench.ops.base.Case`: its candidates are timed
side by side inside the processes it starts, and the function named by ``runner`` (imported when
a run needs it, so the registry stays torch-free) turns one launch into report rows. The op
declares what ``run`` needs to treat it like any other: its workloads and the default ones per
device, its candidates, the options only it takes (``--nproc``...) with their checks and
defaults, and a note for the device.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Candidate, Case, Op, UsageError, Workload


@dataclass(frozen=True)
class OpOption:
    """A ``run`` option only some ops take: its flag, the setting it fills and its bounds."""

    flag: str
    key: str
    help: str
    shown: str = ""  # how errors name it, e.g. "--gather-group/--no-gather-group"
    minimum: float | None = None
    above: float | None = None
    # Added to the error when another op is given this option (a look-alike it may have meant).
    elsewhere_hint: str = ""

    def check(self, value: Any) -> None:
        if value is None or isinstance(value, bool):
            return
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{self.flag} {value:g}: must be at least {self.minimum:g}")
        if self.above is not None and value <= self.above:
            raise UsageError(f"{self.flag} {value:g}: must be greater than {self.above:g}")


class LaunchedOp(Op):
    kind = "multi-process"
    # Generic run options such an op takes besides its own, and how errors name them.
    takes: tuple[str, ...] = ("-w/--workload",)
    takes_shown: tuple[str, ...] = ("-w", "--device", "-o", "--format")

    def __init__(self, name: str, *, options: Sequence[OpOption], runner: str,
                 default_workloads: Mapping[str, Sequence[str]], **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.options = {o.flag: o for o in options}
        self.runner = runner
        self._default_workloads = {tier: list(names) for tier, names in default_workloads.items()}

    def workloads_for(self, tier: str) -> list[Workload]:
        return [self.workload(name) for name in self._default_workloads.get(tier, [])]

    def make_case(self, candidate: Candidate, workload: Workload, device: str, mode: str) -> Case:
        raise UsageError(self.not_a_case())

    def make_reference_case(self, workload: Workload, device: str, mode: str) -> Case:
        raise UsageError(self.not_a_case())

    def not_a_case(self) -> str:
        return (f"op '{self.name}' times its candidates inside the processes it starts and checks them "
                f"against each other there: kernelbench run {self.name}")

    def accepted_text(self) -> str:
        names = [*self.takes_shown, *(o.shown or o.flag for o in self.options.values())]
        return ", ".join(names[:-1]) + f" and {names[-1]}"

    def check_options(self, given: Mapping[str, Any]) -> None:
        for flag, value in given.items():
            self.options[flag].check(value)

    @abc.abstractmethod
    def settings(self, device: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's value for a run on ``device``: the given ones, else the defaults."""

    def device_note(self, device: str) -> str | None:
        """A line to print before a run on ``device`` (what it is, and is not, worth)."""
        return None

    def progress_text(self, workload: str, settings: Mapping[str, Any]) -> str:
        return f"{self.name} {workload}"

    def load_runner(self) -> Callable[..., Any]:
        """``runner(op, workload, device, folder, settings) -> (rows, error message or None)``."""
        module, _, attr = self.runner.partition(":")
        return getattr(importlib.import_module(module), attr)
