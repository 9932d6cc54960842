"""From what a user gave to a request: every check that needs no torch, and the choices a front
end should not make itself (the default suite, a suite's values under the command line's).

The CLI fills :class:`RunOptions` (None: not given) and calls :func:`run_request`; ``parity``
and ``train`` go through :func:`parity_request` and :func:`check_train`, ``list`` through
:func:`load_plugins`. An option added to ``run`` is a field here (with the flag errors name it
by) and, if it changes what runs, a field of :class:`~kernelbench.session.request.RunRequest`.
Plugins (``--plugin``, a suite's ``plugins``, installed entry points) are loaded here, before the
names a request gives are checked; each that does not load is one error line on the listener.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..harness.settings import (
    DEFAULT_PARITY_DETAIL,
    PARITY_DETAIL,
    PARITY_STEPS_BOUND,
    USER_SETTINGS,
    Bound,
    timing_config,
)
from ..ops import get_op, load_all, load_builtin
from ..ops.base import UsageError
from ..ops.launched_op import LaunchedOp, OpOption
from ..ops.plugins import Plugin
from .plan import check_entry
from .request import Entry, Listener, OutputSettings, RunRequest, TrainRequest

DEVICES = ("cpu", "cuda", "auto")


def check_bound(flag: str, value: float | None, bound: Bound) -> None:
    if value is not None and not bound.holds(value):
        raise UsageError(f"{flag} {value:g}: must be {bound.words()}")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise UsageError(f"--device {device}: accepted values are {', '.join(DEVICES)}")


def check_parity_detail(detail: str) -> None:
    if detail not in PARITY_DETAIL:
        raise UsageError(f"--parity-detail {detail}: accepted: {', '.join(PARITY_DETAIL)}")


def check_output_dir(path: Path | None, flag: str = "--output-dir") -> None:
    """A report folder that exists or can be made: not a file, not under a file."""
    if path is None:
        return
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{flag} {path}: is a file; name a folder (it is made if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: the folder is not writable")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, so no folder can be made under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot make it: {parent} is not writable")


def nvidia_device_present() -> bool:
    """An NVIDIA device node exists: the only case worth importing torch to ask CUDA."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


# ------------------------------------------------------------------------------------------------
def load_plugins(specs: Sequence[str] | None, listener: Listener | None = None) -> list[Plugin]:
    """The installed plugins and those ``specs`` name (``.py`` files or modules), as tried; a
    malformed spec is a UsageError, a plugin that does not load one error line on ``listener``."""
    from ..ops import plugins

    load_all()
    tried = plugins.installed() + plugins.load_many(specs)
    report_plugins(tried, listener or Listener())
    return tried


def report_plugins(tried: Iterable[Plugin], listener: Listener, *, reported: Iterable[Plugin] = ()) -> None:
    """One error line per plugin of ``tried`` that did not load (the rest still runs), except
    those already ``reported``."""
    done = {id(p) for p in reported}
    for line in dict.fromkeys(p.error_line() for p in tried if p.error and id(p) not in done):
        listener.error(line)


# ------------------------------------------------------------------------------------------------
# Options only some ops take (dist-adamw's --nproc...): declared by kernelbench's own ops (the CLI's
# help is written from them before any plugin is loaded), checked through them.
def launched_ops() -> list[LaunchedOp]:
    return [op for op in load_builtin().values() if isinstance(op, LaunchedOp)]


def op_option_flags() -> tuple[str, ...]:
    return tuple(dict.fromkeys(flag for op in launched_ops() for flag in op.options))


def _option_owners(flag: str) -> list[LaunchedOp]:
    return [op for op in launched_ops() if flag in op.options]


def _option(flag: str) -> OpOption:
    return _option_owners(flag)[0].options[flag]


def op_option_help(flag: str) -> str:
    """The help of a launched op's option, naming the ops that take it."""
    owners = _option_owners(flag)
    if not owners:
        return "(no op takes it)"
    return f"{', '.join(o.name for o in owners)} only: {owners[0].options[flag].help}"


def _foreign_options_error(given: dict[str, Any]) -> str:
    """Options of other ops given to an op that does not take them: whose they are, and any look-alike."""
    by_owner: dict[str, list[str]] = {}
    for flag in given:
        by_owner.setdefault(", ".join(sorted(o.name for o in _option_owners(flag))), []).append(flag)
    parts = [f"{', '.join(flags)}: {owner} options only (kernelbench run {owner.split(',')[0]} ...)"
             for owner, flags in by_owner.items()]
    hints = [_option(flag).elsewhere_hint for flag in given if _option(flag).elsewhere_hint]
    return "; ".join(parts + hints)


# ------------------------------------------------------------------------------------------------
def _flag(name: str, default: Any = None) -> Any:
    return field(default=default, metadata={"flag": name})


@dataclass
class RunOptions:
    """``kernelbench run``'s options as given; None means not given (a suite's value or the
    default applies). ``op_options``: launched ops' options that were given, by flag."""

    op: str | None = None
    config: Path | None = _flag("--config")
    candidates: list[str] | None = _flag("-c/--candidate")
    workloads: list[str] | None = _flag("-w/--workload")
    modes: list[str] | None = _flag("-m/--mode")
    state: str | None = _flag("--state")
    cuda_graph: bool | None = _flag("--cuda-graph")
    warmup_ms: float | None = _flag("--warmup-ms")
    rep_ms: float | None = _flag("--rep-ms")
    rounds: int | None = _flag("--rounds")
    flush_l2: bool | None = _flag("--no-flush-l2")
    settle_ms: float | None = _flag("--settle-ms")
    parity_steps: int | None = _flag("--parity-steps")
    telemetry: bool | None = _flag("--telemetry")
    seed: int | None = _flag("--seed")
    parity_detail: str | None = _flag("--parity-detail")
    sweep: str | None = _flag("--sweep")
    plugins: list[str] | None = None  # --plugin: loaded before anything is checked; any op takes it
    lock_clocks: bool | None = _flag("--lock-clocks")
    device: str = "auto"
    output_dir: Path | None = None
    op_options: dict[str, Any] = field(default_factory=dict)

    def given(self) -> dict[str, Any]:
        """Every option given, by the flag errors name it by."""
        named = {f.metadata["flag"]: getattr(self, f.name) for f in fields(self) if "flag" in f.metadata}
        return {flag: value for flag, value in {**named, **self.op_options}.items() if value is not None}

    def timing_values(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in USER_SETTINGS}

    @property
    def tags(self) -> dict[str, str]:
        return {"state": self.state} if self.state else {}


# Options that choose what runs: an op's, not a suite's (its tables choose).
_CHOOSING = ("-c/--candidate", "-w/--workload", "-m/--mode", "--state", "--telemetry", "--parity-steps", "--sweep")


def run_request(options: RunOptions, listener: Listener | None = None) -> RunRequest:
    """The request ``kernelbench run`` makes of these options; a UsageError names what is wrong.

    Without an op: the suite given by --config, else configs/ci.toml on a CUDA machine and
    configs/quick.toml without one; the command line's timing values override the suite's, and its
    launched ops' options (--nproc...) those of the suite's tables whose op takes them."""
    listener = listener or Listener()
    tried = load_plugins(options.plugins, listener)
    given = options.given()
    for f in fields(options):
        setting = USER_SETTINGS.get(f.name)
        if setting is not None and setting.bound is not None:
            check_bound(f.metadata["flag"], getattr(options, f.name), setting.bound)
    check_bound("--parity-steps", options.parity_steps, Bound(0))
    for flag, value in options.op_options.items():
        _option(flag).check(value)
    if options.parity_detail is not None:
        check_parity_detail(options.parity_detail)
    check_output_dir(options.output_dir)
    if options.op is not None and options.config is not None:
        raise UsageError("give an op or --config, not both")
    target = get_op(options.op) if options.op is not None else None
    if isinstance(target, LaunchedOp):
        wrong = [k for k in given if k not in target.takes and k not in target.options]
        if wrong:
            raise UsageError(f"{', '.join(wrong)}: not accepted by {target.name}, which takes "
                             f"{target.accepted_text()}")
    elif options.op_options and target is not None:
        raise UsageError(_foreign_options_error(options.op_options))
    if options.op is None:
        chooses = [k for k in _CHOOSING if k in given]
        if chooses:
            raise UsageError(f"{', '.join(chooses)}: choose what runs, so they need an op "
                             "(kernelbench run OP ...); a suite's [[bench]] / [[parity]] tables choose for it")
        return _suite_request(options, listener, tried)
    entry = Entry(options.op, options.workloads, options.candidates, options.modes, options.tags,
                  sweep=options.sweep)
    check_entry(entry)
    parity = ()
    if options.parity_steps:
        parity = (Entry(options.op, options.workloads, options.candidates, options.modes, options.tags,
                        steps=options.parity_steps, sweep=options.sweep),)
        check_entry(parity[0], parity=True)
    return RunRequest("run", options.op, bench=(entry,), parity=parity, device=options.device,
                      timing=timing_config(options.timing_values()), seed=options.seed or 0,
                      telemetry=bool(options.telemetry), op_options=dict(options.op_options),
                      lock_clocks=bool(options.lock_clocks),
                      output=OutputSettings(options.output_dir, options.parity_detail or DEFAULT_PARITY_DETAIL))


def _suite_request(options: RunOptions, listener: Listener, reported: list[Plugin]) -> RunRequest:
    from ..config import configs_dir, load_suite

    config = options.config
    check_device(options.device)
    if config is None:
        on_gpu = options.device == "cuda" or (options.device == "auto" and nvidia_device_present()
                                              and _cuda_visible())
        config = configs_dir() / ("ci.toml" if on_gpu else "quick.toml")
        listener.note(f"No op given: running the default suite {config}"
                      + ("" if on_gpu else " (the CPU suite: no CUDA device)"))
    suite = load_suite(config)
    report_plugins(suite.plugins, listener, reported=reported)
    launched = [get_op(e.op) for e in suite.bench if isinstance(get_op(e.op), LaunchedOp)]
    unused = [flag for flag in options.op_options if not any(flag in op.options for op in launched)]
    if unused:
        raise UsageError(f"{', '.join(unused)}: no [[bench]] table of {config} runs an op that takes "
                         f"{'it' if len(unused) == 1 else 'them'}; {_foreign_options_error(dict.fromkeys(unused))}")
    # A value given on the command line wins over the suite's, even when it equals the default.
    timing = timing_config(options.timing_values(), base=timing_config(suite.settings))
    device = options.device if options.device != "auto" else suite.settings.get("device", "auto")
    recorded = {k: v for k, v in suite.settings.items() if k not in USER_SETTINGS}
    return RunRequest("run", config.stem, bench=tuple(suite.bench), parity=tuple(suite.parity), device=device,
                      timing=timing, seed=options.seed or 0, lock_clocks=bool(options.lock_clocks),
                      op_options=dict(options.op_options),
                      output=OutputSettings(options.output_dir, options.parity_detail or DEFAULT_PARITY_DETAIL),
                      recorded=recorded)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def parity_request(op: str, *, steps: int, atol: float | None = None, rtol: float | None = None,
                   candidates: list[str] | None = None, workloads: list[str] | None = None,
                   modes: list[str] | None = None, state: str | None = None, device: str = "auto",
                   output_dir: Path | None = None, parity_detail: str | None = None,
                   seed: int | None = None, fsdp: bool = False, nproc: int | None = None,
                   sweep: str | None = None, plugins: Sequence[str] | None = None,
                   listener: Listener | None = None) -> RunRequest:
    """The request ``kernelbench parity`` makes: every runnable candidate against the reference
    (with ``fsdp``: each candidate under FSDP2 on ``nproc`` ranks against itself unsharded)."""
    load_plugins(plugins, listener)
    fsdp_nproc = check_fsdp(fsdp, nproc)
    check_bound("--steps", steps, PARITY_STEPS_BOUND)
    check_bound("--atol", atol, Bound(0))
    check_bound("--rtol", rtol, Bound(0))
    parity_detail = parity_detail or DEFAULT_PARITY_DETAIL
    check_parity_detail(parity_detail)
    check_output_dir(output_dir)
    tags = {"state": state} if state else {}
    entry = Entry(op, workloads, candidates, modes, tags, steps=steps, atol=atol, rtol=rtol, sweep=sweep)
    if fsdp_nproc is None:
        check_entry(entry, parity=True)
    elif modes:
        raise UsageError("-m/--mode does not apply under --fsdp (an optimizer's step has one mode)")
    elif sweep:
        raise UsageError("--sweep does not apply under --fsdp (-w names models there)")
    if fsdp_nproc is not None:
        _check_fsdp_plugins(plugins)
    return RunRequest("parity", op, parity=(entry,), device=device, seed=seed or 0,
                      output=OutputSettings(output_dir, parity_detail), fsdp_nproc=fsdp_nproc)


def check_fsdp(fsdp: bool, nproc: int | None) -> int | None:
    """--fsdp's rank count (2 unless --nproc says), or None without --fsdp; --nproc alone is an error."""
    if nproc is not None and not fsdp:
        raise UsageError("--nproc sets the ranks of --fsdp; add --fsdp (dist-adamw takes --nproc under run)")
    if not fsdp:
        return None
    check_bound("--nproc", nproc, Bound(1))
    return nproc or 2


def _check_fsdp_plugins(plugins: Sequence[str] | None) -> None:
    # The ranks look candidates up by name in their own registry, which loads installed plugins only.
    if plugins:
        raise UsageError("--plugin does not reach --fsdp's ranks: install the plugin's package (its "
                         "kernelbench.plugins entry point loads in every rank)")


def check_train(request: TrainRequest, listener: Listener | None = None) -> None:
    """What ``kernelbench train`` can check before torch is imported, after loading the plugins
    the request names (a layer op's candidate may be a plugin's)."""
    load_plugins(request.plugins, listener)
    if request.fsdp_nproc is not None:
        _check_fsdp_plugins(request.plugins)
    check_bound("--rtol", request.rtol, Bound(0))
    check_bound("--nproc", request.fsdp_nproc, Bound(1))
    check_output_dir(request.output.folder)
