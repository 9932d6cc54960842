"""Per-shape choice between kernelbench's Triton kernels and PyTorch, measured once, cached on disk.

``RMSNorm(..., impl="auto")``, ``apply_rotary(..., impl="auto")`` and ``silu_mul(..., impl="auto")``
call :func:`choose_impl` with their module's ``AUTOSELECT`` :class:`Candidates` (this module
imports none of them). The first time a (op, shape, dtype, mode, variant) is seen on a GPU, each
implementation runs a few times (CUDA events, interleaved, median of ``REPS``) and the faster is
kept, in memory and in a JSON file (``$KERNELBENCH_CACHE_DIR/autoselect.json``, default
``~/.cache/kernelbench/autoselect.json``) keyed also by GPU name and torch / triton versions, so
another process reads the answer instead of measuring again. Without CUDA nothing is timed: the
answer is "torch" ("no CUDA: timings not measured"). Without Triton the answer is "torch", with
one log line. A call being traced by torch.compile measures nothing and reads no file: see
:func:`compiled_choice`; an op whose ``Candidates.traced`` names an implementation takes that one
there (rotary: torch's formula, which Inductor fuses with the copies beside it).

What is timed is the call on its own, so where launching a call takes the host longer than its
kernels take the GPU, the host's time decides, as it does in a host-bound training step; inside a
step whose matrix products keep the GPU busy the host's time is hidden and only the kernels'
counts, so there the choice can be the slower path (RMSNorm: torch's at every shape of the model
grid, 1-4% of the eager step lost on its device-bound rows; results/2026-11-28-2xh200-host-bound-floor).

``kernelbench.nn.autoselect_report`` (:func:`autoselect_report` for an op named "rmsnorm",
"rotary" or "swiglu") is what ``kernelbench autoselect rmsnorm --shape 16x2048x4096 --dtype bf16``
prints: each implementation's time and the choice.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .._timer import RepTimer

log = logging.getLogger("kernelbench.nn")

CACHE_ENV = "KERNELBENCH_CACHE_DIR"
CACHE_FILE = "autoselect.json"
MODES = ("fwd", "fwd+bwd")
IMPLEMENTATIONS = ("triton", "torch")
# A choice is measured once per shape and process, then cached: 25 reps of a sub-millisecond call
# cost little. What a choice still depends on: results/2026-11-29-h200-autoselect-stability.
WARMUP, REPS = 3, 25

_memory: dict[str, dict] = {}
_warned_no_triton = False

Timer = Callable[[dict[str, Callable[[], None]]], dict[str, float]]


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "kernelbench")
    return Path(root) / CACHE_FILE


def clear_memory_cache() -> None:
    """Forget in-process answers (the file stays): the next call reads the file again."""
    _memory.clear()
    _choices.clear()
    _traced.clear()


@functools.cache
def _triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return None
    import triton

    return triton.__version__


@functools.cache
def _device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


def cache_key(op: str, shape: tuple, dtype: torch.dtype, device: str, mode: str, variant: str = "") -> str:
    dims = "x".join(str(int(d)) for d in shape)
    return "|".join([
        op, variant or "-", dims, str(dtype).removeprefix("torch."), mode, _device_name(device),
        f"torch {torch.__version__}", f"triton {_triton_version() or 'none'}",
    ])


# ------------------------------------------------------------------------------------------------
# What is timed: each op's module passes its own candidates (this module imports none of them)
# ------------------------------------------------------------------------------------------------
Runners = Callable[[tuple, torch.dtype, str, str, str], dict[str, Callable[[], None]]]


def _no_blocker(shape: tuple) -> str | None:
    return None


def _any_shape(shape: tuple) -> None:
    return None


@dataclass(frozen=True)
class Candidates:
    """The implementations of one op that auto-selection times.

    ``runners(shape, dtype, device, mode, variant)`` returns {implementation: a call to time},
    one per name of ``IMPLEMENTATIONS``; ``blocker(shape)`` says why Triton cannot take a shape
    (None when it can); ``check_shape(shape)`` raises ValueError on a shape the op cannot mean."""

    op: str
    runners: Runners
    blocker: Callable[[tuple], str | None] = _no_blocker
    check_shape: Callable[[tuple], None] = _any_shape
    # The implementation a call traced by torch.compile takes whatever eager calls chose (None:
    # theirs, see compiled_choice): for an op Inductor does better fusing into its neighbours.
    traced: str | None = None


def _triton_blocker(candidates: Candidates, shape: tuple) -> str | None:
    """Why the Triton implementation is out for this shape, or None."""
    if _triton_version() is None:
        return "triton not installed"
    return candidates.blocker(shape) if shape else None


def cuda_event_timer(runners: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Median ms per runner: WARMUP untimed calls each, then REPS rounds interleaving them; a
    per-shape choice needs no L2 flush or rounds of the harness's loop."""
    for run in runners.values():
        for _ in range(WARMUP):
            run()
    timers = {name: RepTimer("cuda", reserve=REPS) for name in runners}
    # From an idle GPU, as the call runs on its own: behind the queue of a model step's earlier
    # kernels the first reps would time the GPU's work alone, the later ones the host's pace too.
    torch.cuda.synchronize()
    for _ in range(REPS):
        for name, run in runners.items():
            timers[name](run)
    result = {}
    for name, timer in timers.items():
        times = sorted(timer.times_ms())
        result[name] = times[len(times) // 2]
    return result


# ------------------------------------------------------------------------------------------------
# The cache file
# ------------------------------------------------------------------------------------------------
def _read_file() -> dict:
    path = cache_path()
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("kernelbench autoselect: ignoring unreadable cache %s (%s)", path, exc)
        return {}


def _write_entry(key: str, entry: dict) -> None:
    """Merge one entry into the file (read, update, atomic replace: concurrent writers lose
    nothing but the rare entry written between another's read and replace)."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_file()
        data[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autoselect-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home must not break a forward pass
        log.warning("kernelbench autoselect: could not write %s (%s)", path, exc)


# ------------------------------------------------------------------------------------------------
# Public
# ------------------------------------------------------------------------------------------------
def autoselect_report(
    candidates: Candidates,
    shape: tuple,
    dtype: torch.dtype,
    *,
    mode: str = "fwd+bwd",
    variant: str = "",
    device: str | None = None,
    timer: Timer | None = None,
    refresh: bool = False,
) -> dict:
    """Measure (or read from the cache) the ``candidates`` of an op for ``shape`` / ``dtype``.

    shape and variant as the op's candidates take them (``kernelbench.nn.autoselect_report``
    names them by op). ``timer`` replaces CUDA-event timing
    (tests). ``refresh`` measures again and overwrites the cached answer.

    Returns {"op", "shape", "dtype", "mode", "variant", "device", "key", "times_ms" (impl ->
    median ms, or None where not measured), "choice", "reason", "source" ("measured", "memory" or
    "file"), "cache_file"}.
    """
    op = candidates.op
    if mode not in MODES:
        raise ValueError(f"autoselect: unknown mode {mode!r}; known: {', '.join(MODES)}")
    shape = tuple(int(d) for d in shape)
    candidates.check_shape(shape)
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"autoselect: shape must be non-empty with positive dims, got {shape}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(torch.device(device))
    key = cache_key(op, shape, dtype, device, mode, variant)
    base = {"op": op, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "mode": mode,
            "variant": variant, "device": _device_name(device), "key": key, "cache_file": str(cache_path())}

    if not refresh:
        if key in _memory:
            return {**base, **_memory[key], "source": "memory"}
        stored = _read_file().get(key)
        if stored is not None:
            _memory[key] = stored
            return {**base, **stored, "source": "file"}

    entry = _decide(candidates, shape, dtype, device, mode, variant, timer)
    _memory[key] = entry
    if entry["measured"]:
        _write_entry(key, entry)
    return {**base, **entry, "source": "measured"}


def _decide(candidates, shape, dtype, device, mode, variant, timer) -> dict:
    global _warned_no_triton
    blocker = _triton_blocker(candidates, shape)
    if blocker == "triton not installed" and not _warned_no_triton:
        log.info("triton not installed; RMSNorm, rotary and SwiGLU use PyTorch")
        _warned_no_triton = True
    if blocker is not None:
        return {"times_ms": {impl: None for impl in IMPLEMENTATIONS}, "choice": "torch",
                "reason": blocker, "measured": False}
    if timer is None:
        if torch.device(device).type != "cuda":
            return {"times_ms": {impl: None for impl in IMPLEMENTATIONS}, "choice": "torch",
                    "reason": "no CUDA: timings not measured", "measured": False}
        timer = cuda_event_timer
    runners = candidates.runners(shape, dtype, device, mode, variant)
    times = timer(runners)
    choice = min(times, key=times.get)
    others = ", ".join(f"{name} {ms:.4g} ms" for name, ms in times.items() if name != choice)
    return {"times_ms": dict(times), "choice": choice,
            "reason": f"fastest measured: {choice} {times[choice]:.4g} ms (vs {others}), median of {REPS}",
            "measured": True}


# Answers of this process by (op, shape, dtype, device, mode, variant), a tuple of the values
# themselves, so a repeated eager call costs one dict lookup (no key string, no file).
_choices: dict[tuple, str] = {}


def choose_impl(
    candidates: Candidates,
    shape: tuple,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    requires_grad: bool,
    variant: str = "",
) -> str:
    """"triton" or "torch" for this call; what ``impl="auto"`` resolves to.

    Under torch.compile nothing here is traced: :func:`compiled_choice` runs once at trace time
    and its answer is a constant of the graph (no guard, no recompilation)."""
    mode = "fwd+bwd" if requires_grad else "fwd"
    op = candidates.op
    if torch.compiler.is_compiling():
        return candidates.traced or compiled_choice(op, dtype, str(device), mode, variant)
    key = (op, shape, dtype, device, mode, variant)
    choice = _choices.get(key)
    if choice is None:
        if math.prod(shape) == 0:
            return "torch"
        device_name = str(torch.device(device))
        choice = autoselect_report(candidates, tuple(shape), dtype, mode=mode, variant=variant,
                                   device=device_name)["choice"]
        _choices[key] = choice
        _traced[op] = candidates.traced
    for seen in _recorders:
        seen[key] = choice
    return choice


# Each op's ``Candidates.traced``, as its first eager call gave it (describe_choices reads it).
_traced: dict[str, str | None] = {}
# Open recordings (recording_choices): each collects the eager choices made while it is open.
_recorders: list[dict[tuple, str]] = []


@contextlib.contextmanager
def recording_choices() -> Iterator[dict[tuple, str]]:
    """Collects {(op, shape, dtype, device, mode, variant): choice} of every eager ``impl="auto"``
    call made inside, answered from the cache or measured: what a model's step ran. A traced call
    takes what the eager calls chose (:func:`compiled_choice`) and is not recorded here."""
    seen: dict[tuple, str] = {}
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.remove(seen)


def _fixed_when_traced(op: str, traced: bool) -> str | None:
    """The implementation ``op``'s calls take in a compiled model (``traced``) whatever their
    eager choice, or None."""
    return _traced.get(op) if traced else None


def choices_as_run(choices: dict[tuple, str], *, traced: bool = False) -> dict[tuple, str]:
    """The implementation each recorded call runs: its choice, or, in a compiled model
    (``traced``), the one its op's traced calls take where that is fixed."""
    return {key: _fixed_when_traced(key[0], traced) or choice for key, choice in choices.items()}


def describe_choices(choices: dict[tuple, str], *, traced: bool = False) -> str:
    """The choices on one line, ``rmsnorm residual 8192x896 bfloat16 fwd+bwd: torch; ...``;
    ``traced``: as a compiled model runs them, where an op's traced calls take a fixed implementation."""
    parts = []
    for (op, shape, dtype, _device, mode, variant), choice in sorted(choices.items(), key=lambda kv: str(kv[0])):
        dims = "x".join(str(int(d)) for d in shape)
        name = f"{op} {variant}" if variant else op
        fixed = _fixed_when_traced(op, traced)
        shown = f"{fixed} (traced; eager {choice})" if fixed else choice
        parts.append(f"{name} {dims} {str(dtype).removeprefix('torch.')} {mode}: {shown}")
    return "; ".join(parts)


def choices_made() -> dict[tuple, str]:
    """This process's answers so far: {(op, shape, dtype, device, mode, variant): "triton" or "torch"}."""
    return dict(_choices)


@torch.compiler.assume_constant_result
def compiled_choice(op: str, dtype: torch.dtype, device: str, mode: str, variant: str) -> str:
    """The choice for a call being traced, made at trace time from constants only (a shape may
    be symbolic there): what the last eager call of this process with the same op, dtype,
    device, mode and variant chose, else Triton where it can run. Nothing is measured or read
    from disk while tracing; run the model once eagerly to have its shapes measured."""
    dev = torch.device(device)
    for (k_op, _, k_dtype, k_device, k_mode, k_variant), choice in reversed(_choices.items()):
        if (k_op, k_dtype, torch.device(k_device), k_mode, k_variant) == (op, dtype, dev, mode, variant):
            return choice
    usable = _triton_version() is not None and dev.type == "cuda"
    return "triton" if usable else "torch"
