"""Rotary position embeddings, Hugging Face ``rotate_half`` style, applied to q and k.

q (B, Hq, S, D), k (B, Hk, S, D), cos / sin (S, D). Bytes model (element size s): forward reads
and writes q and k, 2s per element; forward+backward doubles that (cos / sin are negligible).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Requires, Tolerance, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """HF ``apply_rotary_pos_emb`` for (B, H, S, D) q and k and (S, D) cos / sin."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_tables(seq_len: int, dim: int, device: str, dtype: torch.dtype, base: float = 10000.0):
    import torch

    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    b, hq, hk, s, d = (workload.spec[k] for k in ("batch", "q_heads", "kv_heads", "seq", "head_dim"))
    import torch

    dtype = torch_dtype(workload.spec["dtype"])
    q = torch.randn((b, hq, s, d), generator=gen, device=device, dtype=torch.float32).to(dtype)
    k = torch.randn((b, hk, s, d), generator=gen, device=device, dtype=torch.float32).to(dtype)
    cos, sin = rotary_tables(s, d, device, dtype)
    return {"q": q, "k": k, "cos": cos, "sin": sin}


def _bytes(workload: Workload, mode: str) -> int:
    spec = workload.spec
    numel = spec["batch"] * (spec["q_heads"] + spec["kv_heads"]) * spec["seq"] * spec["head_dim"]
    import torch

    size = torch.empty((), dtype=torch_dtype(spec["dtype"])).element_size()
    return numel * size * (2 if mode == "fwd" else 4)


def _workload(name, tier, b, hq, hk, s, d, dtype, seed=0, host_timing=False) -> Workload:
    spec = {"batch": b, "q_heads": hq, "kv_heads": hk, "seq": s, "head_dim": d, "dtype": dtype}
    if host_timing:  # the harness adds the per-call host time beside the device time
        spec["host_timing"] = True
    return Workload(name, tier, spec, seed=seed)


rotary = FunctionOp(
    "rotary",
    doc="Rotary embeddings (HF rotate_half) on q and k, forward and backward",
    model_layer="rotary",
    workloads=[
        _workload("2x4x2x16x32-fp32", "cpu", 2, 4, 2, 16, 32, "fp32", seed=1),
        _workload("1x3x1x7x16-bf16", "cpu", 1, 3, 1, 7, 16, "bf16", seed=2),
        _workload("8x32x8x2048x128-bf16", "gpu", 8, 32, 8, 2048, 128, "bf16"),
        # One decode step of a batch of 8 (a Llama-8B-like head layout): host-bound.
        _workload("host-decode-8x32x8x1x128-bf16", "gpu", 8, 32, 8, 1, 128, "bf16", host_timing=True),
    ],
    speed_anchor="torch-compile",
    make_inputs=_inputs,
    reference=rotary_ref,
    outputs=("q_out", "k_out"),
    grad_inputs=("q", "k"),
    modes=("fwd", "fwd+bwd"),
    bytes_moved=_bytes,
    dims=Dims(("B", "Hq", "Hk", "S", "D"), "batch, query heads, key heads, sequence length, head dimension",
              example="8x32x8x2048x128:bf16", small="2x4x2x16x32:fp32",
              to_spec=lambda shape, dtype: {**dict(zip(("batch", "q_heads", "kv_heads", "seq", "head_dim"), shape)),
                                            "dtype": dtype}),
)


# Eager bf16 rounds q*cos, rotate_half(q)*sin and their sum separately: three bf16 roundings of
# values up to ~4 (see the rotary parity rows of the norm record in results/).
_EAGER_BF16 = {"bf16": Tolerance(4e-2, 1e-2, reason="eager bf16: three roundings per element")}


@rotary.candidate("torch-eager", baseline=True, tolerance=_EAGER_BF16)
def torch_eager():
    """HF apply_rotary_pos_emb in eager PyTorch."""
    return rotary_ref


@rotary.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch.compile of the eager rotary."""
    return compile_anchor(rotary_ref)


@rotary.candidate("triton", requires=Requires(triton=True))
def triton_rotary():
    """kernelbench.nn.apply_rotary: q and k in one Triton launch."""
    from kernelbench.nn.rotary import apply_rotary

    return lambda q, k, cos, sin: apply_rotary(q, k, cos, sin, impl="triton")


@rotary.candidate("auto", requires=Requires(cuda=True))
def auto_rotary():
    """kernelbench.nn.apply_rotary as users get it (impl="auto"): Triton or the eager rotary,
    whichever this GPU ran faster for the shape, dtype and mode (see ``kernelbench autoselect``)."""
    from kernelbench.nn.rotary import apply_rotary

    return lambda q, k, cos, sin: apply_rotary(q, k, cos, sin)


@rotary.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True)
def liger():
    """liger-kernel's LigerRopeFunction (it copies q and k into (B, S, H, D) first)."""
    from liger_kernel.ops.rope import LigerRopeFunction

    def run(q, k, cos, sin):
        # liger takes (1, S, D) tables; some versions also return cos and sin.
        out = LigerRopeFunction.apply(q, k, cos.unsqueeze(0), sin.unsqueeze(0))
        return out[0], out[1]

    return run
