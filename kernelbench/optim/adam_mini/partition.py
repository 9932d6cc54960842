"""Adam-mini's partition: which parameter gets how many second moments, and where its blocks lie.

A parameter is cut into *segments*; each segment is cut into equal *blocks*, and a block shares
one second moment. Two layouts of segment:

* runs: a contiguous range ``[start, stop)`` of the flattened parameter, cut into ``n_blocks``
  contiguous runs of ``block_len`` elements (rows, attention heads of a Linear weight, the
  whole tensor, single elements). The fused Triton kernels step these.
* strided: columns ``[col_start, col_stop)`` of the parameter seen as (shape[0], -1), viewed as
  ``view`` and reduced over the dims ``reduce`` (columns of a GPT-2 ``Conv1D`` weight, which is
  stored (in, out)). A PyTorch path steps these.

Default rules (the official adam-mini 1.1.1's, so that a partition equals the official's for
every name), tested on the lower-cased name, a rule matching when one of its names is a substring:
``adam_block_names`` -> one block per element; ``wqk_names`` -> blocks of ``dim * dim / n_heads``
elements (one per head); ``embd_names``, ``output_names``, ``wv_names``, ``attn_proj_names``,
``mlp_names`` -> one block per index of dim 0; anything else -> one block per tensor. No weight
decay for names containing ``norm``, ``ln`` or ``bias``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

KINDS = ("adam", "head", "row", "tensor", "column", "qkv", "qkv-interleaved", "conv1d-qkv")
# Kinds that describe a 2-D weight's layout; a rule of such a kind skips parameters of other ranks.
_WEIGHT_KINDS = ("column", "qkv", "qkv-interleaved", "conv1d-qkv")
FALLBACKS = ("official", "structure")

# The official name sets (attribute name, contents), in the order the official step() tests them.
OFFICIAL_NAME_SETS: dict[str, frozenset[str]] = {
    "adam_block_names": frozenset({"bias"}),
    "wqk_names": frozenset({"k_proj", "q_proj", "wq", "wk", "query", "key"}),
    "embd_names": frozenset({"embed", "embd", "wte"}),
    "output_names": frozenset({"lm_head", "output", "final_layer"}),
    "wv_names": frozenset({"v_proj", "wv", "value"}),
    "mlp_names": frozenset({"feed_forward", "linear", "mlp"}),
    "attn_proj_names": frozenset({"o_proj", "wo", "attn.proj"}),
}
_ROW_SETS = ("embd_names", "output_names", "wv_names", "mlp_names", "attn_proj_names")
_WHY = {
    "embd_names": "embedding: one block per token (row)",
    "output_names": "output layer: one block per row",
    "wv_names": "value: one block per output neuron (row)",
    "mlp_names": "MLP: one block per row",
    "attn_proj_names": "attention output: one block per row",
}


@dataclass(frozen=True)
class Rule:
    """A partition rule, tested before the official ones, in the order given.

    contains: substring of the lower-cased parameter name.
    kind: "adam" (one block per element), "head" (blocks of dim*dim/n_heads elements), "row" (one
        per index of dim 0), "tensor" (one per tensor); for a 2-D weight only (other parameters
        skip the rule): "column" (one per column: a ``Conv1D`` weight stored (in, out)),
        "qkv" (a fused Linear q/k/v weight, rows [q; k; v]: q and k one block per head, v one per
        row), "qkv-interleaved" (rows grouped per head as [q_h; k_h; v_h], GPT-NeoX / BLOOM's
        ``query_key_value``), "conv1d-qkv" (GPT-2's ``c_attn``, stored (in, 3 * out): q and k one
        block per head's columns, v one per column).
    weight_decay: True / False to force, None for the default (none on norm / ln / bias names).
    """

    contains: str
    kind: str
    weight_decay: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Rule({self.contains!r}): kind {self.kind!r} is not one of {', '.join(KINDS)}.")


PRESETS: dict[str, tuple[Rule, ...]] = {
    "gpt2": (Rule("c_attn", "conv1d-qkv"), Rule("c_proj", "column"), Rule("c_fc", "column"),
             Rule("wpe", "row")),
    "fused-qkv": (Rule("qkv_proj", "qkv"), Rule("wqkv", "qkv"), Rule("query_key_value", "qkv-interleaved")),
}


@dataclass(frozen=True)
class Segment:
    start: int  # runs: flat element range; strided: unused (0)
    stop: int
    block_len: int
    n_blocks: int
    kind: str  # "adam", "head", "row", "tensor", "column"
    block_offset: int = 0  # index of this segment's first block in the parameter's vmean
    cols: tuple[int, int] | None = None  # strided only: column range of the (shape[0], -1) view
    view: tuple[int, ...] = ()  # strided only: the column slice viewed as this shape
    reduce: tuple[int, ...] = ()  # strided only: dims of ``view`` one block spans

    @property
    def strided(self) -> bool:
        return self.cols is not None


@dataclass(frozen=True)
class Partition:
    name: str
    kind: str
    segments: tuple[Segment, ...]
    weight_decay: bool
    reason: str
    names: tuple[str, ...] = field(default=())  # every name this parameter was given

    @property
    def n_blocks(self) -> int:
        return sum(s.n_blocks for s in self.segments)

    @property
    def block_len(self) -> int:
        """The block length when every block has the same length, else 0."""
        lengths = {s.block_len for s in self.segments}
        return lengths.pop() if len(lengths) == 1 else 0

    @property
    def strided(self) -> bool:
        return any(s.strided for s in self.segments)

    def same_layout(self, other: Partition) -> bool:
        return (self.segments, self.weight_decay) == (other.segments, other.weight_decay)


@dataclass(frozen=True)
class Geometry:
    dim: int
    n_heads: int
    n_kv_heads: int

    def head_dim(self, what: str) -> int:
        if self.n_heads <= 0 or self.dim % self.n_heads != 0:
            raise ValueError(f"AdamMini: {what} needs one block per attention head, but dim ({self.dim}) is not "
                             f"a multiple of n_heads ({self.n_heads}); pass the model's dim and n_heads.")
        return self.dim // self.n_heads


def _runs(kind: str, start: int, n_blocks: int, block_len: int, offset: int) -> Segment:
    return Segment(start, start + n_blocks * block_len, block_len, n_blocks, kind, offset)


def _strided(kind: str, cols: tuple[int, int], view: tuple[int, ...], reduce: tuple[int, ...], offset: int) -> Segment:
    kept = [n for d, n in enumerate(view) if d not in reduce]
    spanned = [n for d, n in enumerate(view) if d in reduce]
    return Segment(0, 0, math.prod(spanned), math.prod(kept), kind, offset, cols, view, reduce)


def _segments(kind: str, name: str, param: torch.Tensor, geo: Geometry) -> tuple[list[Segment], str]:
    """The segments of ``param`` under ``kind``, and a note when the layout needs one."""
    numel, shape = param.numel(), tuple(param.shape)
    label = f"'{name}' {'x'.join(map(str, shape)) or 'scalar'}"
    if kind == "adam":
        return [_runs("adam", 0, numel, 1, 0)], ""
    if kind == "tensor" or numel == 0:
        return [_runs("tensor", 0, 1, numel, 0)], ""
    if kind == "head":
        head_numel = geo.head_dim(label) * geo.dim
        if numel % head_numel != 0:
            raise ValueError(f"AdamMini: {label} is a query/key weight but its {numel} elements are not a multiple "
                             f"of dim * dim / n_heads = {head_numel} (one block per head); check dim and n_heads, "
                             "or give it another rule.")
        return [_runs("head", 0, numel // head_numel, head_numel, 0)], ""
    if kind == "row":
        if param.dim() < 2:
            # the official code fails on a 1-D parameter matched by a row set
            return [_runs("tensor", 0, 1, numel, 0)], f"; {param.dim()}-D, so one block per tensor"
        note = ("" if param.dim() == 2
                else f"; {param.dim()}-D (the official code fails here): one block per index of dim 0")
        return [_runs("row", 0, shape[0], numel // shape[0], 0)], note
    rows, cols = shape
    hd = geo.head_dim(label)
    q_out, kv_out = geo.n_heads * hd, geo.n_kv_heads * hd
    if kind == "column":
        return [_strided("column", (0, cols), (rows, cols), (0,), 0)], ""
    if kind == "qkv":
        if rows != q_out + 2 * kv_out:
            raise ValueError(f"AdamMini: {label} as a fused q/k/v weight [q; k; v] needs {q_out + 2 * kv_out} rows "
                             f"(n_heads {geo.n_heads} + 2 x n_kv_heads {geo.n_kv_heads}, head_dim {hd}).")
        head = hd * cols
        return [_runs("head", 0, geo.n_heads, head, 0),
                _runs("head", q_out * cols, geo.n_kv_heads, head, geo.n_heads),
                _runs("row", (q_out + kv_out) * cols, kv_out, cols, geo.n_heads + geo.n_kv_heads)], ""
    if kind == "qkv-interleaved":
        if geo.n_kv_heads != geo.n_heads or rows != 3 * q_out:
            raise ValueError(f"AdamMini: {label} as a per-head interleaved q/k/v weight needs {3 * q_out} rows and "
                             f"n_kv_heads == n_heads (got {geo.n_kv_heads} of {geo.n_heads}).")
        head, segs, offset = hd * cols, [], 0
        for h in range(geo.n_heads):
            base = 3 * h * head
            segs += [_runs("head", base, 1, head, offset), _runs("head", base + head, 1, head, offset + 1),
                     _runs("row", base + 2 * head, hd, cols, offset + 2)]
            offset += 2 + hd
        return segs, ""
    if kind == "conv1d-qkv":
        if cols != q_out + 2 * kv_out:
            raise ValueError(f"AdamMini: {label} as a Conv1D fused q/k/v weight (in, out) needs {q_out + 2 * kv_out} "
                             f"columns (n_heads {geo.n_heads} + 2 x n_kv_heads {geo.n_kv_heads}, head_dim {hd}).")
        return [_strided("head", (0, q_out), (rows, geo.n_heads, hd), (0, 2), 0),
                _strided("head", (q_out, q_out + kv_out), (rows, geo.n_kv_heads, hd), (0, 2), geo.n_heads),
                _strided("column", (q_out + kv_out, cols), (rows, kv_out), (0,), geo.n_heads + geo.n_kv_heads)], ""
    raise AssertionError(kind)


def _first_hit(lname: str, names: Iterable[str]) -> str | None:
    return next((n for n in sorted(names) if n in lname), None)


def partition_param(name: str, param: torch.Tensor, *, dim: int = 2048, n_heads: int = 32,
                    n_kv_heads: int | None = None, rules: Sequence[Rule] = (),
                    name_sets: Mapping[str, Iterable[str]] | None = None,
                    fallback: str = "official") -> Partition:
    """The partition of one parameter: user / preset ``rules`` first, then the official name sets
    (``name_sets`` overrides them), then ``fallback``: "official" (one block per tensor) or
    "structure" (2-D: one block per row, else per tensor)."""
    if fallback not in FALLBACKS:
        raise ValueError(f"AdamMini: fallback {fallback!r} is not one of {', '.join(FALLBACKS)}.")
    sets = {**OFFICIAL_NAME_SETS, **(name_sets or {})}
    geo = Geometry(dim, n_heads, n_kv_heads or n_heads)
    lname = name.lower()
    default_decay = not ("norm" in lname or "ln" in lname or "bias" in lname)
    kind, reason, decay = None, "", default_decay
    for rule in rules:
        if rule.contains.lower() in lname and (rule.kind not in _WEIGHT_KINDS or param.dim() == 2):
            kind, reason = rule.kind, f"rule contains={rule.contains!r} ({rule.kind})"
            decay = default_decay if rule.weight_decay is None else rule.weight_decay
            break
    if kind is None:
        for set_name, rule_kind, why in (("adam_block_names", "adam", "bias term: full Adam"),
                                         ("wqk_names", "head", "query/key: one block per head")):
            hit = _first_hit(lname, sets[set_name])
            if hit is not None:
                kind, reason = rule_kind, f"name contains {hit!r} ({set_name}): {why}"
                break
    if kind is None:
        for set_name in _ROW_SETS:
            hit = _first_hit(lname, sets[set_name])
            if hit is not None:
                kind, reason = "row", f"name contains {hit!r} ({set_name}): {_WHY[set_name]}"
                break
    if kind is None:
        if "norm" in lname or "ln" in lname:
            kind, reason = "tensor", "norm (no name set): one block per tensor"
        elif fallback == "structure" and param.dim() == 2:
            kind, reason = "row", "unrecognised name, 2-D, fallback='structure': one block per row"
        else:
            kind, reason = "tensor", "unrecognised name: one block per tensor (the official default)"
    segments, note = _segments(kind, name, param, geo)
    summary = segments[0].kind if len({s.kind for s in segments}) == 1 else kind
    return Partition(name, summary, tuple(segments), decay, reason + note, (name,))


def describe(part: Partition) -> str:
    """The blocks of a partition in a few words, e.g. '16 x 65536 (head)' or 'q 4 x 4096 (head) + ...'."""
    return " + ".join(f"{s.n_blocks} x {s.block_len} ({s.kind}{', strided' if s.strided else ''})"
                      for s in _merged(part.segments))


def _merged(segments: Sequence[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segments:
        last = out[-1] if out else None
        if last is not None and (last.kind, last.block_len, last.strided) == (s.kind, s.block_len, s.strided) \
                and not s.strided:
            out[-1] = Segment(last.start, s.stop, s.block_len, last.n_blocks + s.n_blocks, s.kind, last.block_offset)
        else:
            out.append(s)
    return out


def region(x: torch.Tensor, seg: Segment) -> torch.Tensor:
    """The elements of ``x`` (the parameter's shape) a segment covers, as a view shaped
    (blocks..., elements) for runs or ``seg.view`` for strided segments."""
    if seg.strided:
        c0, c1 = seg.cols
        return x.reshape(x.shape[0], -1)[:, c0:c1].view(seg.view)
    return x.reshape(-1)[seg.start:seg.stop].view(seg.n_blocks, seg.block_len)


def block_dims(seg: Segment) -> tuple[int, ...]:
    return seg.reduce if seg.strided else (1,)


def decay_of(name: str, param: torch.Tensor, rules: Sequence[Rule]) -> bool:
    """Weight decay by name (none on norm / ln / bias), unless the first matching rule forces it."""
    lname = name.lower()
    for rule in rules:
        if rule.contains.lower() in lname and (rule.kind not in _WEIGHT_KINDS or param.dim() == 2):
            if rule.weight_decay is not None:
                return rule.weight_decay
            break
    return not ("norm" in lname or "ln" in lname or "bias" in lname)


def state_shapes(part: Partition, p: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of m and of vmean (``v`` for Adam) as the official code keeps them, for a parameter
    of one segment; a parameter of several segments keeps m in its own shape and one flat vmean."""
    if len(part.segments) > 1 or part.strided:
        return tuple(p.shape), (part.n_blocks,)
    seg = part.segments[0]
    if seg.kind == "adam":
        return tuple(p.shape), tuple(p.shape)
    if seg.kind == "tensor":
        return tuple(p.shape), ()
    m_shape = (seg.n_blocks, seg.block_len) if seg.kind == "head" else tuple(p.shape)
    return m_shape, (seg.n_blocks, 1)
