"""Suites: TOML files naming what to benchmark and check (configs/quick.toml, ci.toml, full.toml).

    [suite]                      # all keys optional
    device = "cuda"              # cpu | cuda | auto
    warmup_ms = 25
    rep_ms = 100
    rounds = 3                   # interleaved rounds per workload
    cuda_graph = false
    flush_l2 = true

    [[bench]]                    # one table per op to time
    op = "adamw"
    workloads = ["single-4096x1024"]   # default: the tier of the device
    candidates = ["torch-fused"]       # default: every candidate (after tags)
    exclude = ["torch-compile"]        # drop these from the default
    modes = ["fwd"]                    # default: every mode of the op
    tags = { state = "fp8" }           # the CLI's --state fp8

    [[parity]]                   # one table per op to check; same keys, plus
    steps = 10

An op that starts processes of its own (dist-adamw) runs every candidate in each launch: its
[[bench]] table takes op and workloads only, with the op's default options.

Unknown keys and unknown names are errors that name the file, the key and what is accepted.
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

from .ops import get_op
from .ops.base import UsageError

SUITE_KEYS = {"name", "description", "device", "warmup_ms", "rep_ms", "rounds", "cuda_graph", "flush_l2"}
ENTRY_KEYS = {"op", "workloads", "candidates", "exclude", "modes", "tags"}
PARITY_KEYS = ENTRY_KEYS | {"steps", "atol", "rtol"}
TOP_KEYS = {"suite", "bench", "parity"}


class ConfigError(UsageError):
    pass


@dataclass
class Entry:
    op: str
    workloads: list[str] | None = None
    candidates: list[str] | None = None
    modes: list[str] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    steps: int = 10
    exclude: list[str] = field(default_factory=list)
    atol: float | None = None
    rtol: float | None = None


@dataclass
class Suite:
    path: Path
    settings: dict[str, Any]
    bench: list[Entry]
    parity: list[Entry]


def _check_keys(path: Path, where: str, table: dict, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{path}: unknown key '{key}' in {where}; accepted: {', '.join(sorted(allowed))}")


def _typed(path: Path, where: str, key: str, value: Any, kind: type | tuple) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{path}: {where}.{key} = {value!r}: expected {names}")
    return value


def _str_list(path: Path, where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: {where}.{key} = {value!r}: expected a list of strings")
    return value


def _entry(path: Path, where: str, table: Any, allowed: set[str]) -> Entry:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where} = {table!r}: expected a table (write it as {where.split()[0]})")
    _check_keys(path, where, table, allowed)
    if "op" not in table:
        raise ConfigError(f"{path}: {where} has no 'op' key")
    for key in ("workloads", "candidates", "modes", "exclude"):
        if key in table:
            _str_list(path, where, key, table[key])
    if "steps" in table and _typed(path, where, "steps", table["steps"], int) < 1:
        raise ConfigError(f"{path}: {where}.steps = {table['steps']}: must be at least 1")
    for key in ("atol", "rtol"):
        if key in table and _typed(path, where, key, table[key], (int, float)) < 0:
            raise ConfigError(f"{path}: {where}.{key} = {table[key]}: must be >= 0")
    try:
        op = get_op(_typed(path, where, "op", table["op"], str))
        for name in table.get("workloads", []):
            op.workload(name)
        for name in table.get("candidates", []) + table.get("exclude", []):
            op.get_candidate(name)
        for mode in table.get("modes", []):
            if mode not in op.modes():
                raise UsageError(f"op '{op.name}' has no mode '{mode}'; modes: {', '.join(op.modes())}")
        if op.kind == "multi-process":
            own = [k for k in ("candidates", "exclude", "modes", "tags") if k in table]
            if own or where.startswith("[[parity]]"):
                raise UsageError(f"op '{op.name}' runs every candidate in its own processes and checks them "
                                 f"there: a [[bench]] table with op and workloads only"
                                 + (f" (drop {', '.join(own)})" if own else ""))
        tags = table.get("tags", {})
        if not isinstance(tags, dict):
            raise UsageError(f"tags = {tags!r}: expected a table like {{ state = \"fp8\" }}")
        op.select(None, tags)
    except ConfigError:
        raise
    except UsageError as exc:
        raise ConfigError(f"{path}: {where}: {exc}") from exc
    entry = Entry(op=table["op"], tags=dict(table.get("tags", {})))
    for key in ("workloads", "candidates", "modes", "exclude"):
        if key in table:
            setattr(entry, key, _str_list(path, where, key, table[key]))
    if "steps" in table:
        entry.steps = _typed(path, where, "steps", table["steps"], int)
    for key in ("atol", "rtol"):
        if key in table:
            setattr(entry, key, float(_typed(path, where, key, table[key], (int, float))))
    return entry


def load_suite(path: Path) -> Suite:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    _check_keys(path, "the top level", doc, TOP_KEYS)
    settings = doc.get("suite", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{path}: suite = {settings!r}: expected a [suite] table")
    for key in ("bench", "parity"):
        if not isinstance(doc.get(key, []), list):
            raise ConfigError(f"{path}: {key} = {doc[key]!r}: expected [[{key}]] tables")
    _check_keys(path, "[suite]", settings, SUITE_KEYS)
    for key, kind in (("warmup_ms", (int, float)), ("rep_ms", (int, float)), ("rounds", int),
                      ("cuda_graph", bool), ("flush_l2", bool), ("device", str)):
        if key in settings:
            _typed(path, "[suite]", key, settings[key], kind)
    for key, low, what in (("warmup_ms", 0, ">= 0"), ("rep_ms", 1e-9, "> 0"), ("rounds", 1, ">= 1")):
        if key in settings and settings[key] < low:
            raise ConfigError(f"{path}: [suite].{key} = {settings[key]}: must be {what}")
    if settings.get("device", "auto") not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"{path}: [suite].device = {settings['device']!r}: accepted: cpu, cuda, auto")
    bench = [_entry(path, f"[[bench]] #{i + 1}", t, ENTRY_KEYS) for i, t in enumerate(doc.get("bench", []))]
    parity = [_entry(path, f"[[parity]] #{i + 1}", t, PARITY_KEYS) for i, t in enumerate(doc.get("parity", []))]
    if not bench and not parity:
        raise ConfigError(f"{path}: no [[bench]] or [[parity]] table: nothing to run")
    return Suite(path, settings, bench, parity)


def configs_dir() -> Path:
    """configs/ of a source checkout, else the copy packaged into the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "configs", here / "configs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("configs/ not found: pass --config PATH")
