"""Ops and candidates from outside kernelbench, through the API the built-in ones use.

A plugin is a Python module that, when imported, declares ops (``FunctionOp(...)``,
``OptimizerOp(...)``) and registers candidates (``@op.candidate(...)``, on its own ops or on
kernelbench's: ``get_op("rmsnorm").candidate("my-triton")``). It comes from:

- an installed package's entry point in the group ``kernelbench.plugins``, whose value is the
  module (``my_rmsnorm = "my_rmsnorm.plugin"``) or a function that registers when called;
  these load with the registry (:func:`kernelbench.ops.load_all`), not before: ``--help`` imports
  none, and a plugin that imports torch only inside its factories (as kernelbench's own op modules
  do) keeps ``kernelbench list`` free of torch;
- ``--plugin path/to/file.py`` or ``--plugin module.name`` on the command line, or a suite's
  ``plugins = [...]`` (paths relative to the suite file).

A plugin that fails to import, registers a name already taken or breaks the API is reported in one
line naming it and what is wrong (:func:`errors`); whatever it had registered is removed, and
everything else still runs. Each op and candidate a plugin brings is labelled ``plugin:NAME``
(its ``source``), which the reports carry.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .base import REGISTRY, DuplicateNameError, RegistrationError, UsageError

ENTRY_POINT_GROUP = "kernelbench.plugins"


@dataclass
class Plugin:
    """One plugin as loaded (or not): what it brought, or the one line that says why not."""

    name: str
    origin: str  # "entry point", "--plugin", "suite <file>"
    target: str  # the module, the function (module:attr) or the file
    distribution: str = ""  # "my-rmsnorm 0.1.0" for an entry point
    ops: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # "op/candidate"
    error: str | None = None

    @property
    def source(self) -> str:
        return f"plugin:{self.name}"

    def describe(self) -> str:
        where = f"{self.origin} {self.target}" + (f" from {self.distribution}" if self.distribution else "")
        return f"plugin '{self.name}' ({where})"

    def error_line(self) -> str | None:
        """The one line that names this plugin and why it did not load (None if it loaded)."""
        return f"{self.describe()}: {self.error}" if self.error else None

    def as_dict(self) -> dict:
        return asdict(self) | {"source": self.source}


# Every plugin this process tried, by target (a file's resolved path, or the module / function).
PLUGINS: dict[str, Plugin] = {}
_entry_points_loaded = False


def errors() -> list[str]:
    """One line per plugin that did not load."""
    return [p.error_line() for p in PLUGINS.values() if p.error]


def installed() -> list[Plugin]:
    """The installed plugins (entry points) this process tried."""
    return [p for p in PLUGINS.values() if p.origin == "entry point"]


def records() -> list[dict]:
    """What run.json records: every plugin tried, what it brought, and any error."""
    return [p.as_dict() for p in PLUGINS.values()]


def load_entry_points() -> list[Plugin]:
    """Every installed ``kernelbench.plugins`` entry point, once per process."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else ""
        plugin = Plugin(ep.name, "entry point", ep.value, distribution=label)
        loaded.append(_load(plugin, lambda ep=ep: _call_if_function(ep.load()), _module_of(ep.value)))
    return loaded


def load(spec: str, origin: str = "--plugin", base: Path | None = None) -> Plugin:
    """A plugin named by ``spec``: a ``.py`` file (relative to ``base`` when given) or a module.
    Loading the same one twice is a no-op that returns its first record."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError(f"{origin} {spec!r}: expected a path to a .py file or a module name")
    from . import load_all

    load_all()  # what the plugin finds already there is not its own
    spec = spec.strip()
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        path = Path(spec)
        if base is not None and not path.is_absolute():
            path = base / path
        path = path.resolve()
        key = str(path)
        if key in PLUGINS:
            return PLUGINS[key]
        plugin = Plugin(spec, origin, key)
        if not path.is_file():
            plugin.error = f"no such file: {path}"
            PLUGINS[key] = plugin
            return plugin
        module = _file_module_name(path)
        return _load(plugin, lambda: _import_file(module, path), module, key)
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_]\w*)?", spec):
        raise UsageError(f"{origin} {spec}: not a .py file or a module name (e.g. my_kernels.plugin)")
    if spec in PLUGINS:
        return PLUGINS[spec]
    plugin = Plugin(spec, origin, spec)
    return _load(plugin, lambda: _import_target(spec), _module_of(spec))


def load_many(specs, origin: str = "--plugin", base: Path | None = None) -> list[Plugin]:
    return [load(spec, origin, base) for spec in specs or ()]


# ------------------------------------------------------------------------------------------------
def _module_of(target: str) -> str:
    return target.split(":", 1)[0].strip()


def _call_if_function(obj) -> None:
    """An entry point names a module (registration on import) or a function that registers."""
    if callable(obj) and not isinstance(obj, type):
        obj()
    elif not hasattr(obj, "__file__") and not hasattr(obj, "__path__"):
        raise RegistrationError(f"the entry point names a {type(obj).__name__}; expected a module, or a "
                                "function that registers ops and candidates when called")


def _import_target(spec: str) -> None:
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    if attr:
        obj = getattr(obj, attr)
    _call_if_function(obj)


def _file_module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    return f"kernelbench_plugin_{stem}_{digest}"


def _import_file(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _snapshot() -> dict[str, set[str]]:
    return {name: set(op.candidates) for name, op in REGISTRY.items()}


def _belongs(module: str, package: str) -> bool:
    return bool(package) and (module == package or module.startswith(package + "."))


def _load(plugin: Plugin, do_import, module: str, key: str | None = None) -> Plugin:
    """Imports a plugin; records what it registered, or rolls that back and records why not."""
    PLUGINS[key or plugin.target] = plugin
    before = _snapshot()
    modules_before = set(sys.modules)
    try:
        do_import()
    except Exception as exc:  # reported in one line, never raised: the rest still runs
        _roll_back(before)
        for name in set(sys.modules) - modules_before:
            sys.modules.pop(name, None)  # a later attempt imports it afresh
        plugin.error = _describe_failure(exc)
        return plugin
    # What it registered: new names since the import started, and anything registered from its
    # package earlier (a test that imported the module before the registry loaded plugins).
    package = module.rpartition(".")[0] or module  # my_kernels.plugin -> my_kernels
    for name, op in REGISTRY.items():
        if name not in before or _belongs(op.module, package):
            op.source = plugin.source
            plugin.ops.append(name)
        for cand_name, cand in op.candidates.items():
            new = name not in before or cand_name not in before[name]
            if new or _belongs(cand.module, package):
                cand.source = plugin.source
                plugin.candidates.append(f"{name}/{cand_name}")
    if not plugin.ops and not plugin.candidates:
        plugin.error = ("registers no op and no candidate (a plugin declares ops with FunctionOp(...) / "
                        "OptimizerOp(...) or registers candidates with @op.candidate(...) when imported)")
    return plugin


def _roll_back(before: dict[str, set[str]]) -> None:
    for name in list(REGISTRY):
        if name not in before:
            del REGISTRY[name]
            continue
        op = REGISTRY[name]
        for cand in list(op.candidates):
            if cand not in before[name]:
                del op.candidates[cand]


def _describe_failure(exc: Exception) -> str:
    done = "; nothing of it was loaded"
    if isinstance(exc, DuplicateNameError):
        return f"registers a name already taken: {exc}{done}"
    if isinstance(exc, RegistrationError):
        return f"breaks the plugin API: {exc}{done}"
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "importlib" not in f.filename and "kernelbench/ops/plugins" not in f.filename]
    where = f" (at {os.path.basename(mine[-1].filename)}:{mine[-1].lineno})" if mine else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed to import: {type(exc).__name__}: {text}{where}{done}"
