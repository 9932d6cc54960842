"""Suites: TOML files naming what to benchmark and check (configs/quick.toml, ci.toml, full.toml).

    [suite]                      # all keys optional; the defaults are harness.settings.TimingConfig's
    device = "cuda"              # cpu | cuda | auto
    plugins = ["my_kernels.py"]  # --plugin for the suite: .py files (relative to this file) or modules
    warmup_ms = 10
    rep_ms = 50
    rounds = 2                   # interleaved rounds per workload
    cuda_graph = false
    flush_l2 = true

    [[bench]]                    # one table per op to time
    op = "adamw"
    workloads = ["single-4096x1024"]   # default: the tier of the device; shapes too ("4096x1024:bf16")
    sweep = "N=256..65536"             # one dimension swept around the one workload given (or the op's example)
    candidates = ["torch-fused"]       # default: every candidate (after tags)
    exclude = ["torch-compile"]        # drop these from the default
    modes = ["fwd"]                    # default: every mode of the op
    tags = { state = "fp8" }           # the CLI's --state fp8

    [[parity]]                   # one table per op to check; same keys, plus
    steps = 5                    # and atol, rtol (default: the op's tolerances)

An op that starts processes of its own (dist-adamw, dist-train-step) runs its candidates in each
launch: its [[bench]] table takes op, workloads, candidates where the op takes -c (dist-train-step)
and its own options by their names, ``options = { nproc = 4, stall_s = 60 }`` (the command line's
--nproc, --stall-s...).

Unknown keys, unknown names and values out of bounds are errors that name the file, the key and
what is accepted; every one in the file is reported at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .harness.settings import USER_SETTINGS, Bound
from .ops import get_op
from .ops.base import UsageError
from .ops.plugins import Plugin
from .session.plan import check_sweep, resolve_workload
from .session.request import Entry

SUITE_KEYS = {"name", "description", "device", "plugins", *USER_SETTINGS}
ENTRY_KEYS = {"op", "workloads", "candidates", "exclude", "modes", "tags", "sweep", "options"}
PARITY_KEYS = (ENTRY_KEYS - {"options"}) | {"steps", "atol", "rtol"}
TOP_KEYS = {"suite", "bench", "parity"}
DEVICES = ("cpu", "cuda", "auto")


class ConfigError(UsageError):
    pass


@dataclass
class Suite:
    path: Path
    settings: dict[str, Any]
    bench: list[Entry]
    parity: list[Entry]
    plugins: list[Plugin] = field(default_factory=list)  # those [suite].plugins names, loaded or not


class _Problems:
    """Every problem of one file, raised together as one line naming the file."""

    def __init__(self, path: Path) -> None:
        self.path, self.items = path, []

    def add(self, text: str) -> None:
        self.items.append(text)

    def keys(self, where: str, table: dict, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                self.add(f"unknown key '{key}' in {where}; accepted: {', '.join(sorted(allowed))}")

    def typed(self, where: str, key: str, value: Any, kind: type | tuple) -> bool:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.add(f"{where}.{key} = {value!r}: expected {names}")
            return False
        return True

    def bounded(self, where: str, key: str, value: Any, kind: type | tuple, bound: Bound | None) -> bool:
        if not self.typed(where, key, value, kind):
            return False
        if bound is not None and not isinstance(value, bool) and not bound.holds(value):
            self.add(f"{where}.{key} = {value}: must be {bound.words()}")
            return False
        return True

    def str_list(self, where: str, key: str, value: Any) -> bool:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.add(f"{where}.{key} = {value!r}: expected a list of strings")
            return False
        return True

    def raise_any(self) -> None:
        if self.items:
            count = f"{len(self.items)} problems: " if len(self.items) > 1 else ""
            raise ConfigError(f"{self.path}: {count}" + "; ".join(self.items))


def _entry(problems: _Problems, where: str, table: Any, allowed: set[str]) -> Entry | None:
    if not isinstance(table, dict):
        problems.add(f"{where} = {table!r}: expected a table (write it as {where.split()[0]})")
        return None
    before = len(problems.items)
    problems.keys(where, table, allowed)
    lists = {key: table[key] for key in ("workloads", "candidates", "modes", "exclude")
             if key in table and problems.str_list(where, key, table[key])}
    if "steps" in table:
        problems.bounded(where, "steps", table["steps"], int, Bound(1))
    for key in ("atol", "rtol"):
        if key in table:
            problems.bounded(where, key, table[key], (int, float), Bound(0))
    if "sweep" in table:
        problems.typed(where, "sweep", table["sweep"], str)
    tags = table.get("tags", {})
    if not isinstance(tags, dict):
        problems.add(f"{where}: tags = {tags!r}: expected a table like {{ state = \"fp8\" }}")
        tags = None
    if "op" not in table:
        problems.add(f"{where} has no 'op' key")
    elif problems.typed(where, "op", table["op"], str):
        _check_names(problems, where, table, lists, tags)
    if len(problems.items) > before:
        return None
    entry = Entry(op=table["op"], tags=dict(tags or {}), sweep=table.get("sweep"))
    if "options" in table:
        op = get_op(table["op"])
        entry.options = {op.option_by_key(key).flag: value for key, value in table["options"].items()}
    for key, value in lists.items():
        setattr(entry, key, value)
    if "steps" in table:
        entry.steps = table["steps"]
    for key in ("atol", "rtol"):
        if key in table:
            setattr(entry, key, float(table[key]))
    return entry


def _check_names(problems: _Problems, where: str, table: dict, lists: dict[str, list[str]],
                 tags: dict | None) -> None:
    """Each name the table gives exists in the registry (every unknown one is reported)."""
    def check(fn, *args) -> None:
        try:
            fn(*args)
        except UsageError as exc:
            problems.add(f"{where}: {exc}")

    try:
        op = get_op(table["op"])
    except UsageError as exc:
        problems.add(f"{where}: {exc}")
        return
    if isinstance(table.get("sweep"), str):
        if len(lists.get("workloads", [])) > 1:
            problems.add(f"{where}: sweep takes at most one workload, the shape it varies; got "
                         f"{', '.join(lists['workloads'])}")
        else:
            check(check_sweep, op, table["sweep"], lists.get("workloads"))
    else:
        for name in lists.get("workloads", []):
            check(resolve_workload, op, name)
    for name in lists.get("candidates", []) + lists.get("exclude", []):
        check(op.get_candidate, name)
    for mode in lists.get("modes", []):
        if mode not in op.modes():
            problems.add(f"{where}: op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")
    if op.kind == "multi-process":
        chooses = "-c/--candidate" in op.takes
        own = [k for k in ("exclude", "modes", "tags") if k in table]
        if "candidates" in table and not chooses:
            own.insert(0, "candidates")
        if own or where.startswith("[[parity]]"):
            takes = "op, workloads, candidates and options" if chooses else "op, workloads and options"
            problems.add(f"{where}: op '{op.name}' runs its candidates in its own processes and checks them "
                         f"there: a [[bench]] table with {takes} only" + (f" (drop {', '.join(own)})" if own else ""))
        if "options" in table:
            _check_options(problems, where, op, table["options"])
    elif "options" in table:
        problems.add(f"{where}: options are for ops that start processes of their own (dist-adamw, "
                     f"dist-train-step); op '{op.name}' takes its timing settings from [suite]")
    if tags is not None:
        check(op.select, None, tags)


def _check_options(problems: _Problems, where: str, op, options: Any) -> None:
    if not isinstance(options, dict):
        problems.add(f"{where}: options = {options!r}: expected a table like {{ nproc = 4 }}")
        return
    for key, value in options.items():
        option = op.option_by_key(key)
        if option is None:
            accepted = ", ".join(o.key for o in op.options.values())
            problems.add(f"{where}: op '{op.name}' has no option '{key}'; accepted: {accepted}")
            continue
        problem = option.config_problem(value)
        if problem:
            problems.add(f"{where}: options.{problem}")


def load_suite(path: Path) -> Suite:
    """The suite in ``path``; a ConfigError names the file and every problem in it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    problems = _Problems(path)
    problems.keys("the top level", doc, TOP_KEYS)
    settings = doc.get("suite", {})
    if not isinstance(settings, dict):
        problems.add(f"suite = {settings!r}: expected a [suite] table")
        settings = {}
    tables = {}
    for key in ("bench", "parity"):
        tables[key] = doc.get(key, [])
        if not isinstance(tables[key], list):
            problems.add(f"{key} = {doc[key]!r}: expected [[{key}]] tables")
            tables[key] = []
    problems.keys("[suite]", settings, SUITE_KEYS)
    for key, setting in USER_SETTINGS.items():
        if key in settings:
            problems.bounded("[suite]", key, settings[key], setting.kind, setting.bound)
    if "device" in settings and problems.typed("[suite]", "device", settings["device"], str) \
            and settings["device"] not in DEVICES:
        problems.add(f"[suite].device = {settings['device']!r}: accepted: {', '.join(DEVICES)}")
    loaded = _plugins(problems, settings)
    bench = [_entry(problems, f"[[bench]] #{i + 1}", t, ENTRY_KEYS) for i, t in enumerate(tables["bench"])]
    parity = [_entry(problems, f"[[parity]] #{i + 1}", t, PARITY_KEYS) for i, t in enumerate(tables["parity"])]
    if not bench and not parity and not problems.items:
        problems.add("no [[bench]] or [[parity]] table: nothing to run")
    problems.raise_any()
    return Suite(path, settings, bench, parity, loaded)


def _plugins(problems: _Problems, settings: dict) -> list[Plugin]:
    """The suite's plugins (paths relative to its file), loaded before its tables name their ops;
    one that does not load is reported by the session, not a problem of the file."""
    if "plugins" not in settings or not problems.str_list("[suite]", "plugins", settings["plugins"]):
        return []
    from .ops import plugins

    try:
        return plugins.load_many(settings["plugins"], origin=f"suite {problems.path}", base=problems.path.parent)
    except UsageError as exc:
        problems.add(f"[suite].plugins: {exc}")
        return []


def configs_dir() -> Path:
    """configs/ of a source checkout, else the copy packaged into the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "configs", here / "configs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("configs/ not found: pass --config PATH")
