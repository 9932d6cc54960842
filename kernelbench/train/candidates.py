"""What ``kernelbench train OP`` trains: an op's candidates as training runs.

Optimizer ops (adamw, adam-mini, adafactor, muon): every candidate the op registers, built by its
own factory from the model's named parameters and the op's hyperparameters, so a new optimizer
candidate is trained without a change here. Model-shape hyperparameters that the op's workloads
declare (Adam-mini's ``dim``, ``n_heads``, ``n_kv_heads``) come from the model's configuration.
Candidates marked ``parity=False`` compute another algorithm (AdamW beside Adam-mini): they are
trained as anchors and not judged.

Layer ops (those declaring the model slot they fill, ``model_layer``: rmsnorm, rotary, swiglu,
cross-entropy): the model built with each layer set (``torch``, the reference; ``kernelbench``,
our Triton kernels; ``liger`` where installed), all trained by torch's AdamW. A layer set swaps
every layer at once, so these ops train the same runs.
The op's own candidates train too, each as the one layer it implements in torch's layer set: a
plugin's (source not kernelbench) by default, any of them when named with ``-c``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import torch

from ..models import LAYER_SLOTS, LlamaConfig, layer_set_doc
from ..ops import get_op, load_all
from ..ops.base import Op, Requires, UsageError, unknown_name_error
from .loop import ROLE_ANCHOR, ROLE_CANDIDATE, ROLE_REFERENCE, TrainCandidate

LAYER_OPTIMIZER = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}


def layer_ops() -> dict[str, Op]:
    """The registered ops that are a layer of the model, by name."""
    return {op.name: op for op in load_all().values() if op.model_layer in LAYER_SLOTS}


def _model_shape(config: LlamaConfig) -> dict[str, int]:
    return {"dim": config.hidden, "n_heads": config.n_heads, "n_kv_heads": config.n_kv_heads}


def _declared_shape_keys(op) -> set[str]:
    keys: set[str] = set()
    for workload in op.workloads.values():
        keys |= set(workload.spec.get("hyperparams", {}))
    for cand in op.candidates.values():
        params = inspect.signature(cand.build).parameters
        keys |= {k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return keys


def _torch_adamw(named_params, **hp):
    fused = all(p.device.type == "cuda" for _, p in named_params)
    return torch.optim.AdamW([p for _, p in named_params], fused=fused or None, **hp)


# How the model's call of each slot (kernelbench.models.llama.LAYER_SLOTS) maps onto the call of
# the layer op that fills it (its ``model_layer``): its candidates take the op's inputs as keyword arguments.
def _norm(fn):
    return lambda x, weight, eps: fn(x=x, weight=weight, eps=eps)


def _rotary(fn):
    return lambda q, k, cos, sin: tuple(fn(q=q, k=k, cos=cos.to(q.dtype), sin=sin.to(q.dtype)))


def _silu_mul(fn):
    return lambda gate, up: fn(gate=gate, up=up)


def _loss(fn):
    return lambda logits, targets: fn(logits=logits.reshape(-1, logits.shape[-1]), targets=targets.reshape(-1),
                                      ignore_index=-100, reduction="mean")


SLOT_ADAPTERS = {"norm": _norm, "rotary": _rotary, "silu_mul": _silu_mul, "loss": _loss}


def _op_candidate(op: Op, cand, hp: dict) -> TrainCandidate:
    slot, adapt = op.model_layer, SLOT_ADAPTERS[op.model_layer]
    return TrainCandidate(cand.name, _torch_adamw, hp, layers="torch", requires=cand.requires, role=ROLE_CANDIDATE,
                          doc=f"torch's layers with {op.name} by this candidate: {cand.doc}",
                          layer_fns={slot: lambda: adapt(cand.build())}, source=cand.source)


def _layer_candidates(op_name: str, lr: float | None) -> list[TrainCandidate]:
    hp = {**LAYER_OPTIMIZER, **({"lr": lr} if lr is not None else {})}
    return [
        TrainCandidate("torch", _torch_adamw, hp, layers="torch", role=ROLE_REFERENCE, doc=layer_set_doc("torch")),
        TrainCandidate("kernelbench", _torch_adamw, hp, layers="kernelbench", impl="triton",
                       requires=Requires(triton=True), doc=f"{layer_set_doc('kernelbench')}, for {op_name}"),
        TrainCandidate("liger", _torch_adamw, hp, layers="liger",
                       requires=Requires(cuda=True, triton=True, packages=("liger_kernel",)),
                       doc=layer_set_doc("liger")),
    ]


def resolve(op_name: str, config: LlamaConfig, *, lr: float | None = None, names: Sequence[str] | None = None,
            tags: Mapping[str, str] | None = None) -> list[TrainCandidate]:
    """The reference first, then the candidates to train (``names`` or ``tags`` select, as in
    ``run``); the reference is always included, since its seeds make the band."""
    op = get_op(op_name)
    if op.name in layer_ops():
        every = _layer_candidates(op.name, lr)
        if tags:
            raise UsageError(f"op '{op.name}' has no option --{next(iter(tags))} under train")
        hp = dict(every[0].hyperparams)
        sets = {c.name for c in every}
        own = {c.name: c for c in op.candidates.values() if c.parity and c.name not in sets}
        if names:
            known = sets | set(own)
            for n in names:
                if n not in known:
                    raise unknown_name_error(f"train candidate of op '{op.name}'", n, known)
            every = [c for c in every if c.role == ROLE_REFERENCE or c.name in names]
            every += [_op_candidate(op, own[n], hp) for n in names if n in own]
        else:
            every += [_op_candidate(op, c, hp) for c in own.values() if c.source != "kernelbench"]
        return every
    if op.kind != "optimizer":
        raise UsageError(f"train: op '{op.name}' is neither an optimizer op nor a model layer; "
                         f"train accepts optimizer ops and {', '.join(layer_ops())}")
    if not isinstance(op.reference, str):
        raise UsageError(f"train: op '{op.name}' has no reference candidate to make the band")
    shape = _model_shape(config)
    hp = dict(op.hyperparams)
    hp.update({k: v for k, v in shape.items() if k in _declared_shape_keys(op)})
    if lr is not None:
        hp["lr"] = lr
    chosen = op.select(names, tags)
    ref = op.get_candidate(op.reference)
    ordered = [ref] + [c for c in chosen if c.name != ref.name]
    out = []
    for cand in ordered:
        role = ROLE_REFERENCE if cand is ref else ROLE_CANDIDATE if cand.parity else ROLE_ANCHOR
        out.append(TrainCandidate(cand.name, cand.build, dict(hp), requires=cand.requires, role=role,
                                  doc=cand.doc, source=cand.source))
    return out
