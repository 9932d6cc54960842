"""Workloads written on the command line instead of named in an op.

A function op that declares its dimensions (:class:`Dims`) takes ``-w 16384x4096:bf16`` (one
integer per dimension, ``x``-separated, then an optional ``:dtype``) and sweeps one dimension with
``--sweep N=256..65536`` (doubling from the first value to the last) or ``--sweep N=256,1000,4096``.
An optimizer op takes ``-w model:NAME`` (the parameters of a model of ``kernelbench.models``) or
``-w FILE``, a text file of parameters, one per line::

    # name                 shape        ('#' starts a comment)
    embed                  32000x1024
    layers.0.mlp_up        4096x1024
    norm                   1024
    dim = 1024             # a hyperparameter the optimizer reads (Adam-mini: dim, n_heads, n_kv_heads)

Nothing here imports torch: specs are parsed and refused before anything runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import DTYPE_NAMES, UsageError, Workload

# The tier of workloads made from a spec: neither tier's default set includes them.
CUSTOM_TIER = "custom"
SHAPE_DTYPES = tuple(DTYPE_NAMES.values())
_SHAPE = re.compile(r"(\d+(?:x\d+)*)(?::([A-Za-z0-9]+))?")
# A sweep past this many points is a typo (a list of sizes, not a range, was meant).
MAX_SWEEP_POINTS = 64


@dataclass(frozen=True)
class Dims:
    """What a function op's shape spec means: ``names`` of the dimensions in order, ``meaning``
    in words, ``example`` (a GPU-sized spec) and ``small`` (a CPU-sized one: the base of a sweep on
    the CPU), and ``to_spec(shape, dtype)``, the workload spec its input factory reads (default:
    ``{"shape": shape, "dtype": dtype}``)."""

    names: tuple[str, ...]
    meaning: str
    example: str
    small: str
    to_spec: Callable[[tuple[int, ...], str], dict] | None = None
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    default_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"Dims: dimension names must be distinct and at least one, got {self.names}")

    @property
    def layout(self) -> str:
        return "x".join(self.names)

    def describe(self) -> str:
        """``MxN[:dtype] (M rows, N features), e.g. 16384x4096:bf16``: what `list --workloads` shows."""
        return f"{self.layout}[:{'|'.join(self.dtypes)}] ({self.meaning}), e.g. {self.example}"

    def spec(self, shape: tuple[int, ...], dtype: str) -> dict:
        return self.to_spec(shape, dtype) if self.to_spec else {"shape": shape, "dtype": dtype}


def is_shape_text(text: str) -> bool:
    """True for text written like a shape (``4096x1024`` or ``4096x1024:bf16``), right or wrong."""
    return bool(re.fullmatch(r"[\dx]+(:\w*)?", text)) and text[0].isdigit()


def parse_shape(op_name: str, dims: Dims, text: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of ``text``; a one-line UsageError naming the op's dimensions otherwise."""
    accepted = f"op '{op_name}' takes {dims.describe()}"
    match = _SHAPE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"-w {text}: not a shape; {accepted}")
    sizes = tuple(int(v) for v in match.group(1).split("x"))
    if len(sizes) != len(dims.names):
        raise UsageError(f"-w {text}: {len(sizes)} dimension(s) given, {len(dims.names)} expected; {accepted}")
    zero = [n for n, v in zip(dims.names, sizes) if v < 1]
    if zero:
        raise UsageError(f"-w {text}: {', '.join(zero)} must be at least 1; {accepted}")
    dtype = match.group(2) or dims.default_dtype
    if dtype not in dims.dtypes:
        raise UsageError(f"-w {text}: dtype '{dtype}' not accepted; {accepted}")
    return sizes, dtype


def shape_text(shape: tuple[int, ...], dtype: str) -> str:
    return "x".join(str(v) for v in shape) + f":{dtype}"


def shape_workload(op_name: str, dims: Dims, text: str, seed: int = 0) -> Workload:
    """The workload ``text`` names; its name is the canonical spec (``16384x4096:bf16``)."""
    shape, dtype = parse_shape(op_name, dims, text)
    return Workload(shape_text(shape, dtype), CUSTOM_TIER, dims.spec(shape, dtype), seed=seed,
                    note=f"{dims.layout} = {shape_text(shape, dtype)}")


def parse_sweep(op_name: str, dims: Dims, text: str) -> tuple[int, list[int]]:
    """(index of the dimension, its values) for ``N=256..65536`` (doubling) or ``N=256,1000``."""
    names = ", ".join(dims.names)
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not values.strip():
        raise UsageError(f"--sweep {text}: expected DIM=FIRST..LAST or DIM=A,B,C with DIM one of {names} "
                         f"(op '{op_name}': {dims.meaning})")
    if name not in dims.names:
        raise UsageError(f"--sweep {text}: op '{op_name}' has no dimension '{name}'; its dimensions: {names} "
                         f"({dims.meaning})")
    values = values.strip()
    try:
        if ".." in values:
            first, last = (int(v) for v in values.split(".."))
            if first < 1 or last < first:
                raise ValueError
            points = [first * 2**k for k in range(int(math.log2(last / first)) + 1)]
            points = [p for p in points if p <= last]
            if points[-1] != last:
                points.append(last)
        else:
            points = [int(v) for v in values.split(",")]
            if any(p < 1 for p in points):
                raise ValueError
    except ValueError:
        raise UsageError(f"--sweep {text}: expected {name}=FIRST..LAST (1 <= FIRST <= LAST, doubling) or "
                         f"{name}=A,B,C (positive integers)") from None
    if len(points) > MAX_SWEEP_POINTS:
        raise UsageError(f"--sweep {text}: {len(points)} points; at most {MAX_SWEEP_POINTS}")
    return dims.names.index(name), list(dict.fromkeys(points))


def sweep_texts(op_name: str, dims: Dims, sweep: str, base: str) -> list[str]:
    """The shape specs of a sweep: ``base`` (a shape spec) with one dimension set to each value."""
    shape, dtype = parse_shape(op_name, dims, base)
    index, values = parse_sweep(op_name, dims, sweep)
    return [shape_text(shape[:index] + (v,) + shape[index + 1:], dtype) for v in values]


# -- optimizer ops ---------------------------------------------------------------------------------
MODEL_PREFIX = "model:"
PARAMS_HELP = ("model:NAME (the parameters of a kernelbench.models config) or a FILE of 'NAME SHAPE' lines "
               "(e.g. 'mlp_up 4096x1024')")


@dataclass
class ParamList:
    shapes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    hyperparams: dict[str, int] = field(default_factory=dict)


def parse_param_file(path: Path) -> ParamList:
    """A parameter-shape list file (see the module docstring); errors name the file and line."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"-w {path}: cannot read it ({exc})") from None
    out = ParamList()
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"-w {path}:{number}: '{raw.strip()}'"
        if "=" in line:
            key, _, value = (part.strip() for part in line.partition("="))
            if not re.fullmatch(r"[A-Za-z_]\w*", key) or not re.fullmatch(r"\d+", value):
                raise UsageError(f"{where}: expected 'KEY = INTEGER' (a hyperparameter, e.g. 'dim = 1024')")
            out.hyperparams[key] = int(value)
            continue
        parts = line.split()
        if len(parts) == 1:
            parts = [f"p{len(out.shapes)}", parts[0]]
        if len(parts) != 2 or not re.fullmatch(r"\d+(x\d+)*", parts[1]):
            raise UsageError(f"{where}: expected 'NAME SHAPE' (e.g. 'layers.0.mlp_up 4096x1024') or 'KEY = INTEGER'")
        shape = tuple(int(v) for v in parts[1].split("x"))
        if min(shape) < 1:
            raise UsageError(f"{where}: every dimension must be at least 1")
        out.shapes.append((parts[0], shape))
    if not out.shapes:
        raise UsageError(f"-w {path}: lists no parameter ({PARAMS_HELP})")
    names = [n for n, _ in out.shapes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"-w {path}: parameter '{dup}' is listed twice")
    return out


def model_param_list(name: str) -> ParamList:
    """The parameters of model ``name`` of the model grid (names and order as the model has them,
    built on the meta device), with the geometry optimizers read."""
    import torch  # only when a model is asked for

    from ..models import CONFIGS, Llama
    from .base import unknown_name_error

    if name not in CONFIGS:
        raise unknown_name_error("model (-w model:NAME)", name, CONFIGS)
    config = CONFIGS[name]
    with torch.device("meta"):
        model = Llama(config)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    return ParamList(shapes, {"dim": config.hidden, "n_heads": config.n_heads, "n_kv_heads": config.n_kv_heads})


def param_workload(op_name: str, text: str, extra: Mapping[str, Any] | None = None, seed: int = 0) -> Workload | None:
    """The optimizer workload ``text`` names (``model:NAME`` or an existing file), else None."""
    if text.startswith(MODEL_PREFIX):
        params = model_param_list(text[len(MODEL_PREFIX):])
    elif Path(text).is_file():
        params = parse_param_file(Path(text))
    else:
        return None
    spec = {"shapes": params.shapes, **(extra or {})}
    if params.hyperparams:
        spec["hyperparams"] = dict(params.hyperparams)
    total = sum(math.prod(s) for _, s in params.shapes)
    return Workload(text, CUSTOM_TIER, spec, seed=seed, note=f"{len(params.shapes)} tensors, {total:,} parameters")
