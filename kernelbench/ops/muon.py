"""Muon optimizer step: momentum, Newton-Schulz on 2-D weights, AdamW on the rest.

Parameters are split by ``kernelbench.optim.muon.muon_param_groups``: 2-D weights to Muon,
embeddings / output head (names containing "embed" or "head") and non-2-D parameters to AdamW.
Bytes model: Muon reads p, g, momentum and writes p, momentum (fp32: 20 B per parameter, plus
the Newton-Schulz GEMMs, which dominate and are FLOP-bound); AdamW parameters move 28 B. The
per-parameter figure below counts the elementwise traffic only (20 B), so GB/s is a lower bound.
"""

from __future__ import annotations

from .base import Requires, Tolerance, Workload
from .optim_workloads import LLAMA_468M
from .optimizer_op import OptimizerOp

SMALL = Workload(
    "small", "cpu",
    {"shapes": [("embed", (96, 32)), ("layer0.w", (48, 32)), ("layer0.norm", (32,)),
                ("layer1.w", (32, 80)), ("layer1.v", (48, 32)), ("layer2.w", (24, 40)), ("head", (96, 32))]},
    seed=4,
)

muon = OptimizerOp(
    "muon",
    doc="Muon step (Newton-Schulz on 2-D weights, AdamW on embeddings, head and vectors)",
    workloads=[SMALL, LLAMA_468M],
    reference="torch-reference",
    speed_anchor="torch-reference",
    hyperparams={"lr": 0.02, "momentum": 0.95, "nesterov": True, "weight_decay": 0.01, "ns_steps": 5,
                 "adamw_lr": 3e-4, "adamw_betas": (0.9, 0.95), "adamw_eps": 1e-8, "adamw_weight_decay": 0.01},
    bytes_per_param=lambda candidate: 20,
    # Both iterate in bf16 but round differently (the kernels keep fp32 epilogues), so each
    # update differs by bf16 noise (~1e-2 relative); after 20 steps on `small` in the
    # interpreter the 2-D parameters differ by 1.1-1.4e-2 (relative Frobenius), max 4e-3 abs.
    tolerances={"fp32": Tolerance(1e-2, 1e-2, fro=2.5e-2,
                                         reason="Newton-Schulz runs in bf16: parameters differ by lr x bf16 noise")},
)


def _split(named_params):
    from kernelbench.optim.muon import muon_param_groups

    return muon_param_groups(named_params)


@muon.candidate("torch-reference", baseline=True)
def torch_reference(named_params, **hp):
    """Plain PyTorch, a parameter at a time: torch bf16 Newton-Schulz, torch AdamW(foreach=False)."""
    from kernelbench.optim.muon import MuonReference

    hp = {k: v for k, v in hp.items() if k not in ("dim", "n_heads", "n_kv_heads")}
    return MuonReference(_split(named_params), **hp)


def _muon(named_params, hp, **options):
    from kernelbench.optim.muon import Muon

    hp = {k: v for k, v in hp.items() if k not in ("dim", "n_heads", "n_kv_heads")}
    return Muon(_split(named_params), **hp, **options)


@muon.candidate("triton", requires=Requires(triton=True))
def triton_muon(named_params, **hp):
    """Same-shape weights batched through kernelbench's Newton-Schulz kernels; TritonAdamW."""
    return _muon(named_params, hp)


@muon.candidate("triton-graphs", requires=Requires(triton=True, cuda=True))
def triton_muon_graphs(named_params, **hp):
    """``triton`` with ns_graph=True: CUDA graphs of the small Newton-Schulz calls, 8 B per Muon
    parameter kept between steps for fewer launches."""
    return _muon(named_params, hp, ns_graph=True)
