"""Ops whose run starts processes of their own (the ranks of a distributed step).

Such an op hands the harness no :class:`~kernelbench.ops.base.Case`: its candidates are timed
side by side inside the processes it starts, and its :meth:`LaunchedOp.run_workload` turns one
launch into report rows (it imports torch only when it runs, so the registry stays torch-free).
The op declares what ``run`` needs to treat it like any other: its workloads and the default
ones per device, its candidates, the options only it takes (``--nproc``...) with their checks
and defaults, and a note for the device.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Candidate, Case, Op, UsageError, Workload

if TYPE_CHECKING:
    from kernelbench.harness.rows import Row


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

    def __init__(self, name: str, *, options: Sequence[OpOption],
                 default_workloads: Mapping[str, Sequence[str]], **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.options = {o.flag: o for o in options}
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

    @abc.abstractmethod
    def run_workload(self, workload: str, device: str, folder: Path,
                     settings: Mapping[str, Any]) -> tuple[list[Row], str | None]:
        """One launch on ``workload`` as report rows, and the error that ended it, if any (its
        first line is what a user needs; an error row keeps the rest). Files it writes go in
        ``folder``."""
