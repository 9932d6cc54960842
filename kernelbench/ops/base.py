"""The vocabulary of kernelbench: ops, workloads, candidates and the cases built from them.

An *op* (``adamw``, ``rmsnorm``...) is declared once, in its own module under ``kernelbench/ops``:
its named, seeded workloads, how to build inputs for them, the reference, the bytes / FLOP model
and the tolerances by dtype. A *candidate* is one implementation of an op, registered with the
op's ``@op.candidate(...)`` decorator next to the op; that decorator is the only place a new
candidate touches.

The harness never sees an op's internals: it asks an op for a :class:`Case` (something it can
``prepare`` untimed, ``run`` timed, and read ``tensors`` from for parity) and times or compares it.
Candidate modules import their kernels *inside* the factory functions, so that importing the
registry never imports Triton kernels (``TRITON_INTERPRET`` must be set before they are defined).

Plugins (:mod:`kernelbench.ops.plugins`) register through this same API from outside the package;
every op and candidate records where it came from (``source``: ``kernelbench``, ``plugin:NAME``,
or ``module:NAME`` for a module that registered outside the plugin loader).
"""

from __future__ import annotations

import abc
import difflib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

REGISTRY: dict[str, Op] = {}


class UsageError(ValueError):
    """Bad input from a user (an unknown name, a bad option value). The CLI exits 2 on it."""


class RegistrationError(ValueError):
    """An op or candidate declared against the API's rules (a plugin's mistake, named by the loader)."""


class DuplicateNameError(RegistrationError):
    """An op, or a candidate of an op, registered under a name already taken."""


# Op and candidate names: what the CLI, file names and report keys can carry unquoted.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RegistrationError(f"{kind} name {name!r}: expected letters, digits and . _ + - (e.g. 'my-triton')")
    return name


def source_of(module: str) -> str:
    """Where a registration from ``module`` came from, before any plugin loader relabels it."""
    if module == "kernelbench" or module.startswith("kernelbench."):
        return "kernelbench"
    return f"module:{module}"


def _declaring_module(op: object) -> str:
    """The module whose code constructed ``op``: the first frame outside Op subclasses' __init__."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is op:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> UsageError:
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return UsageError(f"unknown {kind} '{name}'.{hint} Valid: {', '.join(valid) or '(none)'}.")


@dataclass(frozen=True)
class Workload:
    """A named, seeded problem. ``tier`` is ``"cpu"`` (small, used by tests and the quick suite)
    or ``"gpu"`` (the sizes of the models and layers compared). ``spec`` holds whatever the op's factories read."""

    name: str
    tier: str
    spec: Mapping[str, Any]
    seed: int = 0
    note: str = ""


@dataclass(frozen=True)
class Tolerance:
    """Pass when |cand - ref| <= atol + rtol * |ref| element-wise, or, when ``fro`` is set, when
    ||cand - ref||_F / ||ref||_F <= fro (for results whose elements are individually noisy)."""

    atol: float
    rtol: float
    fro: float | None = None
    reason: str = ""


# Dtypes are named by strings in workload specs and tolerance tables, so that the registry (and
# `kernelbench list`, `--help`) loads without importing torch; torch dtypes are accepted too.
DTYPE_NAMES = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_LONG_NAMES = {short: long for long, short in DTYPE_NAMES.items()}


def dtype_name(dtype: str | torch.dtype) -> str:
    """"fp32" for torch.float32, "float32" or "fp32"; other dtypes by torch's own name."""
    name = str(dtype).removeprefix("torch.")
    return DTYPE_NAMES.get(name, name)


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype a spec names ("bf16", "float32", or a torch dtype already)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = _LONG_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; accepted: {', '.join(_LONG_NAMES)}")
    return value


def by_dtype(table: Mapping[Any, Tolerance] | None) -> dict[str, Tolerance]:
    """A tolerance table keyed by dtype names, whichever way its keys were written."""
    return {dtype_name(k): v for k, v in (table or {}).items()}


# Defaults by dtype: what each dtype's rounding allows an element-wise result.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp64": Tolerance(1e-10, 1e-8),
    "fp32": Tolerance(1e-6, 1e-5),
    "fp16": Tolerance(1e-3, 1e-2),
    "bf16": Tolerance(1e-2, 1e-2),
}


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def package_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@dataclass(frozen=True)
class Requires:
    """What a candidate needs to run. ``packages`` are import names (``adam_mini``)."""

    cuda: bool = False
    min_capability: tuple[int, int] | None = None
    triton: bool = False
    packages: tuple[str, ...] = ()
    min_gpus: int = 1

    def unmet(self, device: str) -> str | None:
        """Why this cannot run on ``device`` here, or None when it can."""
        for pkg in self.packages:
            if not package_available(pkg):
                return f"{pkg.replace('_', '-')} not installed"
        if self.triton and not triton_available():
            return "triton not installed"
        if device != "cuda":
            if self.cuda:
                return "needs CUDA"
            if self.triton and not _interpreter_on():
                return "triton kernels need CUDA or TRITON_INTERPRET=1"
            return None
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA (none visible)"
        if torch.cuda.device_count() < self.min_gpus:
            return f"needs {self.min_gpus} GPUs, {torch.cuda.device_count()} visible"
        if self.min_capability is not None:
            cap = torch.cuda.get_device_capability()
            if cap < self.min_capability:
                want = "sm_{}{}".format(*self.min_capability)
                return f"needs {want} or newer, this GPU is sm_{cap[0]}{cap[1]}"
        return None

    def interpreted(self, device: str) -> bool:
        """True when this candidate's kernels would run in the Triton interpreter (no timing)."""
        return self.triton and device != "cuda"


def _interpreter_on() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass
class Candidate:
    """One implementation of an op. ``build`` is the op-specific factory (see each Op class).

    baseline: an anchor every run includes (torch's own implementation, the official package).
    parity: False for an anchor that computes something else (torch AdamW timed beside Adam-mini).
    tags: variant labels users filter on, e.g. ``{"state": "fp8"}`` for ``--state fp8``.
    tolerance: per-dtype override of the op's tolerance; give the reason in Tolerance.reason.
    """

    op: str
    name: str
    build: Callable[..., Any]
    requires: Requires = field(default_factory=Requires)
    tags: Mapping[str, str] = field(default_factory=dict)
    baseline: bool = False
    parity: bool = True
    mutates_inputs: bool = False
    tolerance: Mapping[str, Tolerance] | None = None  # by dtype name (see by_dtype)
    doc: str = ""
    module: str = ""  # where ``build`` is defined
    source: str = "kernelbench"  # kernelbench, plugin:NAME or module:NAME (see kernelbench.ops.plugins)


@dataclass(frozen=True)
class StateBytes:
    """Persistent state a candidate holds, how it was measured, and whether to trust it."""

    nbytes: int
    how: str
    trusted: bool = True


class Case(Protocol):
    """What the harness drives. ``run`` is the timed unit (one call, one optimizer step)."""

    def prepare(self) -> None:
        """Untimed work before each timed ``run`` (restore inputs a candidate mutates)."""

    def run(self) -> None:
        """The unit of work that is timed."""

    def set_step(self, step: int) -> None:
        """Parity: load the seeded inputs of step ``step`` (fresh inputs, next gradients)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Parity: the named results of the last ``run`` (outputs, grads, params, state)."""

    def state_bytes(self) -> StateBytes | None:
        """Persistent state the candidate holds (optimizers), None when not applicable."""


class Op(abc.ABC):
    """Base of every op. Subclasses (FunctionOp, OptimizerOp) define ``kind`` and build cases."""

    kind = "op"

    def __init__(
        self,
        name: str,
        *,
        doc: str,
        workloads: Sequence[Workload],
        reference: str | Callable[..., Any],
        tolerances: Mapping[Any, Tolerance] | None = None,
        tag_values: Mapping[str, Sequence[str]] | None = None,
        speed_anchor: str | None = None,
        tensor_tolerances: Mapping[str, Mapping[Any, Tolerance]] | None = None,
        model_layer: str | None = None,
    ) -> None:
        _check_name("op", name)
        if name in REGISTRY:
            raise DuplicateNameError(f"op '{name}' is already declared by {REGISTRY[name].source}")
        bad = [w for w in workloads if not isinstance(w, Workload)]
        if bad:
            raise RegistrationError(f"op '{name}': workloads must be Workload(...) objects, "
                                    f"got {type(bad[0]).__name__}")
        for w in workloads:
            _check_name(f"op '{name}': workload", w.name)
            if w.tier not in ("cpu", "gpu"):
                raise RegistrationError(f"op '{name}': workload '{w.name}' has tier {w.tier!r}; accepted: cpu, gpu")
        self.name = name
        self.doc = doc
        self.module = _declaring_module(self)
        self.source = source_of(self.module)
        self.workloads = {w.name: w for w in workloads}
        self.reference = reference
        self.tolerances = {**DEFAULT_TOLERANCES, **by_dtype(tolerances)}
        # Per result-tensor overrides (e.g. a gradient that sums M rounded products).
        self.tensor_tolerances = {k: by_dtype(v) for k, v in (tensor_tolerances or {}).items()}
        self.tag_values = {k: tuple(v) for k, v in (tag_values or {}).items()}
        # The candidate every other one's time is divided by in reports (the peer to beat).
        self.speed_anchor = speed_anchor
        # The slot of kernelbench.models' Llama this op is a layer of ("norm", "rotary"...), if
        # any: `train` trains such an op as the model built with each layer set.
        self.model_layer = model_layer
        self.candidates: dict[str, Candidate] = {}
        REGISTRY[name] = self

    # -- registration -------------------------------------------------------------------------
    def candidate(
        self,
        name: str,
        *,
        requires: Requires | None = None,
        tags: Mapping[str, str] | None = None,
        baseline: bool = False,
        parity: bool = True,
        mutates_inputs: bool = False,
        tolerance: Mapping[Any, Tolerance] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``build`` as candidate ``name`` of this op."""

        _check_name(f"op '{self.name}': candidate", name)
        if requires is not None and not isinstance(requires, Requires):
            raise RegistrationError(f"{self.name}/{name}: requires= takes Requires(...), got {type(requires).__name__}")

        def register(build: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(build):
                raise RegistrationError(f"{self.name}/{name}: @{self.name}.candidate(...) decorates a factory "
                                        f"function, got {type(build).__name__}")
            if name in self.candidates:
                raise DuplicateNameError(f"candidate '{name}' of op '{self.name}' is already registered by "
                                         f"{self.candidates[name].source}")
            for key, value in (tags or {}).items():
                allowed = self.tag_values.get(key)
                if allowed is None or value not in allowed:
                    raise RegistrationError(f"{self.name}/{name}: tag {key}={value} not in {allowed}")
            module = getattr(build, "__module__", None) or ""
            self.candidates[name] = Candidate(
                op=self.name,
                name=name,
                build=build,
                requires=requires or Requires(),
                tags=dict(tags or {}),
                baseline=baseline,
                parity=parity,
                mutates_inputs=mutates_inputs,
                tolerance=by_dtype(tolerance) if tolerance else None,
                doc=(build.__doc__ or "").strip().splitlines()[0] if (build.__doc__ or "").strip() else "",
                module=module,
                source=source_of(module),
            )
            return build

        return register

    # -- lookup ---------------------------------------------------------------------------------
    def workload(self, name: str) -> Workload:
        """A named workload (one written as a spec is resolved by kernelbench.session.plan)."""
        if name not in self.workloads:
            raise unknown_name_error(f"workload of op '{self.name}'", name, self.workloads)
        return self.workloads[name]

    def custom_workload(self, text: str) -> Workload | None:
        """The workload a spec written on the command line names (a shape, a parameter list: see
        :mod:`kernelbench.ops.shapes`), or None when ``text`` is not written as one."""
        return None

    def workload_forms(self) -> str | None:
        """How a workload may be written besides its names, in words (`list --workloads`)."""
        return None

    def sweep(self, sweep: str, base: str | None, tier: str) -> list[str]:
        """Workload specs of ``--sweep DIM=...`` around ``base`` (a spec; None: the op's own)."""
        raise UsageError(f"--sweep: op '{self.name}' declares no dimensions to sweep; its workloads: "
                         f"{', '.join(self.workloads)}")

    def anchor_for(self, candidate: str) -> str | None:
        """The candidate ``candidate``'s time is divided by in reports (default: ``speed_anchor``)."""
        return self.speed_anchor

    def workloads_for(self, tier: str) -> list[Workload]:
        return [w for w in self.workloads.values() if w.tier == tier]

    def get_candidate(self, name: str) -> Candidate:
        if name not in self.candidates:
            raise unknown_name_error(f"candidate of op '{self.name}'", name, self.candidates)
        return self.candidates[name]

    def select(
        self, names: Sequence[str] | None = None, tags: Mapping[str, str] | None = None
    ) -> list[Candidate]:
        """Candidates by explicit name, else those matching every tag plus the baselines."""
        if names:
            return [self.get_candidate(n) for n in names]
        for key, value in (tags or {}).items():
            if key not in self.tag_values:
                raise UsageError(
                    f"op '{self.name}' has no option --{key}"
                    + (f"; its options: {', '.join('--' + k for k in self.tag_values)}" if self.tag_values else "")
                )
            if value not in self.tag_values[key]:
                raise UsageError(
                    f"--{key} {value} is not accepted by op '{self.name}'; accepted: "
                    + ", ".join(self.tag_values[key])
                )
        chosen = []
        for cand in self.candidates.values():
            matches = all(cand.tags.get(k) == v for k, v in (tags or {}).items())
            if cand.baseline or matches:
                chosen.append(cand)
        return chosen

    def tolerance_for(self, candidate: Candidate | None, dtype: str | torch.dtype, tensor: str = "") -> Tolerance:
        """Candidate override, else the op's override for this result tensor, else by dtype."""
        dtype = dtype_name(dtype)
        if candidate is not None and candidate.tolerance and dtype in candidate.tolerance:
            return candidate.tolerance[dtype]
        by_tensor = self.tensor_tolerances.get(tensor, {})
        if dtype in by_tensor:
            return by_tensor[dtype]
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES["fp32"])

    def availability(self, candidate: Candidate, device: str) -> str:
        """Whether ``candidate`` runs on ``device`` here, in words (what `kernelbench list` shows)."""
        unmet = candidate.requires.unmet(device)
        if unmet:
            return f"no: {unmet}"
        return "interpreter: parity only" if candidate.requires.interpreted(device) else "yes"

    # -- what subclasses provide ----------------------------------------------------------------
    def modes(self) -> tuple[str, ...]:
        return ("step",)

    def default_modes(self) -> tuple[str, ...]:
        """The modes a run times when none is asked for (``-m`` picks any of ``modes()``)."""
        return self.modes()

    @abc.abstractmethod
    def make_case(self, candidate: Candidate, workload: Workload, device: str, mode: str) -> Case:
        """The case that runs ``candidate`` on ``workload``."""

    @abc.abstractmethod
    def make_reference_case(self, workload: Workload, device: str, mode: str) -> Case:
        """The case that runs the op's reference on ``workload``."""

    def bytes_moved(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        return None

    def flops(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        return None


def generator(device: str, seed: int) -> torch.Generator:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
