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

from .base import Candidate, Case, Op, UsageError, Workload, unknown_name_error

if TYPE_CHECKING:
    from kernelbench.harness.rows import Row
    from kernelbench.harness.settings import TimingConfig


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
    kind: str = "number"  # what a suite's ``options`` table may give: "int", "number" or "bool"

    def config_problem(self, value: Any) -> str | None:
        """Why ``value``, from a suite's ``options`` table, cannot be this option's; None if it can."""
        is_bool = isinstance(value, bool)
        wanted = {"bool": is_bool, "int": isinstance(value, int) and not is_bool,
                  "number": isinstance(value, (int, float)) and not is_bool}[self.kind]
        if not wanted:
            expected = {"bool": "true or false", "int": "an integer", "number": "a number"}[self.kind]
            return f"{self.key} = {value!r}: expected {expected}"
        try:
            self.check(value)
        except UsageError as exc:
            return str(exc).replace(self.flag, f"{self.key} =", 1)
        return None

    def check(self, value: Any) -> None:
        if value is None or isinstance(value, bool):
            return
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{self.flag} {value:g}: must be at least {self.minimum:g}")
        if self.above is not None and value <= self.above:
            raise UsageError(f"{self.flag} {value:g}: must be greater than {self.above:g}")


DEFAULT_NPROC = 2


def nproc_option() -> OpOption:
    """``--nproc``, the same for every launched op (the CLI's help names all the ops taking it)."""
    return OpOption("--nproc", "nproc", f"ranks to start through torch.distributed.run [default: {DEFAULT_NPROC}].",
                    minimum=1, kind="int")


def bucket_mb_option() -> OpOption:
    """``--bucket-mb``, the same for every launched op that builds ShardedAdamW."""
    return OpOption("--bucket-mb", "bucket_mb", "ShardedAdamW's bucket size in MiB, > 0 (default: its own, "
                    "1024, or 256 with a gather group). dist-train-step: every ShardedAdamW candidate's.", above=0)


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

    def option_by_key(self, key: str) -> OpOption | None:
        """The option a suite's ``options`` table names by its setting key (``nproc``), or None."""
        return next((o for o in self.options.values() if o.key == key), None)

    def check_options(self, given: Mapping[str, Any]) -> None:
        for flag, value in given.items():
            self.options[flag].check(value)

    @abc.abstractmethod
    def settings(self, device: str, given: Mapping[str, Any],
                 timing: TimingConfig | None = None) -> dict[str, Any]:
        """Every option's value for a run on ``device``: the given ones, else the defaults;
        ``timing``: the run's timing settings, for an op whose ``takes`` names them."""

    def given_values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The given options by setting key (``--nproc`` -> ``nproc``), those not given left out."""
        return {self.options[flag].key: value for flag, value in given.items() if value is not None}

    def availability(self, candidate, device: str) -> str:
        if device != "cuda":
            return "CPU ranks on Gloo: a run-through, not a measurement"
        import torch

        gpus = torch.cuda.device_count()
        return "yes" if gpus >= 2 else f"no: needs 2 GPUs, {gpus} visible"

    def device_note(self, device: str) -> str | None:
        """A line to print before a run on ``device`` (what it is, and is not, worth)."""
        if device == "cuda":
            return None
        cpu = self._default_workloads.get("cpu", [])
        return (f"{self.name} on CPU ranks (Gloo, Triton interpreter): a run-through, not a measurement"
                + (f"; default workload {', '.join(cpu)}." if cpu else "."))

    def progress_text(self, workload: str, settings: Mapping[str, Any]) -> str:
        if "nproc" in settings:
            return f"{self.name} {workload} on {settings['nproc']} ranks (torch.distributed.run)"
        return f"{self.name} {workload}"

    def check_launch(self, workload: str, nproc: int, cpu: bool) -> None:
        """What a launch on ``nproc`` ranks needs, checked before any process starts (UsageError)."""
        if workload not in self.workloads:
            raise unknown_name_error("workload", workload, self.workloads)
        if nproc < 1:
            raise UsageError(f"--nproc must be >= 1, got {nproc}")
        if not cpu:
            import torch

            if torch.cuda.is_available() and nproc > torch.cuda.device_count():
                raise UsageError(f"--nproc {nproc} needs {nproc} GPUs; {torch.cuda.device_count()} visible")

    def launch_error(self, workload: str, settings: Mapping[str, Any], candidate: str,
                     error: Exception) -> tuple[list[Row], str]:
        """A launch that brought back no result: one error row (the whole message) and its first line."""
        from kernelbench.harness.rows import ERROR, Row

        row = Row(self.name, workload, f"{settings.get('nproc', '?')} ranks", candidate, "time_median_ms", None,
                  "ms", ERROR, message=str(error)[-2000:])
        return [row], str(error).splitlines()[0]

    @abc.abstractmethod
    def run_workload(self, workload: str, device: str, folder: Path,
                     settings: Mapping[str, Any]) -> tuple[list[Row], str | None]:
        """One launch on ``workload`` as report rows, and the error that ended it, if any (its
        first line is what a user needs; an error row keeps the rest). Files it writes go in
        ``folder``."""
