"""Adam-mini (arXiv 2406.16793): the ``torch.optim.Optimizer`` face of fused Triton kernels with
fp32 / bf16 / fp8 first-moment state.

Math, for each *block* B of a parameter (a row, an attention head, or the whole tensor; see the
partition below) with |B| elements and step t:

    vmean_B = beta2 * vmean_B + (1 - beta2) * mean_{i in B}(g_i^2)      (one value per block)
    p       = p * (1 - lr * wd)
    m       = lerp(m, g, 1 - beta1)
    h_B     = sqrt(vmean_B) / sqrt(1 - beta2^t) + eps
    p       = p - lr * m * ((1 / (1 - beta1^t)) / h_B)

A block of one element is Adam (used for biases, state key ``v`` as in the official code).

Partition (``partition.py``): the official adam-mini 1.1.1's by default, for every name,
from the name sets the optimizer exposes as attributes (``optimizer.wqk_names.add("c_attn")``),
read at the first step: ``adam_block_names`` (bias) -> Adam; ``wqk_names`` -> one block per head
of ``dim * dim / n_heads`` elements; ``embd_names``, ``output_names``, ``wv_names``,
``attn_proj_names``, ``mlp_names`` -> one block per row; anything else (norms, and names the
official code does not know) -> one block per tensor, or with ``fallback="structure"`` 2-D one
block per row. User ``rules`` and ``preset`` rules ("gpt2": Conv1D weights one block per output
column, fused ``c_attn`` q/k per head and v per column, ``wpe`` per row; "fused-qkv": ``qkv_proj``,
``Wqkv`` [q; k; v] and GPT-NeoX's per-head ``query_key_value``, q/k per head and v per row) are
tested first. No weight decay on names containing ``norm``, ``ln`` or ``bias`` (as the official
code). A parameter under several names (tied embeddings) has one state. ``partition_report()``
lists every decision. A parameter is one or more *segments* (a fused q/k/v weight: q heads, k
heads, v rows), each a launch-table row of its own.

Kernels and the fp8 format: ``kernels.py``; launch plans: ``host.py``. Here: param groups, the
partition, state, the launch plans' cache, the PyTorch path, reports and checkpoints.

State dtypes: ``fp32``, ``bf16`` or ``fp8`` m (vmean always fp32). Under ``fp8``, Adam blocks
(biases) keep m in bf16: a per-element scale would cost more than it saves. fp8 needs sm_89+ on
the GPU and torch.float8_e4m3fn; otherwise the optimizer falls back to bf16 with one warning
naming the reason. In the interpreter (CPU) fp8 runs too. Parameters under ``min_8bit_size``
elements (4096) keep fp32 m under bf16 / fp8 state, as bitsandbytes' min_8bit_size does: a
norm's whole-tensor block in e4m3 saves a few hundred bytes for a visible error.

Strided segments (Conv1D columns) are stepped by PyTorch ops, the same math per segment, m in
fp32 or bf16 (bf16 under fp8 too), not by the kernels.

Telemetry: ``telemetry()`` reduces the per-program max|update| and max|m| the kernels write
every step (no host sync) per parameter, on demand.

FSDP2. DTensor parameters of ``fully_shard`` (sharded on dim 0) are stepped through their local
rows. Row and Adam blocks lie within a rank's rows: the launches above run on the local rows, with
m, v and the per-row vmean (and fp8 scales, one row of them per parameter row) sharded like the
parameter. Heads and whole-tensor blocks may be cut by a shard boundary: each rank sums g^2 over
its piece of every such block, the sums (and for fp8 the maxima of |m| per scale block) are
all-reduced over the ranks holding the parameter in one collective per step, overlapped with the
row launches, and every rank then updates its pieces with the block's statistics
(``host.ShardedPlan``). Their vmean and fp8 scales are replicated, in the single-GPU
layout; m is sharded like the parameter (so q / k m takes the parameter's shape, not the official
(n_heads, head_numel)). Strided (Conv1D) partitions are not supported under FSDP2.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .._sharding import check_kernel_tensor, check_like_param, is_dtensor, like_param, local_tensor, row_shard
from .._triton_utils import (
    SUPPORTED_DTYPES,
    check_device_supported,
    check_param_and_grad,
    on_device,
    one_device,
    refuse_rebuild_while_capturing,
)
from ..adamw.host import StepIncrementer
from ..grad_norm import FusedClip, check_max_grad_norm, one_process_group
from .host import (
    DEFAULT_LAUNCH,
    FP8_SCALE_BLOCK,
    M_KINDS,
    LaunchConfig,
    LaunchPlan,
    ShardedEntry,
    ShardedPlan,
    StepTable,
    launch,
    scale_blocks,
)
from .partition import (
    FALLBACKS,
    OFFICIAL_NAME_SETS,
    PRESETS,
    Partition,
    Rule,
    Segment,
    block_dims,
    decay_of,
    describe,
    partition_param,
    region,
    state_shapes,
)

STATE_DTYPES = ("fp32", "bf16", "fp8")

_WHO = "AdamMini"
_LOG = logging.getLogger(__package__)  # "kernelbench.optim.adam_mini", the logger the class docstring names


class _NameSet(set):
    """One of the official name sets: a plain set of substrings that refuses to change once the
    partition it was read into is in use (after the first step)."""

    def __init__(self, items: Iterable[str], owner: AdamMini, attr: str) -> None:
        super().__init__(items)
        self._owner, self._attr = owner, attr

    def __reduce__(self):
        return (set, (list(self),))


def _guarded(method_name: str):
    method = getattr(set, method_name)

    def wrapper(self, *args, **kwargs):
        self._owner._name_sets_changing(self._attr)
        return method(self, *args, **kwargs)

    wrapper.__name__ = method_name
    return wrapper


for _method in ("add", "discard", "remove", "pop", "clear", "update", "difference_update", "intersection_update",
                "symmetric_difference_update", "__ior__", "__iand__", "__isub__", "__ixor__"):
    setattr(_NameSet, _method, _guarded(_method))


def _name_set_property(attr: str) -> property:
    def get(self: AdamMini) -> set:
        return self._name_sets[attr]

    def set_(self: AdamMini, value: Iterable[str]) -> None:
        if isinstance(value, str):
            raise TypeError(f"{_WHO}: {attr} must be a set of name substrings, got the string {value!r}; "
                            f"use optimizer.{attr}.add({value!r}).")
        self._name_sets_changing(attr)
        self._name_sets[attr] = _NameSet(value, self, attr)

    return property(get, set_, doc=f"The official {attr}: substrings of lower-cased parameter names.")


class AdamMini(torch.optim.Optimizer):
    """Adam-mini with the official 1.1.1 constructor, name sets and partition, fused Triton
    kernels, and a choice of first-moment state dtype.

    ``named_parameters``: an iterable of (name, parameter), e.g. ``model.named_parameters()``.
    Parameters are put into two param groups, ``decay`` and ``no_decay`` (each with lr, betas,
    eps, weight_decay, so LR schedulers work). Parameters and gradients must be contiguous
    (blocks are runs of the flattened tensor); anything else is a clear error. One parameter
    object under several names (tied embeddings and output head) has one state; names that would
    give it different partitions are an error.

    The official name sets are attributes (``embd_names``, ``output_names``, ``wqk_names``,
    ``wv_names``, ``attn_proj_names``, ``mlp_names``, ``adam_block_names``), read when the
    partition is built at the first ``step()``; changing one afterwards raises. ``rules`` and
    ``preset`` ("gpt2", "fused-qkv", or several) add rules tested before the name sets;
    ``fallback`` decides names that match nothing ("official": one block per tensor;
    "structure": 2-D one block per row). Parameters under ``min_8bit_size`` elements keep fp32 m
    under bf16 / fp8 state. ``verbose``: a one-line summary through ``logging`` (logger
    ``kernelbench.optim.adam_mini``) and warnings about names that matched nothing.

    State per parameter: ``step`` (0-d fp32 on the device), ``vmean`` (``v`` for Adam blocks),
    and ``m`` (fp32 / bf16; the official shapes: (n_heads, head_numel) for q/k) or, for fp8,
    ``m_fp8`` plus ``m_scale`` (one fp32 per scale block).

    ``launch_config`` (``kernelbench.optim.adam_mini.LaunchConfig``): how the kernels are
    launched; tuning only for fp32 / bf16 state (the reductions' order may change the last bits).

    ``max_grad_norm``: clip the gradients to this total 2-norm inside ``step()`` as
    ``torch.nn.utils.clip_grad_norm_`` before it would (the per-block means of g^2 use the clipped
    g), with the norm computed on the device and folded into the update kernels (global over the
    mesh under FSDP2); ``last_grad_norm`` is then the pre-clip norm (``kernelbench.optim.grad_norm``).
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        model_sharding: bool | None = None,
        dim: int = 2048,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        verbose: bool = True,
        state_dtype: str = "fp32",
        rules: Sequence[Rule] | None = None,
        preset: str | Sequence[str] | None = None,
        fallback: str = "official",
        min_8bit_size: int = 4096,
        launch_config: LaunchConfig = DEFAULT_LAUNCH,
        max_grad_norm: float | None = None,
    ) -> None:
        self.max_grad_norm = check_max_grad_norm(max_grad_norm, _WHO)
        if not isinstance(launch_config, LaunchConfig):
            raise TypeError(f"{_WHO}: launch_config={launch_config!r}; accepted: a "
                            "kernelbench.optim.adam_mini.LaunchConfig.")
        if isinstance(lr, torch.Tensor):
            raise TypeError(f"{_WHO}: lr must be a Python float, got a Tensor.")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid betas: {betas}; each must be in [0, 1).")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if n_kv_heads is not None and (n_kv_heads <= 0 or n_heads % n_kv_heads != 0):
            raise ValueError(f"{_WHO}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}).")
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"{_WHO}: state_dtype {state_dtype!r} is not one of {', '.join(STATE_DTYPES)}.")
        if fallback not in FALLBACKS:
            raise ValueError(f"{_WHO}: fallback {fallback!r} is not one of {', '.join(FALLBACKS)}.")
        if not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"{_WHO}: min_8bit_size must be an int >= 0, got {min_8bit_size!r}.")
        presets = (preset,) if isinstance(preset, str) else tuple(preset or ())
        for name in presets:
            if name not in PRESETS:
                raise ValueError(f"{_WHO}: preset {name!r} is not one of {', '.join(PRESETS)}.")
        if model_sharding is not None and verbose:
            warnings.warn(f"{_WHO}: model_sharding is deprecated in adam-mini (since 1.0.2) and ignored here.",
                          DeprecationWarning, stacklevel=2)
        self.dim, self.n_heads = dim, n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.verbose, self.fallback, self.min_8bit_size = verbose, fallback, min_8bit_size
        self.presets = presets
        self.rules = tuple(rules or ()) + tuple(r for name in presets for r in PRESETS[name])
        self._name_sets = {attr: _NameSet(items, self, attr) for attr, items in OFFICIAL_NAME_SETS.items()}
        self._frozen = False
        named = list(named_parameters)
        if not named or not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                                for item in named):
            raise TypeError(f"{_WHO}: named_parameters must be a non-empty iterable of (name, parameter) "
                            "pairs, e.g. model.named_parameters().")
        # one entry per parameter object, with every name it was given
        self._all_names: dict[int, list[str]] = {}
        unique: list[torch.Tensor] = []
        for n, p in named:
            if not p.requires_grad:
                continue
            if id(p) not in self._all_names:
                self._all_names[id(p)] = []
                unique.append(p)
            self._all_names[id(p)].append(n)
        if not unique:
            raise ValueError(f"{_WHO}: no parameter requires grad.")
        self._names = {id(p): names[0] for p in unique for names in [self._all_names[id(p)]]}
        decays = {}
        for p in unique:
            decays[id(p)] = {decay_of(n, p, self.rules) for n in self._all_names[id(p)]}
            if len(decays[id(p)]) > 1:
                raise ValueError(f"{_WHO}: one parameter is named {' and '.join(map(repr, self._all_names[id(p)]))}, "
                                 "which get different weight decay; give the names one rule or pass it once.")
        groups = []
        for group_name, decayed in (("decay", True), ("no_decay", False)):
            params = [p for p in unique if decays[id(p)] == {decayed}]
            if params:
                groups.append({"params": params, "name": group_name,
                               "weight_decay": weight_decay if decayed else 0.0})
        super().__init__(groups, dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])), eps=eps,
                                      weight_decay=weight_decay))
        device = unique[0].device
        self.state_dtype = _resolve_state_dtype(state_dtype, device)
        if self.state_dtype == "fp8" and launch_config.tile != FP8_SCALE_BLOCK:
            raise ValueError(f"{_WHO}: launch_config.tile={launch_config.tile} with state_dtype='fp8'; fp8 scale "
                             f"blocks are tiles, so fp8 state accepts only tile={FP8_SCALE_BLOCK}.")
        self.launch_config = launch_config  # fixed for this optimizer's life: fp8 state is laid out by its tile
        self._plans: dict[tuple, LaunchPlan | ShardedPlan] = {}
        self._reductions: dict[Any, tuple[tuple, torch.Tensor, torch.Tensor | None]] = {}
        self._step_table: StepTable | None = None
        self._increment_steps = StepIncrementer()
        self._parts: dict[int, Partition] | None = None
        self._clip: FusedClip | None = None
        self.last_grad_norm: torch.Tensor | None = None  # pre-clip total norm of the last step (max_grad_norm)

    embd_names = _name_set_property("embd_names")
    output_names = _name_set_property("output_names")
    wqk_names = _name_set_property("wqk_names")
    wv_names = _name_set_property("wv_names")
    attn_proj_names = _name_set_property("attn_proj_names")
    mlp_names = _name_set_property("mlp_names")
    adam_block_names = _name_set_property("adam_block_names")

    # -- partition ------------------------------------------------------------------------------
    def _name_sets_changing(self, attr: str) -> None:
        if self._frozen:
            raise RuntimeError(f"{_WHO}: {attr} changed after the first step(); the partition was built from the "
                               "name sets then and the state has its shapes. Change name sets before the first "
                               "step, or build a new optimizer.")
        self._parts = None

    def _partition(self) -> dict[int, Partition]:
        """Every parameter's partition from the current name sets and rules (cached until a set
        changes)."""
        if self._parts is not None:
            return self._parts
        parts = {}
        for group in self.param_groups:
            for p in group["params"]:
                names = self._all_names[id(p)]
                candidates = [partition_param(n, p, dim=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                                              rules=self.rules, name_sets=self._name_sets, fallback=self.fallback)
                              for n in names]
                for other in candidates[1:]:
                    if not candidates[0].same_layout(other):
                        raise ValueError(
                            f"{_WHO}: one parameter is named {candidates[0].name!r} ({describe(candidates[0])}) "
                            f"and {other.name!r} ({describe(other)}); a shared parameter has one state, so both "
                            "names must give the same partition (add a rule for one of them, or pass it once).")
                part = candidates[0]
                parts[id(p)] = Partition(part.name, part.kind, part.segments, part.weight_decay, part.reason,
                                         tuple(names))
        self._parts = parts
        return parts

    def _m_dtype_name(self, part: Partition, p: torch.Tensor) -> str:
        if self.state_dtype == "fp32" or p.numel() < self.min_8bit_size:
            return "fp32"
        if self.state_dtype == "fp8" and (part.kind == "adam" or part.strided):
            return "bf16"
        return self.state_dtype

    def _build_partition(self) -> None:
        """At the first step: fixes the partition, the launch keys and says what was found."""
        parts = self._partition()
        self._frozen = True
        self._entries: dict[int, list[tuple[tuple, int]] | None] = {}
        # DTensor parameters whose block statistics are all-reduced, and over which process group
        self._reduced: dict[int, Any] = {}
        shard_groups = []
        for group in self.param_groups:
            for p in group["params"]:
                part = parts[id(p)]
                m_dtype = self._m_dtype_name(part, p)
                shard_groups.append(None)
                if is_dtensor(p):
                    shard = row_shard(p, self._label(p), _WHO)
                    shard_groups[-1] = shard.group
                    if part.strided:
                        raise ValueError(f"{_WHO}: {self._label(p)} has strided blocks ({describe(part)}), which "
                                         "FSDP2's row shards cut; under fully_shard use a partition of runs (the "
                                         "official name sets, or rules without Conv1D columns).")
                    if len(part.segments) > 1 or part.segments[0].kind not in ("row", "adam"):
                        self._reduced[id(p)] = shard.group
                self._entries[id(p)] = None if part.strided else [
                    ((seg.block_len, m_dtype), i) for i, seg in enumerate(part.segments)]
        if self.max_grad_norm is not None:
            self._clip_group = one_process_group(shard_groups, _WHO)
        if self.verbose:
            self._say_what_was_found(parts)

    def _say_what_was_found(self, parts: dict[int, Partition]) -> None:
        counts = {attr: 0 for attr in ("embd_names", "output_names", "wqk_names", "wv_names", "attn_proj_names",
                                       "mlp_names")}
        for part in parts.values():
            lname = part.name.lower()
            if "bias" in lname:
                continue
            for attr in counts:
                counts[attr] += any(n in lname for n in self._name_sets[attr])
        labels = {"embd_names": "embedding layers", "output_names": "output layers", "wqk_names": "queries and keys",
                  "wv_names": "values", "attn_proj_names": "attn_proj", "mlp_names": "MLPs"}
        _LOG.info("%s found %s; state %s", _WHO, ", ".join(f"{counts[a]} {labels[a]}" for a in counts),
                  self.state_dtype)
        missing = [a for a, c in counts.items() if c == 0]
        if missing:
            _LOG.warning("%s: no parameter name matched %s; if this is a Transformer, add the names of those layers "
                         "before the first step, e.g. optimizer.%s.add('<part of their name>').", _WHO,
                         ", ".join(missing), missing[0])
        ranks = {id(p): p.dim() for group in self.param_groups for p in group["params"]}
        unmatched = [part.name for p_id, part in parts.items()
                     if part.reason.startswith("unrecognised name") and part.kind == "tensor" and ranks[p_id] == 2]
        if unmatched and self.fallback == "official":
            shown = ", ".join(unmatched[:8]) + (f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else "")
            warnings.warn(f"{_WHO}: {len(unmatched)} 2-D parameters matched no name set and got one block per "
                          f"tensor, as official adam-mini does: {shown}. To change that, add their names to a name "
                          "set (optimizer.mlp_names.add('c_fc')) before the first step, pass rules=[Rule(...)] or "
                          "preset='gpt2', or fallback='structure' (2-D: one block per row).", UserWarning, stacklevel=4)

    # -- reports --------------------------------------------------------------------------------
    def partition_report(self) -> list[dict[str, Any]]:
        """One row per parameter: name (and every other name it was given), shape, kind, block
        length (0 when segments differ), number of blocks, the blocks in words, weight decay, m
        dtype (fp32 under ``min_8bit_size`` elements), whether a PyTorch path steps it (strided
        blocks), and the reason for the partition."""
        parts = self._partition()
        rows = []
        for group in self.param_groups:
            for p in group["params"]:
                part = parts[id(p)]
                m_dtype = self._m_dtype_name(part, p)
                reason = part.reason
                if m_dtype == "fp32" and self.state_dtype != "fp32":
                    reason += f"; {p.numel()} < min_8bit_size {self.min_8bit_size} elements: fp32 m"
                rows.append(dict(name=part.name, names=part.names, shape=tuple(p.shape), kind=part.kind,
                                 block_len=part.block_len, n_blocks=part.n_blocks, blocks=describe(part),
                                 weight_decay=group["weight_decay"], m_dtype=m_dtype,
                                 path="pytorch" if part.strided else "triton", reason=reason))
        return rows

    def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per parameter stepped by the kernels, from the last step: max |update| and max |m|
        (0-d device tensors, no sync here), the m state dtype, and for fp8 the largest and
        smallest scale."""
        report: dict[str, dict[str, Any]] = {}
        parts = self._partition()
        for plan in self._plans.values():
            for p, (start, end) in zip(plan.params, plan.program_ranges):
                part = parts[id(p)]
                max_update = plan.telemetry[0, start:end].amax()
                max_m = plan.telemetry[1, start:end].amax()
                entry = report.get(part.name)
                if entry is not None:  # another segment of the same parameter
                    entry["max_update"] = torch.maximum(entry["max_update"], max_update)
                    entry["max_m"] = torch.maximum(entry["max_m"], max_m)
                    continue
                entry = {"max_update": max_update, "max_m": max_m, "state_dtype": self._m_dtype_name(part, p)}
                if "m_scale" in self.state[p]:
                    entry["scale_max"] = self.state[p]["m_scale"].amax()
                    entry["scale_min"] = self.state[p]["m_scale"].amin()
                report[part.name] = entry
        return report

    # -- state ----------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        """The base class casts every floating state tensor to its parameter's dtype; Adam-mini's
        state keeps its own dtypes (fp8 / bf16 m, fp32 vmean), so they are restored here. A state
        tensor saved in another shape of the same size (q / k m saved on one GPU as (n_heads,
        head_numel) and loaded into a plain parameter's shape, or back) is reshaped."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            for key, value in saved.items():
                if isinstance(value, torch.Tensor):
                    value = value.to(device=p.device, copy=True)
                    if key in ("m", "m_fp8") and not is_dtensor(value) and not is_dtensor(p):
                        value = _reshaped_m(value, p, self._partition()[id(p)])
                    self.state[p][key] = value
            self.state[p]["step"] = torch.as_tensor(saved["step"], dtype=torch.float32).reshape(()).to(p.device).clone()
        self._plans.clear()
        self._reductions.clear()
        self._step_table = None

    def _init_state(self, p: torch.Tensor, part: Partition) -> dict:
        state = self.state[p]
        if state:
            return state
        device = p.device
        state["step"] = torch.zeros((), dtype=torch.float32, device=device)
        m_shape, v_shape = state_shapes(part, p)
        m_dtype = self._m_dtype_name(part, p)
        m_torch_dtype = (torch.float32 if m_dtype == "fp32" else torch.bfloat16 if m_dtype == "bf16"
                         else torch.float8_e4m3fn)
        v_key = "v" if part.kind == "adam" else "vmean"
        n_scales = sum(scale_blocks(seg, self.launch_config.tile) for seg in part.segments)
        if not is_dtensor(p):
            state["m_fp8" if m_dtype == "fp8" else "m"] = torch.zeros(m_shape, dtype=m_torch_dtype, device=device)
            if m_dtype == "fp8":
                state["m_scale"] = torch.ones(n_scales, dtype=torch.float32, device=device)
            state[v_key] = torch.zeros(v_shape, dtype=torch.float32, device=device)
            return state
        # DTensor: m like the parameter; row statistics sharded like its rows; reduced ones replicated.
        state["m_fp8" if m_dtype == "fp8" else "m"] = torch.zeros_like(p, dtype=m_torch_dtype)
        local_rows = local_tensor(p).shape[0]
        if id(p) in self._reduced:
            state[v_key] = torch.zeros(v_shape, dtype=torch.float32, device=device)
            if m_dtype == "fp8":
                state["m_scale"] = torch.ones(n_scales, dtype=torch.float32, device=device)
        elif part.kind == "adam":
            state[v_key] = torch.zeros_like(p, dtype=torch.float32)
        else:  # rows
            state[v_key] = like_param(p, torch.zeros(local_rows, 1, dtype=torch.float32, device=device))
            if m_dtype == "fp8":
                per_row = n_scales // p.shape[0]
                state["m_scale"] = like_param(p, torch.ones(local_rows, per_row, dtype=torch.float32, device=device))
        return state

    # -- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._frozen:
            self._build_partition()
        launches, reduced, by_torch = [], [], []
        entries_of, reduced_ids = self._entries, self._reduced
        for index, group in enumerate(self.param_groups):
            by_launch: dict[tuple, tuple[list[torch.Tensor], list[int]]] = {}
            by_reduced: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                entries = entries_of[id(p)]
                if entries is None:
                    by_torch.append((p, group))
                    continue
                if id(p) in reduced_ids:
                    by_reduced.setdefault((p.dtype, entries[0][0][1]), []).append(p)
                    continue
                for key, segment in entries:
                    members = by_launch.get((p.dtype, key))
                    if members is None:
                        members = by_launch[(p.dtype, key)] = ([], [])
                    members[0].append(p)
                    members[1].append(segment)
            for (dtype, (block_len, m_dtype)), (params, segments) in by_launch.items():
                launches.append((self._plan(index, dtype, block_len, m_dtype, params, segments), group, dtype))
            for (dtype, m_dtype), params in by_reduced.items():
                reduced.append((self._sharded_plan(index, dtype, m_dtype, params), group, dtype))
        plans = [plan for plan, _, _ in launches + reduced]
        clip = None
        if self.max_grad_norm is not None and (plans or by_torch):
            clip = self._clip_coefficient(launches, reduced, by_torch)
        if plans:
            with on_device(one_device((plan.device for plan in plans), _WHO)):
                table = self._step_table
                if table is None or len(table.plans) != len(plans) or any(a is not b
                                                                          for a, b in zip(table.plans, plans)):
                    refuse_rebuild_while_capturing(_WHO)
                    table = self._step_table = StepTable(plans)
                self._increment_steps([table])
                pending = self._reduce_statistics(reduced, clip)
                for plan, group, dtype in launches:
                    launch(plan, group, dtype, clip)
                for work in pending:
                    work.wait()
                for plan, group, dtype in reduced:
                    plan.apply(group, dtype, clip)
        for p, group in by_torch:
            self._torch_step(p, group, clip)
        return loss

    def _clip_coefficient(self, launches: list, reduced: list, by_torch: list) -> torch.Tensor:
        """The fused clip's coefficient: the kernel launches' gradients through their tables; the
        pieces of reduced-statistics parameters and the PyTorch path's through torch's foreach norm."""
        device = (launches + reduced)[0][0].device if launches or reduced else by_torch[0][0].device
        if self._clip is None or self._clip.norm.device != device:
            self._clip = FusedClip(self.max_grad_norm, device)
        others = [local_tensor(p.grad) for plan, _, _ in reduced for p in plan.params]
        others += [p.grad for p, _ in by_torch]
        local_sq = []
        if others:
            local_sq.append(torch.stack(torch._foreach_norm(others, 2.0)).float().square().sum())
        with on_device(device):
            coef = self._clip.coefficient([plan.norm_source(dtype) for plan, _, dtype in launches],
                                          local_sq=local_sq, process_group=self._clip_group)
        self.last_grad_norm = self._clip.norm
        return coef

    def _reduce_statistics(self, reduced: list, clip: torch.Tensor | None = None) -> list:
        """Partial sums of every reduced-statistics launch, then one all-reduce per process group of
        the sums (and one of the fp8 maxima), started without waiting: the row launches run meanwhile."""
        if not reduced:
            return []
        by_group: dict[Any, list[ShardedPlan]] = {}
        for plan, _, _ in reduced:
            by_group.setdefault(plan.key[-1], []).append(plan)
        for process_group, plans in by_group.items():
            bound = self._reductions.get(process_group)
            if bound is None or len(bound[0]) != len(plans) or any(a is not b for a, b in zip(bound[0], plans)):
                refuse_rebuild_while_capturing(_WHO)
                sums = torch.zeros(max(1, sum(p.n_slots for p in plans)), dtype=torch.float32, device=plans[0].device)
                n_scales = sum(p.n_scales for p in plans)
                amax = torch.zeros(n_scales, dtype=torch.float32, device=plans[0].device) if n_scales else None
                slot = scale = 0
                for plan in plans:
                    plan.bind(sums[slot:slot + plan.n_slots],
                              amax[scale:scale + plan.n_scales] if amax is not None and plan.n_scales else None)
                    slot += plan.n_slots
                    scale += plan.n_scales
                self._reductions[process_group] = bound = (tuple(plans), sums, amax)
        for plan, group, dtype in reduced:
            plan.partial(group, dtype, clip)
        pending = []
        import torch.distributed as dist

        for process_group in by_group:
            _, sums, amax = self._reductions[process_group]
            if process_group is None:  # a mesh of one rank, or replicated: nothing to reduce
                continue

            pending.append(dist.all_reduce(sums, group=process_group, async_op=True))
            if amax is not None:
                pending.append(dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=process_group, async_op=True))
        return pending

    def _plan(self, index: int, dtype: torch.dtype, block_len: int, m_dtype: str, params: list[torch.Tensor],
              segments: list[int]) -> LaunchPlan:
        # The kernels read local tensors: a DTensor's own data_ptr() is not its data.
        local_params = [local_tensor(p) for p in params]
        grads = [local_tensor(p.grad) for p in params]
        try:
            key = tuple(map(torch.Tensor.data_ptr, local_params))
            grad_ptrs = tuple(map(torch.Tensor.data_ptr, grads))
        except (RuntimeError, NotImplementedError):  # sparse grads have no data_ptr: say which one
            for p, lp, g in zip(params, local_params, grads):
                check_param_and_grad(self._label(p), lp, g, lp.device, SUPPORTED_DTYPES, _WHO)
            raise

        def check(i: int) -> None:
            check_like_param(self._label(params[i]), params[i], params[i].grad, _WHO)
            check_param_and_grad(self._label(params[i]), local_params[i], grads[i], local_params[0].device,
                                 SUPPORTED_DTYPES, _WHO)

        plan_key = (index, dtype, block_len, m_dtype)
        plan = self._plans.get(plan_key)
        if plan is None or plan.key != key or not plan.repoint_grads(grad_ptrs, check):
            plan = self._plans[plan_key] = self._build_plan(key, list(zip(params, segments)), m_dtype)
        return plan

    def _sharded_plan(self, index: int, dtype: torch.dtype, m_dtype: str, params: list[torch.Tensor]) -> ShardedPlan:
        local_params = [local_tensor(p) for p in params]
        grads = [local_tensor(p.grad) for p in params]
        process_group = self._reduced[id(params[0])]
        key = tuple(map(torch.Tensor.data_ptr, local_params)) + (process_group,)
        plan_key = (index, dtype, "reduced", m_dtype)
        plan = self._plans.get(plan_key)
        if plan is None or plan.key != key:
            plan = self._plans[plan_key] = self._build_sharded_plan(key, params, m_dtype)
        grad_ptrs = tuple(map(torch.Tensor.data_ptr, grads))
        if grad_ptrs != plan.grad_ptrs:
            for p, lp, g in zip(params, local_params, grads):
                check_like_param(self._label(p), p, p.grad, _WHO)
                check_param_and_grad(self._label(p), lp, g, lp.device, SUPPORTED_DTYPES, _WHO)
            plan.repoint_grads(grad_ptrs)
        return plan

    def _build_sharded_plan(self, key: tuple, params: list[torch.Tensor], m_dtype: str) -> ShardedPlan:
        refuse_rebuild_while_capturing(_WHO)
        device = params[0].device
        check_device_supported(device, _WHO)
        entries = []
        for p in params:
            label = self._label(p)
            shard = row_shard(p, label, _WHO)
            if shard.group is not key[-1]:
                raise ValueError(f"{_WHO}: {label} is sharded over another process group than the parameters "
                                 "launched with it; shard every parameter of a param group over one mesh.")
            lp, g = self._checked_locals(p, label, device)
            part = self._parts[id(p)]
            state = self._init_state(p, part)
            m_key = "m_fp8" if m_dtype == "fp8" else "m"
            check_like_param(label, p, state[m_key], _WHO, f"state '{m_key}'")
            m = local_tensor(state[m_key])
            v_key = "v" if "v" in state else "vmean"
            for what, t in ((m_key, m), (v_key, state[v_key]), ("step", state["step"]),
                            ("m_scale", state.get("m_scale"))):
                if t is not None:
                    check_kernel_tensor(t, f"state '{what}' of {label}", device, _WHO)
            if m.shape != lp.shape or not m.is_contiguous():
                raise RuntimeError(f"{_WHO}: state '{m_key}' of {label} holds local shape {tuple(m.shape)}, expected "
                                   f"the parameter's {tuple(lp.shape)} (contiguous).")
            n_blocks = part.n_blocks
            n_scales = sum(scale_blocks(seg, self.launch_config.tile) for seg in part.segments)
            if state[v_key].numel() != n_blocks or (m_dtype == "fp8" and state["m_scale"].numel() != n_scales):
                raise RuntimeError(f"{_WHO}: the replicated statistics of {label} hold {state[v_key].numel()} blocks; "
                                   f"its partition has {n_blocks}: load a state dict saved with the same partition.")
            entries.append(ShardedEntry(lp, g, m, state[v_key], state.get("m_scale") if m_dtype == "fp8" else None,
                                        state["step"], part.segments, shard.flat_start, shard.flat_stop))
        plan = ShardedPlan(key, entries, M_KINDS[m_dtype], self.launch_config.tile)
        plan.params = list(params)  # telemetry() names parameters by their own object
        return plan

    def _torch_step(self, p: torch.Tensor, group: dict, clip: torch.Tensor | None = None) -> None:
        """Parameters with strided blocks (Conv1D columns): the same math in PyTorch ops, per
        segment, m in fp32 or bf16."""
        part = self._parts[id(p)]
        g = p.grad
        check_param_and_grad(self._label(p), p, g, p.device, SUPPORTED_DTYPES, _WHO)
        if clip is not None:
            g = g.float() * clip
        state = self._init_state(p, part)
        state["step"].add_(1)
        beta1, beta2 = group["betas"]
        t = state["step"].double()
        inv_bc1 = (1.0 / (1.0 - torch.pow(beta1, t))).float()
        inv_bc2_sqrt = torch.rsqrt(1.0 - torch.pow(beta2, t)).float()
        lr, eps = float(group["lr"]), group["eps"]
        decay = 1.0 - lr * group["weight_decay"]
        m_full = state["m"]
        vmean_flat = state["vmean"].view(-1)
        for seg in part.segments:
            gr = region(g, seg).float()
            dims = block_dims(seg)
            mean_sq = (gr * gr).mean(dim=dims, keepdim=True)
            vmean = vmean_flat[seg.block_offset:seg.block_offset + seg.n_blocks].view(mean_sq.shape)
            vmean.mul_(beta2).add_(mean_sq, alpha=1.0 - beta2)
            step_size = inv_bc1 / (vmean.sqrt() * inv_bc2_sqrt + eps)
            pr, mr = region(p, seg), region(m_full, seg)
            m_new = torch.lerp(mr.float(), gr, 1.0 - beta1)
            pr.copy_(pr.float() * decay - (m_new * step_size) * lr)
            mr.copy_(m_new)

    @staticmethod
    def _checked_locals(p: torch.Tensor, label: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The local parameter and gradient a launch reads, checked (layout, type, device, storage)."""
        check_like_param(label, p, p.grad, _WHO)
        lp, g = local_tensor(p), local_tensor(p.grad)
        check_param_and_grad(label, lp, g, device, SUPPORTED_DTYPES, _WHO)
        if not lp.is_contiguous() or not g.is_contiguous():
            raise RuntimeError(f"{_WHO}: {label} or its gradient is not contiguous; Adam-mini's blocks are runs "
                               "of the flattened tensor, so both must be contiguous (call .contiguous()).")
        return lp, g

    def _label(self, p: torch.Tensor) -> str:
        return f"parameter '{self._names[id(p)]}' ({'x'.join(map(str, p.shape)) or 'scalar'})"

    def _local_segment(self, p: torch.Tensor, seg: Segment) -> Segment:
        """A row or Adam segment of a DTensor parameter, restricted to this rank's rows."""
        if not is_dtensor(p):
            return seg
        shard = row_shard(p, self._label(p), _WHO)
        n = shard.rows * shard.row_numel
        return Segment(0, n, seg.block_len, n // seg.block_len if seg.block_len else 0, seg.kind, 0)

    def _build_plan(self, key: tuple, members: list[tuple[torch.Tensor, int]], m_dtype: str) -> LaunchPlan:
        refuse_rebuild_while_capturing(_WHO)
        params = [p for p, _ in members]
        device = params[0].device
        check_device_supported(device, _WHO)
        local_params, grads, states, segments, scale_offsets = [], [], [], [], []
        for p, index in members:
            label = self._label(p)
            lp, g = self._checked_locals(p, label, device)
            part = self._parts[id(p)]
            state = self._init_state(p, part)
            local_state = {}
            for k, v in state.items():
                if is_dtensor(p) and k != "step":
                    check_like_param(label, p, v, _WHO, f"state '{k}'")
                local_state[k] = local_tensor(v)
                check_kernel_tensor(local_state[k], f"state '{k}' of {label}", device, _WHO)
            m = local_state.get("m_fp8", local_state.get("m"))
            if m.numel() != lp.numel() or not m.is_contiguous():
                raise RuntimeError(f"{_WHO}: state m of {label} holds {m.numel()} elements (contiguous: "
                                   f"{m.is_contiguous()}), expected the parameter's {lp.numel()}, contiguous.")
            seg = self._local_segment(p, part.segments[index])
            v = local_state["v"] if "v" in local_state else local_state["vmean"]
            if v.numel() < seg.block_offset + (seg.n_blocks if seg.kind != "adam" else lp.numel()):
                raise RuntimeError(f"{_WHO}: state vmean of {label} holds {v.numel()} values, fewer than its blocks.")
            local_params.append(lp)
            grads.append(g)
            states.append(local_state)
            segments.append(seg)
            scale_offsets.append(0 if is_dtensor(p) else
                                 sum(scale_blocks(s, self.launch_config.tile) for s in part.segments[:index]))
        plan = LaunchPlan(key, local_params, grads, states, segments, scale_offsets, M_KINDS[m_dtype],
                          self.launch_config)
        plan.params = params  # telemetry() names parameters by their own object
        return plan


def _reshaped_m(value: torch.Tensor, p: torch.Tensor, part: Partition) -> torch.Tensor:
    """m in the shape this optimizer keeps for ``p`` when ``value`` has the same size in another one."""
    expected = state_shapes(part, p)[0]
    if tuple(value.shape) != tuple(expected) and value.numel() == math.prod(expected):
        return value.reshape(expected).clone()
    return value


def _resolve_state_dtype(state_dtype: str, device: torch.device) -> str:
    """fp8 falls back to bf16, with one warning naming why, where it cannot run."""
    if state_dtype != "fp8":
        return state_dtype
    reason = None
    if not hasattr(torch, "float8_e4m3fn"):
        reason = f"this torch ({torch.__version__}) has no torch.float8_e4m3fn"
    elif device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        reason = f"the GPU is sm_{major}{minor}; fp8 (e4m3) needs sm_89 or newer"
    if reason is None:
        return "fp8"
    warnings.warn(f"{_WHO}: state_dtype='fp8' falls back to 'bf16' because {reason}.", RuntimeWarning, stacklevel=3)
    return "bf16"
