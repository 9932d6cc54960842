"""ZeRO-1 sharded AdamW on torch.distributed: each rank keeps 1/world of AdamW's state.

The math is torch.optim.AdamW's, applied to the gradient averaged over the ranks,
g = (1/W) * sum_r g_r, at step t:

    p <- p * (1 - lr * weight_decay)
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Layout. The parameters of each param group are packed, in order, into flat fp32 *buckets* of at
most ``bucket_bytes`` (a larger parameter gets a bucket of its own). Every parameter becomes a view
into its bucket (``p.data`` and ``p.grad`` are re-pointed once, at construction), so a step copies
nothing in or out (copying 370M fp32 params out of a flat buffer and back would move 2.9 GB per
step, a visible share of it). Each parameter starts on a 64-element
(256-byte) boundary and each bucket is padded to a multiple of ``64 * world`` elements, so the W
shards of a bucket are equal and aligned; the padding holds zeros and stays zero. Rank r owns
shard r of every bucket and holds the moments of that shard only.

A step, per bucket, in the same order on every rank:

    reduce-scatter(grad bucket, AVG)   rank r's shard of the grad bucket now holds the averaged
                                       gradient of that shard (in place: no extra buffer)
    adamw_step_flat(param shard, grad shard, m, v, step)   the Triton kernel, one launch
    all-gather(param bucket)           every rank's updated shard lands in every replica (in place)

Pipelining: all reduce-scatters are issued first (async), then for each bucket the update waits
for its own reduce-scatter only and its all-gather is issued right after it, so while bucket b is
updated the reduce-scatters of b+1.. (and the all-gathers of ..b-1) are on the wire. With NCCL the
waits are stream waits: ``step()`` never blocks the host.

Gradients: after a step the owned shard of each grad bucket holds the averaged gradient and the
rest the local one; ``zero_grad()`` zeroes the buckets in place and keeps ``p.grad`` as views (so
the next backward accumulates into them). A parameter whose grad is None is stepped with a zero
gradient (as in DDP's buckets; torch.optim.AdamW would skip it).

Overlap (``overlap_grad_reduce=True``). A post-accumulate-grad hook on every parameter counts the
grads of its bucket; the backward produces the last parameters' grads first, so buckets are
launched in reverse bucket order, each one as soon as it is complete and every bucket after it has
been launched. That fixed order keeps the collectives in the same sequence on every rank, whatever
order the hooks fire in; ``step()`` launches the buckets whose hooks never fired (unused params:
zero grads, as above), then waits and updates as above. Between the backward and ``step()`` the
grad buckets are being reduced in place: read or change ``p.grad`` only after ``step()``. For
gradient accumulation run all but the last backward under ``with optimizer.no_sync():``; a second
backward outside it, before ``step()``, into a bucket already launched raises.

Clipping (``max_grad_norm``): the global 2-norm of the averaged gradient, as
``clip_grad_norm_`` on one process would compute it after an all-reduce: each rank's sum of squares
over its reduced shards (one launch, ``kernelbench.optim.grad_norm``), all-reduced as one scalar,
then the clip coefficient folded into ``adamw_step_flat``. The updates wait for every bucket's
reduce-scatter (the norm needs them all), so they no longer overlap the later reductions.

Freeing the gradient (``free_grads=True``, ZeRO-2; needs ``overlap_grad_reduce``). Each bucket's
reduce-scatter writes this rank's shard into one buffer holding every bucket's shard, made by the
step's first reduction and released once the step's updates are queued. The full-size grad bucket
(and its bf16 copy) is released as soon as its reduce-scatter has completed: during the backward,
once ``REDUCTIONS_IN_FLIGHT`` later buckets have been launched (the compute stream waits for the
older reduction, which has had those buckets' backward to finish), the rest in ``step()`` (or in
``zero_grad()`` for a skipped step). So the backward holds a few buckets of full gradient at a
time, not the whole model's, and between steps no gradient is held. Released buckets leave
``p.grad`` None, as with ZeRO-2 elsewhere: read grads before the backward ends. The next backward's
first hook of a bucket allocates it again (zeroed) and copies the new grads in; a bucket of one
parameter whose grad autograd made with the bucket's exact size takes that tensor as its buffer
instead (no copy). With one process the whole gradient is owned, so nothing is freed.

Prefetching the parameters (``prefetch_params=True``): ``step()`` returns with its all-gathers in
flight, in bucket order (the forward's order; clipped, each right behind its bucket's update, else
after every update); a forward pre-hook on every module that owns a parameter (``attach(model)`` or
``module=``) waits for the all-gathers of that module's buckets just before its forward, so the next
forward's first layers overlap the later buckets' gathers. ``step()``, the state dicts and
``wait_params()`` wait for whatever is left (``zero_grad()`` touches no parameter, so does not); code
that reads a parameter outside its module's forward must call ``wait_params()`` first.

Gradient traffic in bf16 (``grad_comm_dtype=torch.bfloat16``): each bucket is cast into a bf16 copy
that is reduce-scattered with SUM; the owned shard is upcast into the fp32 grad shard and scaled by
1/W there. The moments, params and update stay fp32.

Parameter traffic in bf16 (a param group's ``param_comm_dtype=torch.bfloat16``): the owned shard is
cast (round to nearest even) into a bf16 bucket made for the all-gather, and the other ranks' shards
are upcast from it into the fp32 params once it lands; the buffer goes when the gather is finished.
The owned shard keeps its exact fp32 value, the master copy the update works on, and no other copy
is kept: the state stays the moments. The rest of each replica holds the owners' values rounded to
bf16. A parameter that enters the computation only through autocast's bf16 cast (an ``nn.Linear``
weight under ``torch.autocast(dtype=torch.bfloat16)``) gets the rounding autocast applies anyway, so
every rank computes what it would with fp32 traffic, bit for bit. One read in fp32 (an embedding, a
norm's weight, a forward outside autocast) sees the rounding on the ranks that do not own it, as
every rank does under FSDP2's bf16 ``param_dtype``. ``gather_params_fp32()`` gives every replica the
exact values again (before saving the model or evaluating it in fp32). Buckets follow the groups in
order and the overlap launches them in reverse: keep the groups in the model's order (for a Llama,
the embedding in fp32, then the layers in bf16).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.weak

# Elements per alignment unit: 64 fp32 = 256 bytes, so every parameter view and every shard starts
# on a boundary that vectorised loads (and TMA, which needs 16 bytes) are happy with.
ALIGN = 64

COMM_MODES = ("auto", "reduce-scatter-avg", "reduce-scatter-sum", "all-reduce")

PER_RANK_FORMAT = "kernelbench.ShardedAdamW/per-rank/v1"

# Keys torch.optim.AdamW's param groups carry beyond ours; a consolidated state dict includes them
# so that torch.optim.AdamW.load_state_dict takes it as its own (TritonAdamW's groups carry them too).
TORCH_ADAMW_GROUP_EXTRAS = {
    "amsgrad": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": True,
}

GRAD_COMM_DTYPES = (None, torch.float32, torch.bfloat16)
PARAM_COMM_DTYPES = GRAD_COMM_DTYPES

# free_grads: reduce-scatters left running while the backward goes on; an older bucket is waited for
# and released. Two keep the wait off the critical path when a bucket's communication takes up to
# twice its backward, and the backward's full-size gradient at three buckets. Three gave the same
# backward on 2 H100s (results/2026-11-28-4xh100-dist-train-step-every-candidate).
REDUCTIONS_IN_FLIGHT = 2

# Parameter -> the overlapping ShardedAdamW whose hooks it carries (a weak reference), so that a
# second optimizer over the same params is refused instead of launching a second set of reductions.
_HOOKED_PARAMS: torch.utils.weak.WeakIdKeyDictionary = torch.utils.weak.WeakIdKeyDictionary()


def _grad_ready_hook(owner: weakref.ref, bucket_index: int, position: int, param: torch.Tensor) -> None:
    optimizer = owner()
    if optimizer is not None:  # a collected optimizer leaves inert hooks behind
        optimizer._grad_ready(bucket_index, position, param)


def _params_needed_hook(owner: weakref.ref, bucket_indices: tuple[int, ...], module: Any, args: Any) -> None:
    optimizer = owner()
    if optimizer is not None:
        optimizer._wait_gathers(bucket_indices)


def _reduce_scatter_single() -> Callable[..., Any]:
    # torch 2.13 renamed reduce_scatter_tensor (now deprecated); the GPU machine runs 2.11.
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather_single() -> Callable[..., Any]:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# One communicator: few large buckets, since every collective has a fixed cost and bucket b's
# all-gather waits in the queue behind every reduce-scatter anyway. All-gathers on a second
# communicator: smaller buckets, since two collectives at once move more over NVLink than one and
# smaller buckets keep both running for more of the step. The bucket sweep behind both defaults
# (2 H200s, model-370m): results/2026-11-22-2xh200-dist-adamw/bench. Overlapped with the backward,
# 1 GiB too: at 256 MiB the backward waits on its reduce-scatters (Llama-1B, 4 H200s,
# results/2026-11-27-4xgpu-dist-train-step-phases).
DEFAULT_BUCKET_BYTES = 2**30
DEFAULT_BUCKET_BYTES_WITH_GATHER_GROUP = 256 * 2**20


@dataclass
class _Bucket:
    index: int
    group_index: int
    group: dict[str, Any]  # the param group: hyperparameters are read from it at every step
    params: list[torch.Tensor]
    param_indices: list[int]  # positions in the optimizer's global parameter order
    offsets: list[int]
    param_flat: torch.Tensor
    grad_flat: torch.Tensor | None  # None while released by free_grads
    param_ptrs: list[int]  # where each param's data must stay (checked at every step, host only)
    grad_views: list[torch.Tensor]  # empty while released by free_grads
    shard_numel: int
    param_shard: torch.Tensor  # this rank's slice of param_flat (a view)
    # This rank's slice of grad_flat (a view); with free_grads a view of the step's shard buffer,
    # None between steps.
    grad_shard: torch.Tensor | None
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: torch.Tensor  # 0-d fp32 on the params' device; the kernel increments it
    comm_flat: torch.Tensor | None  # grad_flat cast to grad_comm_dtype for the wire (None: grad_flat itself)
    comm_shard: torch.Tensor | None  # this rank's slice of comm_flat
    gather_dtype: torch.dtype | None  # the group's param_comm_dtype; None: param_flat itself is gathered
    gather_flat: torch.Tensor | None = None  # the bf16 bucket of an all-gather in flight


class ShardedAdamW(torch.optim.Optimizer):
    """AdamW with its state sharded over the ranks of a process group (ZeRO stage 1).

    Args:
        params: parameters or param groups (named parameters accepted), fp32, on one device, and
            the same list (names, shapes, order) on every rank.
        lr, betas, eps, weight_decay, maximize: as torch.optim.AdamW.
        bucket_bytes: flat bucket size; smaller buckets overlap more, larger ones use the links
            better. By default 1 GiB, or 256 MiB with a ``gather_group`` (the constants say why).
        process_group: the group to shard over; by default the world group when torch.distributed
            is initialised, else a single process (no communication at all).
        gather_group: optional second group over the same ranks (``dist.new_group(ranks)``) for the
            all-gathers. NCCL runs one communicator's collectives one after another, so on one
            group bucket b's all-gather waits for every reduce-scatter issued before it; on its
            own communicator it can run beside them.
        comm: how gradients are averaged. ``auto``: NCCL uses reduce-scatter with AVG; other
            backends are probed at construction for reduce-scatter with AVG, then with SUM (and a
            scale), then fall back to all-reduce SUM + list all-gather (old Gloo builds lack the
            flat-tensor collectives). Name a mode to force it.
        overlap_grad_reduce: launch each bucket's reduce-scatter from the backward, as soon as its
            params have their grads (module docstring, "Overlap"); needs torch >= 2.1. Use
            ``no_sync()`` for all but the last backward of an accumulation.
        grad_comm_dtype: dtype of the gradients on the wire. None (or fp32): the grads themselves,
            reduced in fp32. ``torch.bfloat16``: half the traffic, at the cost of the roundings
            listed in ``_finish_reduce``; the update stays fp32.
        max_grad_norm: clip the averaged gradient to this global 2-norm inside ``step()`` (module
            docstring, "Clipping"); ``last_grad_norm`` is then the pre-clip norm, a 0-d fp32 device
            tensor, equal on every rank.
        free_grads: ZeRO-2 (module docstring, "Freeing the gradient"): the backward holds a few
            buckets of full gradient at a time, and after ``step()`` this rank holds no gradient
            (``p.grad`` is None). Needs overlap_grad_reduce.
        prefetch_params: ``step()`` leaves the parameter all-gathers in flight and the next forward
            waits for each bucket's just before its first module runs (module docstring,
            "Prefetching the parameters"); needs the model: ``module=`` or ``attach(model)``.
        module: the model whose modules own the params, for prefetch_params (see ``attach``).
        param_comm_dtype: dtype of the parameters on the wire in the all-gathers, a param-group
            option like ``lr`` (this is every group's default). None (or fp32): exact.
            ``torch.bfloat16``: half the traffic; exact for parameters read only through autocast's
            bf16 cast, rounded on the ranks that do not own them otherwise (module docstring,
            "Parameter traffic in bf16").

    Construction is collective (every rank must build it) and checks that the ranks agree on the
    parameter list; ``step()`` and ``consolidated_state_dict()`` are collective too. The params
    are taken to be replicated (equal on every rank, as after DDP's broadcast); should they differ,
    the first step's all-gather makes them equal, each shard taking its owner's values.
    Hyperparameters are read from ``param_groups`` at every step, so LR schedulers work.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        maximize: bool = False,
        bucket_bytes: int | None = None,
        process_group: dist.ProcessGroup | None = None,
        gather_group: dist.ProcessGroup | None = None,
        comm: str = "auto",
        overlap_grad_reduce: bool = False,
        grad_comm_dtype: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        free_grads: bool = False,
        prefetch_params: bool = False,
        module: torch.nn.Module | None = None,
        param_comm_dtype: torch.dtype | None = None,
    ) -> None:
        from kernelbench.optim.grad_norm import check_max_grad_norm

        self.max_grad_norm = check_max_grad_norm(max_grad_norm, "ShardedAdamW")
        self.last_grad_norm: torch.Tensor | None = None
        if not 0.0 <= lr:
            raise ValueError(f"ShardedAdamW: invalid learning rate {lr}; accepted: lr >= 0")
        if not 0.0 <= eps:
            raise ValueError(f"ShardedAdamW: invalid eps {eps}; accepted: eps >= 0")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"ShardedAdamW: invalid betas[{i}] = {beta}; accepted: 0 <= beta < 1")
        if not 0.0 <= weight_decay:
            raise ValueError(f"ShardedAdamW: invalid weight_decay {weight_decay}; accepted: >= 0")
        if bucket_bytes is None:
            bucket_bytes = DEFAULT_BUCKET_BYTES if gather_group is None else DEFAULT_BUCKET_BYTES_WITH_GATHER_GROUP
        if not isinstance(bucket_bytes, int) or bucket_bytes < 4:
            raise ValueError(f"ShardedAdamW: bucket_bytes must be an int >= 4, got {bucket_bytes!r}")
        if comm not in COMM_MODES:
            raise ValueError(f"ShardedAdamW: unknown comm mode {comm!r}; accepted: {', '.join(COMM_MODES)}")
        if grad_comm_dtype not in GRAD_COMM_DTYPES:
            raise ValueError(
                f"ShardedAdamW: grad_comm_dtype={grad_comm_dtype!r} is not supported; accepted: None "
                "(the grads' own fp32), torch.float32 or torch.bfloat16"
            )
        if overlap_grad_reduce and not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            raise RuntimeError(
                f"ShardedAdamW: overlap_grad_reduce=True needs torch >= 2.1 (Tensor.register_post_accumulate_"
                f"grad_hook); this is torch {torch.__version__}. Pass overlap_grad_reduce=False"
            )

        if free_grads and not overlap_grad_reduce:
            raise ValueError(
                "ShardedAdamW: free_grads=True needs overlap_grad_reduce=True (the backward's hooks "
                "allocate the freed gradient bucket again); pass both or neither"
            )
        if module is not None and not prefetch_params:
            raise ValueError("ShardedAdamW: module= is for prefetch_params=True; pass both or neither")

        self._constructing = True
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize,
                        param_comm_dtype=param_comm_dtype)
        super().__init__(params, defaults)
        self._constructing = False
        for g, group in enumerate(self.param_groups):
            if group["param_comm_dtype"] not in PARAM_COMM_DTYPES:
                raise ValueError(
                    f"ShardedAdamW: param group {g} has param_comm_dtype={group['param_comm_dtype']!r}; accepted: "
                    "None (the params' own fp32), torch.float32 or torch.bfloat16"
                )

        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.bucket_bytes = bucket_bytes
        self.overlap_grad_reduce = bool(overlap_grad_reduce)
        self.grad_comm_dtype = None if grad_comm_dtype == torch.float32 else grad_comm_dtype
        self._comm_cast = self.grad_comm_dtype is not None and self.world_size > 1
        self.free_grads = bool(free_grads) and self.world_size > 1  # one process owns the whole gradient
        self.prefetch_params = bool(prefetch_params)
        if gather_group is not None and (
            process_group is None
            or dist.get_world_size(gather_group) != self.world_size
            or dist.get_rank(gather_group) != self.rank
        ):
            raise ValueError(
                "ShardedAdamW: gather_group must span the same ranks, in the same order, as process_group "
                f"(here world size {self.world_size}, rank {self.rank}); make it with dist.new_group(ranks)"
            )
        self.gather_group = gather_group if gather_group is not None else process_group

        all_params = [p for group in self.param_groups for p in group["params"]]
        try:
            self._check_params(all_params)
            local_error = None
        except (TypeError, ValueError) as error:
            if self.world_size == 1:
                raise
            local_error = error  # raised after the exchange below, so no peer is left waiting
        if self.world_size > 1:
            self._check_ranks_agree(local_error)
        self.device = all_params[0].device
        self.comm = self._choose_comm(comm)

        from kernelbench.optim.adamw import adamw_step_flat  # defines Triton kernels: import late

        self._adamw_step_flat = adamw_step_flat
        self._clip: Any = None  # FusedClip and the table of the grad shards, built at the first clipped step
        self._shard_table: Any = None
        self._shard_table_ptrs: tuple[int, ...] = ()  # the grad shards the table points at
        self._shard_flat: torch.Tensor | None = None  # free_grads: every bucket's grad shard, one buffer a step
        if self.overlap_grad_reduce:
            self._check_not_hooked(all_params)
        if module is not None:
            self._check_owned(module, all_params)  # before the params move into the buckets
        self._buckets = self._build_buckets()
        for b in self._buckets:
            # Registered in self.state (keyed by the shard view) so that tools which sum the
            # tensors of optimizer.state see what this rank holds.
            self.state[b.param_shard] = {"step": b.step, "exp_avg": b.exp_avg, "exp_avg_sq": b.exp_avg_sq}

        # The overlap's round: reset by every step(); empty while overlap_grad_reduce is off.
        self._launch_order = list(reversed(range(len(self._buckets))))
        self._sync = True
        self._ready = [[False] * len(b.params) for b in self._buckets]
        self._ready_count = [0] * len(self._buckets)
        self._next_launch = 0  # position in _launch_order of the next bucket to launch
        self._reductions: dict[int, Any] = {}  # bucket index -> its reduce-scatter's work (None: world 1)
        self._retired: set[int] = set()  # free_grads: buckets whose reduction is done and released
        self._hook_handles: list[Any] = []
        if self.overlap_grad_reduce:
            self._register_hooks()
        self._gathers: dict[int, Any] = {}  # bucket index -> its all-gather's work, left by a prefetching step
        self._forward_handles: list[Any] = []
        self._attached = False
        if module is not None:
            self.attach(module)

    # -- construction ---------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not self._constructing:
            raise RuntimeError(
                "ShardedAdamW: add_param_group after construction is not supported (the buckets and "
                "shards are fixed when it is built); pass every param group to the constructor"
            )
        super().add_param_group(param_group)

    def _param_name(self, index: int) -> str:
        position = 0
        for group in self.param_groups:
            names = group.get("param_names")
            if index < position + len(group["params"]):
                return f"'{names[index - position]}'" if names else f"param {index}"
            position += len(group["params"])
        return f"param {index}"

    def _check_params(self, params: list[torch.Tensor]) -> None:
        if not params:
            raise ValueError("ShardedAdamW: got an empty parameter list")
        device = params[0].device
        for i, p in enumerate(params):
            if p.dtype != torch.float32:
                raise TypeError(
                    f"ShardedAdamW: {self._param_name(i)} is {p.dtype}; accepted: torch.float32 "
                    "(the update kernel keeps fp32 params and moments)"
                )
            if p.device != device:
                raise ValueError(
                    f"ShardedAdamW: {self._param_name(i)} is on {p.device} but the first param is on "
                    f"{device}; accepted: every param on one device"
                )
            if p.is_sparse or p.layout != torch.strided:
                raise TypeError(f"ShardedAdamW: {self._param_name(i)} is not a dense strided tensor")
            if p.grad is not None and p.grad.is_sparse:
                raise TypeError(f"ShardedAdamW: {self._param_name(i)} has a sparse grad; not supported")

    def _signature(self) -> list[tuple[Any, ...]]:
        """What every rank must agree on, one entry per parameter (and the settings)."""
        entries: list[tuple[Any, ...]] = [
            ("bucket_bytes", self.bucket_bytes),
            ("overlap_grad_reduce", self.overlap_grad_reduce),
            ("grad_comm_dtype", str(self.grad_comm_dtype)),
        ]
        index = 0
        for g, group in enumerate(self.param_groups):
            hyper = tuple((k, group[k]) for k in ("lr", "betas", "eps", "weight_decay", "maximize"))
            hyper += (("param_comm_dtype", str(group["param_comm_dtype"])),)
            entries.append((f"param group {g} hyperparameters", hyper))
            for p in group["params"]:
                entries.append((self._param_name(index), (f"group {g}", tuple(p.shape), str(p.dtype))))
                index += 1
        entries.append(("number of params", index))
        return entries

    def _check_ranks_agree(self, local_error: Exception | None) -> None:
        """One all_gather_object of every rank's signature (and of any error its own checks
        raised); every rank then raises the same error, naming the first disagreement."""
        mine = (self._signature(), None if local_error is None else str(local_error))
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.process_group)
        if local_error is not None:
            raise local_error
        for rank, (_, error) in enumerate(gathered):
            if error is not None:
                raise ValueError(f"ShardedAdamW: rank {rank} refused its parameters: {error}")
        reference = gathered[0][0]
        for rank, (theirs, _) in enumerate(gathered[1:], start=1):
            for position in range(max(len(reference), len(theirs))):
                ref_entry = reference[position] if position < len(reference) else ("(missing)", None)
                their_entry = theirs[position] if position < len(theirs) else ("(missing)", None)
                if ref_entry != their_entry:
                    raise ValueError(
                        "ShardedAdamW: ranks disagree on the parameter list; first mismatch at entry "
                        f"{position}: rank 0 has {ref_entry[0]} = {ref_entry[1]}, rank {rank} has "
                        f"{their_entry[0]} = {their_entry[1]}. Every rank must pass the same params "
                        "(names, shapes, order) and hyperparameters."
                    )

    def _choose_comm(self, comm: str) -> str:
        if self.world_size == 1:
            return "none"  # a single process: nothing to average
        if comm != "auto":
            return comm
        if dist.get_backend(self.process_group) == "nccl":
            return "reduce-scatter-avg"
        # Probe on a tiny tensor; every rank runs the same torch, so every rank takes the same path.
        probe_in = torch.ones(ALIGN * self.world_size, device=self.device)
        probe_out = torch.empty(ALIGN, device=self.device)
        for mode, op in (("reduce-scatter-avg", dist.ReduceOp.AVG), ("reduce-scatter-sum", dist.ReduceOp.SUM)):
            try:
                _reduce_scatter_single()(probe_out, probe_in, op=op, group=self.process_group)
                _all_gather_single()(probe_in, probe_out, group=self.process_group)
                return mode
            except (RuntimeError, NotImplementedError, ValueError):
                continue
        return "all-reduce"

    def _build_buckets(self) -> list[_Bucket]:
        """Each group's params, in order, in buckets of about equal size, none above bucket_bytes
        (a larger param alone excepted): with the fewest buckets that respect the cap, equal ones
        let each bucket's update hide under the next bucket's communication, where a greedy fill
        leaves one full bucket and a short last one (1 GiB + 0.48 GB for model-370m)."""
        cap = max(1, self.bucket_bytes // 4)
        buckets: list[_Bucket] = []
        index = 0
        for group_index, group in enumerate(self.param_groups):
            sizes = [_round_up(p.numel(), ALIGN) for p in group["params"]]
            target = -(-sum(sizes) // max(1, -(-sum(sizes) // cap)))
            pending: list[tuple[int, torch.Tensor]] = []
            pending_numel = 0
            for p, size in zip(group["params"], sizes):
                if pending and pending_numel + size > cap:
                    buckets.append(self._make_bucket(len(buckets), group_index, group, pending))
                    pending, pending_numel = [], 0
                pending.append((index, p))
                pending_numel += size
                index += 1
                if pending_numel >= target:
                    buckets.append(self._make_bucket(len(buckets), group_index, group, pending))
                    pending, pending_numel = [], 0
            if pending:
                buckets.append(self._make_bucket(len(buckets), group_index, group, pending))
        return buckets

    @torch.no_grad()
    def _make_bucket(self, index: int, group_index: int, group: dict[str, Any],
                     members: list[tuple[int, torch.Tensor]]) -> _Bucket:
        offsets, total = [], 0
        for _, p in members:
            offsets.append(total)
            total += _round_up(p.numel(), ALIGN)
        total = _round_up(total, ALIGN * self.world_size)
        shard = total // self.world_size
        param_flat = torch.zeros(total, dtype=torch.float32, device=self.device)
        # free_grads: no full grad bucket before a backward makes one (unless grads exist already).
        grad_flat = None
        if not self.free_grads or any(p.grad is not None for _, p in members):
            grad_flat = torch.zeros(total, dtype=torch.float32, device=self.device)
        param_ptrs, grad_views = [], []
        for (_, p), offset in zip(members, offsets):
            pv = param_flat[offset : offset + p.numel()].view(p.shape)
            pv.copy_(p)
            if grad_flat is not None:
                gv = grad_flat[offset : offset + p.numel()].view(p.shape)
                if p.grad is not None:
                    gv.copy_(p.grad)
                p.grad = gv
                grad_views.append(gv)
            p.data = pv  # the parameter now lives in the bucket; its old storage is released
            param_ptrs.append(pv.data_ptr())
        lo, hi = self.rank * shard, (self.rank + 1) * shard
        comm_flat = None
        if self._comm_cast and not self.free_grads:  # with free_grads made per step, like grad_flat
            comm_flat = torch.zeros(total, dtype=self.grad_comm_dtype, device=self.device)
        # With free_grads the reduce-scatter writes the owned shard into the step's shard buffer
        # (_allocate_shards), so grad_flat can go.
        grad_shard = None
        if not self.free_grads:
            assert grad_flat is not None
            grad_shard = grad_flat[lo:hi]
        return _Bucket(
            index=index,
            group_index=group_index,
            group=group,
            params=[p for _, p in members],
            param_indices=[i for i, _ in members],
            offsets=offsets,
            param_flat=param_flat,
            grad_flat=grad_flat,
            param_ptrs=param_ptrs,
            grad_views=grad_views,
            shard_numel=shard,
            param_shard=param_flat[lo:hi],
            grad_shard=grad_shard,
            exp_avg=torch.zeros(shard, dtype=torch.float32, device=self.device),
            exp_avg_sq=torch.zeros(shard, dtype=torch.float32, device=self.device),
            step=torch.zeros((), dtype=torch.float32, device=self.device),
            comm_flat=comm_flat,
            comm_shard=None if comm_flat is None else comm_flat[lo:hi],
            gather_dtype=None if group["param_comm_dtype"] in (None, torch.float32) else group["param_comm_dtype"],
        )

    # -- the step -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.prefetch_params and not self._attached:
            raise RuntimeError(
                "ShardedAdamW: prefetch_params=True needs the model, whose forward waits for the "
                "parameter all-gathers: call optimizer.attach(model) (or pass module=model) before step()"
            )
        self._run(collect=True, communicate=True, update=True)
        return loss

    @torch.no_grad()
    def communicate_only(self) -> None:
        """For measuring the communication / compute split: the step's reduce-scatters and
        all-gathers, in the step's order, without the update. Not an optimizer step."""
        self._run(collect=False, communicate=True, update=False)

    @torch.no_grad()
    def update_only(self) -> None:
        """For measuring the split: the update kernel on every shard, no communication. Not an
        optimizer step (it uses whatever the grad shards hold)."""
        self._run(collect=False, communicate=False, update=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient buckets in place, whatever ``set_to_none`` says: the grads are views
        into the buckets and stay so, which lets backward accumulate straight into them. Reductions
        launched by a backward whose step was skipped are waited for and dropped. With free_grads
        the buckets are released instead and every ``p.grad`` is None. It does not wait for
        prefetched all-gathers: it touches no parameter, and the next forward would wait behind them."""
        self._drop_round()
        if self.free_grads:
            self._release_shards()
        for b in self._buckets:
            if self.free_grads:
                self._release_grads(b)
                continue
            assert b.grad_flat is not None
            b.grad_flat.zero_()
            for p, gv in zip(b.params, b.grad_views):
                p.grad = gv

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside launch no reductions: their grads accumulate locally, and the first
        backward outside (or ``step()``) reduces the sum. Harmless without overlap_grad_reduce."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def remove_hooks(self) -> None:
        """Removes the overlap's grad hooks (the params may then be given to another optimizer);
        from here on every bucket is reduced by ``step()``."""
        self._drop_round()
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        for b in self._buckets:
            for p in b.params:
                if _HOOKED_PARAMS.get(p) is not None and _HOOKED_PARAMS[p]() is self:
                    del _HOOKED_PARAMS[p]
        self.overlap_grad_reduce = False

    # -- prefetch: the next forward waits for the parameter all-gathers ---------------------------
    def attach(self, module: torch.nn.Module) -> None:
        """Registers a forward pre-hook on every module of ``module`` that directly owns one of the
        optimizer's params (tied params: on each owner), which waits for those params' all-gathers
        (prefetch_params). Every param must belong to some module of ``module``. Calling it again
        replaces the hooks."""
        if not self.prefetch_params:
            raise ValueError("ShardedAdamW: attach() is for prefetch_params=True")
        self._check_owned(module, [p for b in self._buckets for p in b.params])
        bucket_of = {id(p): b.index for b in self._buckets for p in b.params}
        plan = []
        for m in module.modules():
            indices = sorted({bucket_of[id(p)] for p in m.parameters(recurse=False) if id(p) in bucket_of})
            if indices:
                plan.append((m, tuple(indices)))
        for handle in self._forward_handles:
            handle.remove()
        owner = weakref.ref(self)
        self._forward_handles = [
            m.register_forward_pre_hook(functools.partial(_params_needed_hook, owner, indices))
            for m, indices in plan
        ]
        self._attached = True

    def _check_owned(self, module: torch.nn.Module, params: list[torch.Tensor]) -> None:
        owned = {id(p) for p in module.parameters()}
        for i, p in enumerate(params):
            if id(p) not in owned:
                raise ValueError(
                    f"ShardedAdamW: {self._param_name(i)} is not a parameter of any module of the attached "
                    "model, so no forward would wait for its all-gather; attach the model that owns "
                    "every param given to the optimizer"
                )

    def wait_params(self) -> None:
        """Waits for every parameter all-gather a prefetching ``step()`` left in flight (with NCCL
        a stream wait); afterwards every parameter holds its updated value."""
        self._wait_gathers(sorted(self._gathers))

    def _wait_gathers(self, bucket_indices: Iterable[int]) -> None:
        for index in bucket_indices:
            work = self._gathers.pop(index, None)
            if work is not None:
                self._finish_gather(self._buckets[index], work)

    # -- overlap: hooks launch the reductions during the backward -------------------------------
    def _check_not_hooked(self, params: list[torch.Tensor]) -> None:
        for i, p in enumerate(params):
            owner = _HOOKED_PARAMS.get(p)
            if owner is not None and owner() is not None:
                raise ValueError(
                    f"ShardedAdamW: {self._param_name(i)} already carries the grad hooks of another "
                    "ShardedAdamW with overlap_grad_reduce=True; call remove_hooks() on that one first "
                    "(two sets of hooks would launch two reductions of the same gradient)"
                )

    def _register_hooks(self) -> None:
        owner = weakref.ref(self)  # the hooks must not keep a discarded optimizer alive
        for b in self._buckets:
            for position, p in enumerate(b.params):
                hook = functools.partial(_grad_ready_hook, owner, b.index, position)
                self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))
                _HOOKED_PARAMS[p] = owner

    @torch.no_grad()
    def _grad_ready(self, bucket_index: int, position: int, param: torch.Tensor) -> None:
        """Runs after the backward has accumulated ``param``'s grad (host bookkeeping, plus a copy
        when the grad is not the bucket's view)."""
        if not self._sync:
            return
        b = self._buckets[bucket_index]
        if bucket_index in self._reductions:
            raise RuntimeError(
                f"ShardedAdamW: a second backward reached {self._param_name(b.param_indices[position])}, "
                f"whose bucket {bucket_index} is already being reduced; call step() (or zero_grad()) "
                "between backwards, or run all but the last backward of an accumulation under "
                "`with optimizer.no_sync():`"
            )
        self._adopt_grad(b, position)
        if not self._ready[bucket_index][position]:
            self._ready[bucket_index][position] = True
            self._ready_count[bucket_index] += 1
        while self._next_launch < len(self._launch_order):
            ready = self._launch_order[self._next_launch]
            if self._ready_count[ready] < len(self._buckets[ready].params):
                break
            self._reductions[ready] = self._start_reduce_scatter(self._buckets[ready])
            self._next_launch += 1
        if self.free_grads:
            self._retire_reductions(keep=REDUCTIONS_IN_FLIGHT)

    def _retire_reductions(self, keep: int) -> None:
        """free_grads: all but the ``keep`` newest launched reductions are waited for (with NCCL
        a stream wait: the host goes on), turned into grad shards and their full buckets released."""
        launched = [i for i in self._launch_order[: self._next_launch] if i not in self._retired]
        for index in launched[: max(0, len(launched) - keep)]:
            self._finish_reduction(self._buckets[index], self._reductions[index])
            self._retired.add(index)

    def _adopt_grad(self, b: _Bucket, position: int) -> None:
        p = b.params[position]
        self._check_home(p, b.param_ptrs[position], b.param_indices[position])
        if b.grad_flat is None and self._take_as_bucket(b, p.grad):
            return
        self._allocate_grads(b)
        gv = b.grad_views[position]
        g = p.grad
        if g is gv:
            return
        if g is None:
            gv.zero_()
        elif g.data_ptr() != gv.data_ptr() or g.stride() != gv.stride():
            gv.copy_(g)
        p.grad = gv

    def _drop_round(self) -> None:
        """Waits for the reductions already launched and forgets them and the hooks' counts."""
        for index, work in self._reductions.items():
            if work is not None and index not in self._retired:
                self._wait(work, "reduce-scatter", self._buckets[index])
        self._reductions = {}
        self._retired = set()
        if any(self._ready_count):
            self._ready = [[False] * len(b.params) for b in self._buckets]
            self._ready_count = [0] * len(self._buckets)
        self._next_launch = 0

    # -- the step's parts -----------------------------------------------------------------------
    def _check_home(self, p: torch.Tensor, ptr: int, index: int) -> None:
        if p.data_ptr() != ptr:
            raise RuntimeError(
                f"ShardedAdamW: {self._param_name(index)} no longer lives in the optimizer's flat "
                "bucket (its .data was replaced, e.g. by .to(), .half() or a new tensor); build "
                "the optimizer after moving or converting the model"
            )

    def _take_as_bucket(self, b: _Bucket, g: torch.Tensor | None) -> bool:
        """A released bucket of one parameter takes autograd's grad as its buffer when that grad
        is exactly the bucket (fp32, this device, contiguous, its own storage of the padded size):
        the large embeddings and heads then cost no copy and no second full-size buffer."""
        total = b.param_flat.numel()
        if (len(b.params) != 1 or g is None or type(g) is not torch.Tensor or g.dtype != torch.float32
                or g.device != self.device or g.numel() != total or not g.is_contiguous()
                or g.storage_offset() != 0 or g.untyped_storage().nbytes() != total * 4):
            return False
        b.grad_flat = g.view(-1)
        b.grad_views = [g]
        return True

    def _allocate_grads(self, b: _Bucket) -> None:
        """Gives a bucket released by free_grads its full grad buffer again, zeroed (the padding
        must stay zero; params without a grad are zeroed anyway)."""
        if b.grad_flat is not None:
            return
        b.grad_flat = torch.zeros(b.param_flat.numel(), dtype=torch.float32, device=self.device)
        b.grad_views = [b.grad_flat[o : o + p.numel()].view(p.shape) for p, o in zip(b.params, b.offsets)]

    def _release_grads(self, b: _Bucket) -> None:
        """free_grads: drops every reference to the full grad bucket (and its bf16 copy), so the
        memory goes back to the allocator; the owned shard lives on in ``b.grad_shard`` until the
        step's updates are queued."""
        b.grad_flat, b.grad_views, b.comm_flat, b.comm_shard = None, [], None, None
        for p in b.params:
            p.grad = None

    def _collect_grads(self, b: _Bucket) -> None:
        """Makes bucket ``b``'s grad buffer hold the params' grads. Host-side pointer checks only
        (no device sync); a grad that is not the bucket's view (a new tensor, or None) is copied in
        (zeroed) with one foreach launch and the view put back in its place. Done bucket by bucket
        just before that bucket's reduce-scatter, so the checks of bucket b+1 overlap the
        communication of bucket b."""
        self._allocate_grads(b)
        copy_dst, copy_src, zero = [], [], []
        for p, ptr, gv, i in zip(b.params, b.param_ptrs, b.grad_views, b.param_indices):
            self._check_home(p, ptr, i)
            g = p.grad
            if g is gv:  # the common case: backward accumulated into the view
                continue
            if g is None:
                zero.append(gv)
            elif g.data_ptr() != gv.data_ptr() or g.stride() != gv.stride():
                copy_dst.append(gv)
                copy_src.append(g)
            p.grad = gv
        if copy_dst:
            torch._foreach_copy_(copy_dst, copy_src)
        if zero:
            torch._foreach_zero_(zero)

    def _run(self, *, collect: bool, communicate: bool, update: bool) -> None:
        from kernelbench.optim._triton_utils import on_device  # imports triton: loaded with the kernels

        with on_device(self.device):  # Triton launches on the current device, maybe not the params' GPU
            self._run_here(collect=collect, communicate=communicate, update=update)

    def _run_here(self, *, collect: bool, communicate: bool, update: bool) -> None:
        self.wait_params()
        clipping = update and self.max_grad_norm is not None
        if self.world_size == 1 or not communicate:
            self._drop_round()
            self._allocate_shards(zero=True)  # free_grads: no reduction filled them this step
            for b in self._buckets:
                if collect:
                    self._collect_grads(b)
                if update and not clipping:
                    self._update(b)
            if clipping:
                clip = self._clip_coefficient(reduce=communicate and self.world_size > 1)
                for b in self._buckets:
                    self._update(b, clip)
            if self.free_grads and update:
                self._release_shards()  # as after a whole step: nothing reads them until the next reduction
            return
        # With overlap the hooks have launched a prefix of _launch_order; the rest follows it.
        order = self._launch_order if self.overlap_grad_reduce else range(len(self._buckets))
        for index in order:
            if index in self._reductions:
                continue
            b = self._buckets[index]
            if collect:
                self._collect_grads(b)
            self._reductions[index] = self._start_reduce_scatter(b)
        reductions, retired = self._reductions, self._retired
        self._reductions = {}
        self._drop_round()
        gathers = []
        clip = None
        if clipping:
            for index in order:
                if index not in retired:
                    self._finish_reduction(self._buckets[index], reductions[index])
            clip = self._clip_coefficient(reduce=True)
        # Clipped, every reduction is already finished, so a prefetching step updates in the
        # forward's order with each gather right behind its own update: the first modules' gathers
        # start at once and the rest overlap the updates still queued.
        interleave = self.prefetch_params and clipping
        for index in range(len(self._buckets)) if interleave else order:
            b = self._buckets[index]
            if not clipping and index not in retired:
                self._finish_reduction(b, reductions[index])
            if update:
                self._update(b, clip)
            if interleave:
                self._gathers[index] = self._start_all_gather(b)
            elif not self.prefetch_params:  # each gather right behind its update, beside the next ones
                gathers.append((b, self._start_all_gather(b)))
        if self.free_grads and update:
            self._release_shards()  # read by the updates just queued: stream order keeps them valid
        if self.prefetch_params:
            if not interleave:  # after every update, in the forward's order: first modules first
                self._gathers = {b.index: self._start_all_gather(b) for b in self._buckets}
            return
        for b, work in gathers:
            self._finish_gather(b, work)

    def _allocate_shards(self, zero: bool = False) -> None:
        """free_grads: one buffer for every bucket's grad shard, made when a step first needs it
        (the reduce-scatters write all of it) and released after the step's updates."""
        if not self.free_grads or self._shard_flat is not None:
            return
        total = sum(b.shard_numel for b in self._buckets)
        make = torch.zeros if zero else torch.empty
        self._shard_flat = make(total, dtype=torch.float32, device=self.device)
        offset = 0
        for b in self._buckets:
            b.grad_shard = self._shard_flat[offset : offset + b.shard_numel]
            offset += b.shard_numel

    def _release_shards(self) -> None:
        self._shard_flat = None
        for b in self._buckets:
            b.grad_shard = None

    def _finish_reduction(self, b: _Bucket, work: Any) -> None:
        self._wait(work, "reduce-scatter", b)
        self._finish_reduce(b)
        if self.free_grads:
            self._release_grads(b)

    def _finish_reduce(self, b: _Bucket) -> None:
        """Turns the reduced shard into the averaged fp32 gradient in ``b.grad_shard``."""
        assert b.grad_shard is not None
        if self._comm_cast:
            assert b.comm_shard is not None
            # Rounded to bf16: each rank's grad (the cast before sending) and the sum over the ranks
            # (the collective stores bf16 after each addition: once for 2 ranks). Exact: the
            # upcast. In fp32: the 1/W scale, the moments and the update.
            b.grad_shard.copy_(b.comm_shard)
            b.grad_shard.mul_(1.0 / self.world_size)
        elif self.free_grads and self.comm == "all-reduce":
            assert b.grad_flat is not None  # the all-reduce left the sum in the full bucket
            lo = self.rank * b.shard_numel
            b.grad_shard.copy_(b.grad_flat[lo : lo + b.shard_numel])
            b.grad_shard.mul_(1.0 / self.world_size)
        elif self.comm != "reduce-scatter-avg":
            b.grad_shard.mul_(1.0 / self.world_size)

    def _clip_coefficient(self, reduce: bool) -> torch.Tensor:
        """The clip coefficient of this step from every reduced grad shard (device tensors only)."""
        from kernelbench.optim.adamw import BLOCK
        from kernelbench.optim.grad_norm import FlatTable, FusedClip

        if self._clip is None:
            self._clip = FusedClip(self.max_grad_norm, self.device)
        shards = [b.grad_shard for b in self._buckets]
        assert all(t is not None for t in shards)
        ptrs = tuple(t.data_ptr() for t in shards)
        if ptrs != self._shard_table_ptrs:  # free_grads' shard buffer may land elsewhere each step
            self._shard_table = FlatTable(shards, BLOCK)
            self._shard_table_ptrs = ptrs
        coef = self._clip.coefficient([self._shard_table.source],
                                      process_group=self.process_group if reduce else None)
        self.last_grad_norm = self._clip.norm
        return coef

    def _update(self, b: _Bucket, clip: torch.Tensor | None = None) -> None:
        assert b.grad_shard is not None
        group = b.group
        beta1, beta2 = group["betas"]
        self._adamw_step_flat(
            b.param_shard, b.grad_shard, b.exp_avg, b.exp_avg_sq, b.step,
            lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
            weight_decay=group["weight_decay"], maximize=group["maximize"], clip_coef=clip,
        )

    def _comm_error(self, what: str, b: _Bucket, error: Exception) -> RuntimeError:
        return RuntimeError(
            f"ShardedAdamW (rank {self.rank} of {self.world_size}): {what} of bucket {b.index} failed. "
            "Another rank probably died, stopped stepping, or hit the process group's timeout "
            f"(init_process_group(timeout=...)). Underlying error: {error}"
        )

    def _start_reduce_scatter(self, b: _Bucket) -> Any:
        if self.world_size == 1:
            return None  # a single process: the grads are already the average
        self._allocate_grads(b)
        self._allocate_shards()
        assert b.grad_flat is not None
        assert b.grad_shard is not None
        flat, shard, op = b.grad_flat, b.grad_shard, dist.ReduceOp.SUM
        if self._comm_cast:
            if b.comm_flat is None:  # free_grads released it with the grad bucket
                b.comm_flat = torch.empty_like(b.grad_flat, dtype=self.grad_comm_dtype)
                lo = self.rank * b.shard_numel
                b.comm_shard = b.comm_flat[lo : lo + b.shard_numel]
            assert b.comm_shard is not None
            b.comm_flat.copy_(b.grad_flat)
            flat, shard = b.comm_flat, b.comm_shard
        elif self.comm == "reduce-scatter-avg":
            op = dist.ReduceOp.AVG
        try:
            if self.comm == "all-reduce":
                return dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
            # In place: the output is this rank's slice of the input, which NCCL and Gloo allow.
            return _reduce_scatter_single()(shard, flat, op=op, group=self.process_group, async_op=True)
        except RuntimeError as error:
            raise self._comm_error("reduce-scatter", b, error) from error

    def _start_all_gather(self, b: _Bucket, exact: bool = False) -> Any:
        """Starts bucket ``b``'s parameter all-gather (``exact``: in fp32 whatever the group says);
        ``_finish_gather`` completes it."""
        flat, shard = b.param_flat, b.param_shard
        if b.gather_dtype is not None and not exact:
            b.gather_flat = torch.empty(flat.numel(), dtype=b.gather_dtype, device=flat.device)
            lo = self.rank * b.shard_numel
            shard = b.gather_flat[lo : lo + b.shard_numel]
            shard.copy_(b.param_shard)
            flat = b.gather_flat
        try:
            if self.comm == "all-reduce":
                # List all-gather: the input must not alias the outputs, hence the copy.
                chunks = list(flat.chunk(self.world_size))
                return dist.all_gather(chunks, shard.clone(), group=self.gather_group, async_op=True)
            return _all_gather_single()(flat, shard, group=self.gather_group, async_op=True)
        except RuntimeError as error:
            raise self._comm_error("all-gather", b, error) from error

    def _finish_gather(self, b: _Bucket, work: Any) -> None:
        """Waits for bucket ``b``'s all-gather; a bf16 one is upcast into every shard but this rank's,
        which keeps its exact fp32 value."""
        self._wait(work, "all-gather", b)
        if b.gather_flat is None:
            return
        lo, hi = self.rank * b.shard_numel, (self.rank + 1) * b.shard_numel
        b.param_flat[:lo].copy_(b.gather_flat[:lo])
        b.param_flat[hi:].copy_(b.gather_flat[hi:])
        b.gather_flat = None

    @torch.no_grad()
    def gather_params_fp32(self) -> None:
        """Collective. Gives every replica the owners' exact fp32 parameters, also in the groups whose
        all-gathers run in bf16 (``param_comm_dtype``): call it before saving the model's state dict or
        running it outside autocast. Without such groups the replicas are exact already."""
        self.wait_params()
        if self.world_size == 1 or all(b.gather_dtype is None for b in self._buckets):
            return
        gathers = [(b, self._start_all_gather(b, exact=True)) for b in self._buckets if b.gather_dtype is not None]
        for b, work in gathers:
            self._finish_gather(b, work)

    def _wait(self, work: Any, what: str, b: _Bucket) -> None:
        try:
            work.wait()
        except RuntimeError as error:
            raise self._comm_error(what, b, error) from error

    # -- state ----------------------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (moments and step counters)."""
        return sum(
            t.numel() * t.element_size() for b in self._buckets for t in (b.exp_avg, b.exp_avg_sq, b.step)
        )

    def _layout(self) -> list[tuple[int, list[int], list[int], int]]:
        return [
            (b.group_index, b.param_indices, b.offsets, b.param_flat.numel())
            for b in self._buckets
        ]

    def _groups_for_dict(self, torch_extras: bool) -> list[dict[str, Any]]:
        groups, index = [], 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            if torch_extras:  # torch.optim.AdamW's keys only: param_comm_dtype is ShardedAdamW's
                saved.pop("param_comm_dtype")
                saved.update(TORCH_ADAMW_GROUP_EXTRAS)
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        return groups

    def state_dict(self) -> dict[str, Any]:
        """This rank's shards. Loadable only by a ShardedAdamW with the same world size, rank and
        bucket layout; use ``consolidated_state_dict`` for a portable checkpoint."""
        self.wait_params()
        return {
            "format": PER_RANK_FORMAT,
            "state": {
                b.index: {"step": b.step, "exp_avg": b.exp_avg, "exp_avg_sq": b.exp_avg_sq} for b in self._buckets
            },
            "param_groups": self._groups_for_dict(torch_extras=False),
            "sharding": {"rank": self.rank, "world_size": self.world_size, "layout": self._layout()},
        }

    @torch.no_grad()
    def consolidated_state_dict(self, to_rank: int = 0) -> dict[str, Any] | None:
        """Collective. Returns, on ``to_rank``, a torch.optim.AdamW state dict (per-param ``step``,
        ``exp_avg``, ``exp_avg_sq`` with the params' shapes, on the CPU) and None elsewhere. Peak
        extra device memory: two buckets."""
        if not 0 <= to_rank < self.world_size:
            raise ValueError(f"ShardedAdamW: to_rank {to_rank} is not a rank of a group of {self.world_size}")
        self.wait_params()
        state: dict[int, dict[str, torch.Tensor]] = {}
        for b in self._buckets:
            full = {name: self._gather_full(b, getattr(b, name)) for name in ("exp_avg", "exp_avg_sq")}
            if self.rank != to_rank:
                continue
            step = b.step.detach().to("cpu", torch.float32)
            for i, p, offset in zip(b.param_indices, b.params, b.offsets):
                entry = {"step": step.clone()}
                for name, flat in full.items():
                    entry[name] = flat[offset : offset + p.numel()].view(p.shape).to("cpu", copy=True)
                state[i] = entry
        if self.rank != to_rank:
            return None
        return {"state": state, "param_groups": self._groups_for_dict(torch_extras=True)}

    def _gather_full(self, b: _Bucket, shard: torch.Tensor) -> torch.Tensor:
        full = torch.empty(b.param_flat.numel(), dtype=shard.dtype, device=shard.device)
        if self.world_size == 1:
            return full.copy_(shard)
        try:
            if self.comm == "all-reduce":
                dist.all_gather(list(full.chunk(self.world_size)), shard, group=self.process_group)
            else:
                _all_gather_single()(full, shard, group=self.process_group)
        except RuntimeError as error:
            raise self._comm_error("state all-gather", b, error) from error
        return full

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads this rank's own ``state_dict()`` (same world size, rank and layout), or a
        torch.optim.AdamW-format dict (from ``consolidated_state_dict`` or from torch.optim.AdamW
        itself; every rank passes the full dict, any world size)."""
        self.wait_params()
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or "state" not in state_dict:
            raise ValueError("ShardedAdamW: a state dict needs 'state' and 'param_groups' keys")
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"ShardedAdamW: the state dict has {len(groups)} param groups, this optimizer {len(self.param_groups)}"
            )
        for g, (saved, group) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"ShardedAdamW: param group {g} has {len(saved['params'])} params in the state dict, "
                    f"{len(group['params'])} here"
                )
            if saved.get("amsgrad", False):
                raise ValueError("ShardedAdamW: the state dict uses amsgrad=True, which ShardedAdamW does not "
                                 "implement")
        if state_dict.get("format") == PER_RANK_FORMAT:
            self._load_per_rank(state_dict)
        else:
            self._load_consolidated(state_dict)
        for saved, group in zip(groups, self.param_groups):
            for key in ("lr", "betas", "eps", "weight_decay", "maximize"):
                if key in saved:
                    group[key] = tuple(saved[key]) if key == "betas" else saved[key]

    def _load_per_rank(self, state_dict: dict[str, Any]) -> None:
        sharding = state_dict["sharding"]
        mine = {"rank": self.rank, "world_size": self.world_size, "layout": self._layout()}
        for key in ("world_size", "rank", "layout"):
            if _plain(sharding[key]) != _plain(mine[key]):
                raise ValueError(
                    f"ShardedAdamW: this per-rank state dict was saved with a different {key} "
                    f"({_plain(sharding[key]) if key != 'layout' else 'bucket layout'}); per-rank dicts load "
                    "only into the same world size, rank and bucket_bytes. Load a consolidated_state_dict() "
                    "instead to change any of them."
                )
        for b in self._buckets:
            saved = state_dict["state"][b.index]
            for name in ("step", "exp_avg", "exp_avg_sq"):
                getattr(b, name).copy_(saved[name])

    def _load_consolidated(self, state_dict: dict[str, Any]) -> None:
        # torch numbers params across groups in order; read the ids from the groups regardless.
        saved_ids = [pid for saved in state_dict["param_groups"] for pid in saved["params"]]
        saved_state = {i: state_dict["state"][pid] for i, pid in enumerate(saved_ids) if pid in state_dict["state"]}
        for b in self._buckets:
            steps = set()
            present = [i for i in b.param_indices if i in saved_state]
            if present and len(present) != len(b.param_indices):
                missing = next(i for i in b.param_indices if i not in saved_state)
                raise ValueError(
                    f"ShardedAdamW: the state dict has state for some params of bucket {b.index} but not "
                    f"for {self._param_name(missing)}; params that share a bucket must share a step count"
                )
            full = {name: torch.zeros_like(b.param_flat) for name in ("exp_avg", "exp_avg_sq")}
            for i, p, offset in zip(b.param_indices, b.params, b.offsets):
                if i not in saved_state:
                    continue
                entry = saved_state[i]
                for name, flat in full.items():
                    value = entry[name]
                    if tuple(value.shape) != tuple(p.shape):
                        raise ValueError(
                            f"ShardedAdamW: {name} of {self._param_name(i)} has shape {tuple(value.shape)} "
                            f"in the state dict, the param has {tuple(p.shape)}"
                        )
                    flat[offset : offset + p.numel()].copy_(value.reshape(-1))
                steps.add(float(entry["step"]))
            if len(steps) > 1:
                raise ValueError(
                    f"ShardedAdamW: params of bucket {b.index} have different step counts {sorted(steps)} "
                    "in the state dict; a bucket steps all its params together"
                )
            lo = self.rank * b.shard_numel
            b.exp_avg.copy_(full["exp_avg"][lo : lo + b.shard_numel])
            b.exp_avg_sq.copy_(full["exp_avg_sq"][lo : lo + b.shard_numel])
            b.step.fill_(steps.pop() if steps else 0.0)


def _plain(value: Any) -> Any:
    """Tuples and lists compare equal after a save / load round trip."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

