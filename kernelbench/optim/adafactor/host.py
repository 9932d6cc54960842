"""Adafactor8bit's host side: the state format's block sizes, launch configurations, the launch
plan of a param group (tables, buckets, workspace, the exchanges of a sharded step), the
launches of one step, and ``dequantize_state``. Math, state encoding and kernels: ``kernels.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._sharding import is_dtensor
from .._triton_utils import upload_int64
from .kernels import (
    NMETA,
    _factored_apply_kernel,
    _factored_cols_kernel,
    _factored_rms_kernel,
    _factored_stats_kernel,
    _finish_kernel,
    _full_apply_kernel,
    _full_m_encode_kernel,
    _full_rms_kernel,
)

# State format (a checkpoint's codes and ranges are laid out by these; changing one changes the
# state_dict): rows per block of the row statistic's codes, which is also the rows a factored
# program owns, so that each row statistic is complete and requantised in one place (64 rows keep
# the per-block range at 1/8 byte per row and the column partials at 1/64 of g); columns per block
# of the column statistic's codes and of m's absmax in factored tensors, also the column tile
# (64 x 128 fp32 = 32 KB of g per load, 32 values per thread at 8 warps); elements per block of v's
# and (full tensors) m's codes.
ROW_BLOCK = 64
COL_BLOCK = 128
FLAT_BLOCK = 256


@dataclass(frozen=True)
class FactoredConfig:
    """Launch of the factored kernels (K1 stats, K2 columns, K3 rms, K5 apply)."""

    num_warps: int = 8            # K1, K3, K5: one (ROW_BLOCK x COL_BLOCK) tile per iteration
    cols_num_warps: int = 4       # K2
    part_rows: int = 64           # K2: column-partial rows reduced per iteration
    reduce_block: int = 256       # K2: row-statistic partials reduced per iteration


@dataclass(frozen=True)
class FullConfig:
    """Launch of the full (1-dim) kernels (N1 rms, N3 apply)."""

    blocks_per_program: int = 8   # FLAT_BLOCKs per program
    num_warps: int = 4


@dataclass(frozen=True)
class FinishConfig:
    """Launch of K4 finish (one program per tensor)."""

    reduce_block: int = 256       # item partials reduced per iteration
    num_warps: int = 4


@dataclass(frozen=True)
class LaunchConfig:
    factored: FactoredConfig = FactoredConfig()
    full: FullConfig = FullConfig()
    finish: FinishConfig = FinishConfig()


DEFAULT_LAUNCH = LaunchConfig()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _decode_log2(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    return torch.exp2(lo + q.float() * ((hi - lo) / 255.0))


def dequantize_state(param: torch.Tensor, state: dict) -> dict[str, torch.Tensor]:
    """The fp32 values an 8-bit state stands for, by the kernels' decoding formulas (to the last
    bits: the kernels' exp2 and fused multiply-adds round their own way), under the names the fp32
    state uses (``row``, ``col``, ``v``, ``m``): for inspection and tests. The state of a sharded
    parameter is gathered first (a collective: call it on every rank)."""
    out: dict[str, torch.Tensor] = {}
    state = {key: value.full_tensor() if is_dtensor(value) else value for key, value in state.items()}
    if "row_q" in state:
        R, C = param.shape[-2], param.shape[-1]
        B = param.numel() // (R * C)
        rng = state["row_range"].view(B, -1, 2)
        blk = torch.arange(R, device=param.device) // ROW_BLOCK
        q = state["row_q"].reshape(B, R)
        out["row"] = _decode_log2(q, rng[:, blk, 0], rng[:, blk, 1]).view(state["row_q"].shape)
        rng = state["col_range"].view(B, -1, 2)
        blk = torch.arange(C, device=param.device) // COL_BLOCK
        q = state["col_q"].reshape(B, C)
        out["col"] = _decode_log2(q, rng[:, blk, 0], rng[:, blk, 1]).view(state["col_q"].shape)
    if "v_q" in state:
        blk = torch.arange(param.numel(), device=param.device) // FLAT_BLOCK
        rng = state["v_range"]
        out["v"] = _decode_log2(state["v_q"].reshape(-1), rng[blk, 0], rng[blk, 1]).view(param.shape)
    if "m_q" in state:
        q = state["m_q"].reshape(-1).to(torch.int32)
        mag = (q & 127).float() / 127.0
        out["m"] = (torch.where(q >= 128, -1.0, 1.0) * mag * mag * first_moment_absmax(param, state)).view(param.shape)
    return out


def first_moment_absmax(param: torch.Tensor, state: dict) -> torch.Tensor:
    """The absmax of each element's code block of an 8-bit first moment (``m_scale``, one per row
    and column block of a matrix, one per flat block of a full tensor), flat, one per element.
    ``state`` holds whole tensors (gathered, for a sharded parameter)."""
    if param.ndim >= 2:
        return state["m_scale"][:, torch.arange(param.shape[-1], device=param.device) // COL_BLOCK].reshape(-1)
    return state["m_scale"][torch.arange(param.numel(), device=param.device) // FLAT_BLOCK]


@dataclass(frozen=True)
class ShardInfo:
    """Where a tensor's local rows sit in the whole tensor (plans of sharded tensors only)."""

    row0: int         # global index of the first local row of each matrix (factored) / element (full)
    global_rows: int  # rows of each matrix (factored) / elements (full) of the whole tensor
    group: Any = None  # torch.distributed process group holding the other rows; None: every row is here


@dataclass(frozen=True)
class Exchange:
    """The workspace slices one process group reduces, per phase of a sharded step: sums after
    the column partials (A) and after the u^2 partials (B), maxima with B (the log2 ranges of code
    blocks that ranks share, -lo and hi) and after the apply (C, absmax of full tensors' m)."""

    group: Any
    sum_a: tuple[int, int]
    sum_b: tuple[int, int]
    max_b: tuple[int, int]
    max_c: tuple[int, int]


@dataclass
class Bucket:
    factored: bool
    quant: bool
    aligned: bool
    items: tuple[int, int]          # range in the group's item table
    col_items: tuple[int, int]      # range in the column item table (factored)


@dataclass
class Plan:
    """One param group's launch tables, reused while its tensors stay the same (``key``)."""

    key: tuple
    meta: torch.Tensor
    items: torch.Tensor
    col_items: torch.Tensor | None
    buckets: list[Bucket]
    n_tensors: int
    n_items: int
    ws_floats: int
    scal_off: int
    config: LaunchConfig
    # Sharded plans only (None for a single-device plan): the reductions across ranks, the
    # workspace range reset to -inf before each step (max slots that other ranks' rows fill), and
    # whether full tensors' 8-bit first moments wait for an absmax reduction (phase C).
    exchanges: list[Exchange] | None = None
    max_slots: tuple[int, int] = (0, 0)
    m_after_exchange: bool = False
    # The state tensors whose addresses the tables hold, kept alive with them: a state tensor
    # replaced by anything but load_state_dict (which drops the plans) leaves no dangling address.
    state_refs: tuple = ()


_EXCHANGED = ("sum_a", "sum_b", "max_b", "max_c")


def _exchange_sizes(p: torch.Tensor, factored: bool, quant: bool, has_m: bool, shard: ShardInfo,
                    flat_chunk: int) -> dict[str, int]:
    """Floats each exchanged slot of a tensor holds (the same on every rank: global sizes only)."""
    if factored:
        C = p.shape[-1]
        B = p.numel() // (p.shape[-2] * C) if p.numel() else math.prod(p.shape[:-2])
        n_range = B * _cdiv(shard.global_rows, ROW_BLOCK) if quant else 0
        return {"sum_a": B * C + B, "sum_b": 2, "max_b": 2 * n_range, "max_c": 0, "n_range": n_range}
    blocks = _cdiv(shard.global_rows, FLAT_BLOCK)
    return {"sum_a": 0, "sum_b": 2, "max_b": 2 * blocks if quant else 0,
            "max_c": blocks if quant and has_m else 0, "n_range": 0}


def build_plan(entries: list[tuple[torch.Tensor, torch.Tensor, int, dict]], key: tuple, has_m: bool,
               device: torch.device, config: LaunchConfig = DEFAULT_LAUNCH,
               shards: list[ShardInfo] | None = None) -> Plan:
    """The launch tables of one group. ``entries``: (param, grad, salt, state) with the state
    already initialised, every tensor the one a kernel reads (local shards of sharded tensors);
    tensors are bucketed by kind of work (factored / full x 8-bit / fp32), one launch per bucket,
    longest rows first for load balance. ``shards`` (one per entry) makes a sharded plan: items
    over the local rows, exchange slots in the same order on every rank."""
    flat_chunk = FLAT_BLOCK * config.full.blocks_per_program
    kinds: dict[tuple[bool, bool], list] = {}
    for i, e in enumerate(entries):
        p, state = e[0], e[3]
        quant = "step" in state and ("row_q" in state or "v_q" in state)
        kinds.setdefault((p.ndim >= 2, quant), []).append((*e, shards[i] if shards is not None else None))
    meta_rows: list[list[int]] = []
    items: list[int] = []
    col_items: list[int] = []
    buckets: list[Bucket] = []
    ordered = []
    for (factored, quant), group_entries in sorted(kinds.items(), key=lambda kv: (not kv[0][0], not kv[0][1])):
        if factored:
            group_entries = sorted(group_entries, key=lambda e: -e[0].shape[-1])
        ordered.append((factored, quant, group_entries))

    def n_work_items(p: torch.Tensor, factored: bool, shard: ShardInfo | None) -> int:
        if factored:
            return p.numel() // (p.shape[-2] * p.shape[-1]) * _cdiv(p.shape[-2], ROW_BLOCK) if p.numel() else 0
        # a sharded full tensor's items cover the whole tensor: see _flat_blocks_sharded
        return _cdiv(shard.global_rows if shard is not None else p.numel(), flat_chunk)

    n_items_total = sum(n_work_items(e[0], factored, e[4]) for factored, _, group_entries in ordered
                        for e in group_entries)
    n_tensors = sum(len(e) for _, _, e in ordered)
    scal_off = 3 * n_items_total
    cursor = scal_off + 4 * n_tensors  # rmean, rowtmp, coltmp, colpart follow the scalars
    offsets: list[dict[str, int]] = []
    for factored, _, group_entries in ordered:
        for p, *_ in group_entries:
            off = {}
            if factored:
                R, C = p.shape[-2], p.shape[-1]
                B = p.numel() // (R * C) if p.numel() else math.prod(p.shape[:-2])
                for name, n in (("rmean", B), ("rowtmp", B * R), ("coltmp", B * C),
                                ("colpart", B * _cdiv(R, ROW_BLOCK) * C)):
                    off[name] = cursor
                    cursor += n
            offsets.append(off)

    exchanges: list[Exchange] | None = None
    max_slots = (0, 0)
    m_after_exchange = False
    if shards is not None:
        # Exchange slots: phase by phase, process group by group, tensor by tensor, so that each
        # (phase, group) is one contiguous slice laid out alike on every rank of the group.
        flat = [(factored, quant, e) for factored, quant, group_entries in ordered for e in group_entries]
        sizes = [_exchange_sizes(e[0], factored, quant, has_m, e[4], flat_chunk) for factored, quant, e in flat]
        groups: list[Any] = []
        for _, _, e in flat:
            if not any(e[4].group is g for g in groups):
                groups.append(e[4].group)
        spans: dict[str, list[tuple[int, int]]] = {}
        for region in _EXCHANGED:
            spans[region] = []
            for g in groups:
                start = cursor
                for k, (_, _, e) in enumerate(flat):
                    if e[4].group is g and sizes[k][region]:
                        offsets[k][region] = cursor
                        cursor += sizes[k][region]
                spans[region].append((start, cursor))
        max_slots = (spans["max_b"][0][0], spans["max_c"][-1][1])
        for k, (_, _, e) in enumerate(flat):
            offsets[k]["n_range"] = sizes[k]["n_range"]
            if sizes[k]["max_c"]:
                offsets[k]["mtmp"] = cursor
                cursor += e[0].numel()
                m_after_exchange = True
        exchanges = [Exchange(g, *(spans[r][i] for r in _EXCHANGED)) for i, g in enumerate(groups) if g is not None]
    ws_floats = cursor

    k = 0
    item_cursor = 0
    for factored, quant, group_entries in ordered:
        first_item, first_col_item = item_cursor, len(col_items) // 2
        aligned = factored
        for p, g, salt, state, shard in group_entries:
            off = offsets[k]
            n_items = n_work_items(p, factored, shard)
            if factored:
                R, C = p.shape[-2], p.shape[-1]
                B = p.numel() // (R * C) if p.numel() else math.prod(p.shape[:-2])
                for j in range(B * _cdiv(C, COL_BLOCK)):
                    col_items += [k, j]
                v_key, vr_key = ("row_q", "row_range") if quant else ("row", None)
                c_key, cr_key = ("col_q", "col_range") if quant else ("col", None)
                aligned = aligned and C % 16 == 0
            else:
                R, C, B = p.numel(), 1, 1
                v_key, vr_key = ("v_q", "v_range") if quant else ("v", None)
                c_key = cr_key = None
            m_key, ms_key = (("m_q", "m_scale") if quant else ("m", None)) if has_m else (None, None)

            def addr(name, state=state):
                return state[name].data_ptr() if name else 0

            row = [g.data_ptr(), p.data_ptr(), addr("step"), addr(v_key), addr(vr_key), addr(c_key),
                   addr(cr_key), addr(m_key), addr(ms_key), R, C, B, item_cursor, n_items,
                   off.get("colpart", 0), off.get("rowtmp", 0), off.get("coltmp", 0), off.get("rmean", 0), salt]
            row += ([shard.row0, shard.global_rows] + [off.get(name, 0) for name in
                                                       ("sum_a", "sum_b", "max_b", "max_c", "mtmp", "n_range")]
                    if shard is not None else [0] * 8)
            if factored:
                aligned = aligned and all(a % 16 == 0 for a in row[:2] + [row[7]] if a)
            meta_rows.append(row)
            for j in range(n_items):
                items += [k, j]
            item_cursor += n_items
            k += 1
        buckets.append(Bucket(factored, quant, aligned, (first_item, item_cursor),
                              (first_col_item, len(col_items) // 2)))
    return Plan(
        key=key,
        meta=upload_int64([v for row in meta_rows for v in row], device).view(n_tensors, NMETA.value),
        items=upload_int64(items, device).to(torch.int32).view(-1, 2),
        col_items=upload_int64(col_items, device).to(torch.int32).view(-1, 2) if col_items else None,
        buckets=buckets, n_tensors=n_tensors, n_items=item_cursor, ws_floats=ws_floats, scal_off=scal_off,
        config=config, exchanges=exchanges, max_slots=max_slots, m_after_exchange=m_after_exchange,
        state_refs=tuple(t for e in entries for t in e[3].values()),
    )


def _group_scalars(group: dict) -> tuple[float, float, bool, float, float, bool, bool, float]:
    """A group's hyperparameters as the kernels take them: (eps1, eps2, fixed beta2?, beta2,
    decay_rate, scale_parameter, first moment?, beta1); an absent beta is passed as 0.0."""
    eps1, eps2 = (float(e) for e in group["eps"])
    fixed, has_m = group["beta2"] is not None, group["beta1"] is not None
    return (eps1, eps2, fixed, float(group["beta2"]) if fixed else 0.0, float(group["decay_rate"]),
            bool(group["scale_parameter"]), has_m, float(group["beta1"]) if has_m else 0.0)


def launch_step(plan: Plan, group: dict) -> None:
    """One Adafactor step of a group: K1-K3 / N1 per bucket, K4 once, then K5 / N3 per bucket."""
    if plan.exchanges is not None:
        _launch_sharded_step(plan, group)
        return
    fac, full, fin = plan.config.factored, plan.config.full, plan.config.finish
    ws = torch.empty(plan.ws_floats, dtype=torch.float32, device=plan.meta.device)
    eps1, eps2, fixed, beta2, decay_rate, scale_param, has_m, beta1 = _group_scalars(group)
    for b in plan.buckets:
        items = plan.items[b.items[0]:b.items[1]]
        n = b.items[1] - b.items[0]
        if b.factored:
            _factored_stats_kernel[(n,)](
                items, plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant, FIXED_BETA2=fixed,
                SCALE_PARAM=scale_param, ALIGNED=b.aligned, BR=ROW_BLOCK, BC=COL_BLOCK, num_warps=fac.num_warps)
            col_items = plan.col_items[b.col_items[0]:b.col_items[1]]
            _factored_cols_kernel[(b.col_items[1] - b.col_items[0],)](
                col_items, plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant, FIXED_BETA2=fixed,
                BR=ROW_BLOCK, BCC=COL_BLOCK, PR=fac.part_rows, RB=fac.reduce_block, num_warps=fac.cols_num_warps)
            _factored_rms_kernel[(n,)](items, plan.meta, ws, ALIGNED=b.aligned, BR=ROW_BLOCK,
                                       BC=COL_BLOCK, num_warps=fac.num_warps)
        else:
            _full_rms_kernel[(n,)](
                items, plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant, FIXED_BETA2=fixed,
                SCALE_PARAM=scale_param, NB=full.blocks_per_program, QB=FLAT_BLOCK, num_warps=full.num_warps)
    _finish_kernel[(plan.n_tensors,)](
        plan.meta, ws, plan.scal_off, float(group["lr"]), eps2, float(group["clip_threshold"]),
        float(group["weight_decay"]), RELATIVE_STEP=bool(group["relative_step"]),
        SCALE_PARAM=scale_param, RB=fin.reduce_block, num_warps=fin.num_warps)
    for b in plan.buckets:
        items = plan.items[b.items[0]:b.items[1]]
        n = b.items[1] - b.items[0]
        if b.factored:
            _factored_apply_kernel[(n,)](
                items, plan.meta, ws, plan.scal_off, beta1, QUANT=b.quant, HAS_M=has_m,
                ALIGNED=b.aligned, BR=ROW_BLOCK, BC=COL_BLOCK, num_warps=fac.num_warps)
        else:
            _full_apply_kernel[(n,)](
                items, plan.meta, ws, plan.scal_off, eps1, beta2, decay_rate, beta1, QUANT=b.quant,
                FIXED_BETA2=fixed, HAS_M=has_m, NB=full.blocks_per_program, QB=FLAT_BLOCK, num_warps=full.num_warps)


def _exchange(plan: Plan, ws: torch.Tensor, region: str, op: Any) -> None:
    """One all-reduce per process group of the phase's slice (no host synchronisation: NCCL
    orders it on the stream)."""
    import torch.distributed as dist

    for ex in plan.exchanges:
        start, stop = getattr(ex, region)
        if stop > start:
            dist.all_reduce(ws[start:stop], op=op, group=ex.group)


def _launch_sharded_step(plan: Plan, group: dict) -> None:
    """The step of a group holding local rows of sharded tensors (each rank runs it on its rows):
    K1 and K2's column partials, exchange A (column and row-statistic sums), K2's column
    statistics and K3 / N1, K4's sums, exchange B (p^2 and u^2 sums, shared ranges), K4's
    scalars, K5 / N3, and for full tensors' 8-bit first moments exchange C (absmax) and N4."""
    from torch.distributed import ReduceOp

    fac, full, fin = plan.config.factored, plan.config.full, plan.config.finish
    ws = torch.empty(plan.ws_floats, dtype=torch.float32, device=plan.meta.device)
    if plan.max_slots[1] > plan.max_slots[0]:
        ws[plan.max_slots[0]:plan.max_slots[1]].fill_(-math.inf)
    eps1, eps2, fixed, beta2, decay_rate, scale_param, has_m, beta1 = _group_scalars(group)
    finish_args = (float(group["lr"]), eps2, float(group["clip_threshold"]), float(group["weight_decay"]))

    def cols(b: Bucket, phase: int) -> None:
        _factored_cols_kernel[(b.col_items[1] - b.col_items[0],)](
            plan.col_items[b.col_items[0]:b.col_items[1]], plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant,
            FIXED_BETA2=fixed, BR=ROW_BLOCK, BCC=COL_BLOCK, PR=fac.part_rows, RB=fac.reduce_block, PHASE=phase,
            num_warps=fac.cols_num_warps)

    def finish(phase: int) -> None:
        _finish_kernel[(plan.n_tensors,)](
            plan.meta, ws, plan.scal_off, *finish_args, RELATIVE_STEP=bool(group["relative_step"]),
            SCALE_PARAM=scale_param, RB=fin.reduce_block, PHASE=phase, num_warps=fin.num_warps)

    for b in plan.buckets:
        n = b.items[1] - b.items[0]
        if b.factored:
            if n:  # a rank may hold no row of any tensor of the bucket
                _factored_stats_kernel[(n,)](
                    plan.items[b.items[0]:b.items[1]], plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant,
                    FIXED_BETA2=fixed, SCALE_PARAM=scale_param, ALIGNED=b.aligned, BR=ROW_BLOCK, BC=COL_BLOCK,
                    SHARDED=True, num_warps=fac.num_warps)
            cols(b, 1)
    _exchange(plan, ws, "sum_a", ReduceOp.SUM)
    for b in plan.buckets:
        items = plan.items[b.items[0]:b.items[1]]
        n = b.items[1] - b.items[0]
        if b.factored:
            cols(b, 2)
            if n:
                _factored_rms_kernel[(n,)](items, plan.meta, ws, ALIGNED=b.aligned, BR=ROW_BLOCK,
                                           BC=COL_BLOCK, num_warps=fac.num_warps)
        else:
            _full_rms_kernel[(n,)](
                items, plan.meta, ws, eps1, beta2, decay_rate, QUANT=b.quant, FIXED_BETA2=fixed,
                SCALE_PARAM=scale_param, NB=full.blocks_per_program, QB=FLAT_BLOCK, SHARDED=True,
                num_warps=full.num_warps)
    finish(1)
    _exchange(plan, ws, "sum_b", ReduceOp.SUM)
    _exchange(plan, ws, "max_b", ReduceOp.MAX)
    finish(2)
    for b in plan.buckets:
        items = plan.items[b.items[0]:b.items[1]]
        n = b.items[1] - b.items[0]
        if b.factored and n:
            _factored_apply_kernel[(n,)](
                items, plan.meta, ws, plan.scal_off, beta1, QUANT=b.quant, HAS_M=has_m,
                ALIGNED=b.aligned, BR=ROW_BLOCK, BC=COL_BLOCK, SHARDED=True, num_warps=fac.num_warps)
        elif not b.factored:
            _full_apply_kernel[(n,)](
                items, plan.meta, ws, plan.scal_off, eps1, beta2, decay_rate, beta1, QUANT=b.quant,
                FIXED_BETA2=fixed, HAS_M=has_m, NB=full.blocks_per_program, QB=FLAT_BLOCK, SHARDED=True,
                num_warps=full.num_warps)
    if plan.m_after_exchange:
        _exchange(plan, ws, "max_c", ReduceOp.MAX)
        for b in plan.buckets:
            if not b.factored and b.quant and has_m:
                _full_m_encode_kernel[(b.items[1] - b.items[0],)](
                    plan.items[b.items[0]:b.items[1]], plan.meta, ws, plan.scal_off, NB=full.blocks_per_program,
                    QB=FLAT_BLOCK, num_warps=full.num_warps)
