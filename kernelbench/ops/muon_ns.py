"""Muon's Newton-Schulz orthogonalisation: 5 quintic iterations in bf16.

X = G / (||G||_F + 1e-7), transposed when rows > cols; each iteration A = X X^T,
B = b A + c A A, X = a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315).
FLOP model for m <= n per iteration: the FLOP that must be done, 3 m^2 n + m^3. X X^T and A A
are symmetric, so only their upper triangle is needed (m^2 n and m^3 instead of 2 m^2 n and
2 m^3); B X is 2 m^2 n. The TFLOP/s column is therefore the useful rate: a
candidate that computes the redundant lower half (torch eager and compile, whose cuBLAS GEMMs do
the full 4 m^2 n + 2 m^3) shows a lower rate than the GPU ran at, and the symmetric kernels can
no longer appear to beat the matmul ceiling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Requires, Tolerance, Workload, torch_dtype
from .function_op import FunctionOp, compile_anchor
from .shapes import Dims

if TYPE_CHECKING:
    import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz_ref(G: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> torch.Tensor:
    """The iteration in G's own dtype (bf16 for the anchor, fp32 / fp64 for the reference)."""
    a, b, c = NS_COEFFICIENTS
    X = G
    transposed = G.size(-2) > G.size(-1)
    if transposed:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.mT if transposed else X


def _inputs(workload: Workload, device: str, gen: torch.Generator) -> dict:
    import torch

    G = torch.randn(workload.spec["shape"], generator=gen, device=device, dtype=torch.float32)
    return {"G": G.to(torch_dtype(workload.spec["dtype"]))}


def _flops(workload: Workload, mode: str) -> int:
    *batch, rows, cols = workload.spec["shape"]
    m, n = min(rows, cols), max(rows, cols)
    count = 1
    for b in batch:
        count *= b
    return count * NS_STEPS * (3 * m * m * n + m**3)


def _bytes(workload: Workload, mode: str) -> int:
    numel = 1
    for s in workload.spec["shape"]:
        numel *= s
    import torch

    return 2 * numel * torch.empty((), dtype=torch_dtype(workload.spec["dtype"])).element_size()


def _workload(name, tier, shape, dtype, seed=0) -> Workload:
    return Workload(name, tier, {"shape": shape, "dtype": dtype}, seed=seed)


muon_ns = FunctionOp(
    "muon-ns",
    doc="Newton-Schulz orthogonalisation (Muon), 5 quintic iterations",
    workloads=[
        _workload("64x64-fp32", "cpu", (64, 64), "fp32", seed=1),
        _workload("96x40-fp32", "cpu", (96, 40), "fp32", seed=2),
        _workload("3x32x48-fp32", "cpu", (3, 32, 48), "fp32", seed=3),
        *[_workload(f"{n}-bf16", "gpu", (n, n), "bf16") for n in (1024, 2048, 4096, 8192)],
        _workload("4096x1024-bf16", "gpu", (4096, 1024), "bf16"),
        _workload("2048x512-bf16", "gpu", (2048, 512), "bf16"),
    ],
    speed_anchor="torch-eager",
    make_inputs=_inputs,
    reference=newton_schulz_ref,
    outputs=("X",),
    modes=("fwd",),
    flops=_flops,
    bytes_moved=_bytes,
    dims=Dims(("R", "C"), "an R x C matrix (a gradient) orthogonalised", example="4096x1024:bf16",
              small="64x64:fp32"),
    # Element-wise error is meaningless for an iteration that amplifies rounding: the relative
    # Frobenius error is what is bounded (2e-2 in bf16).
    tolerances={
        "fp32": Tolerance(1e-3, 1e-3, fro=1e-4, reason="relative Frobenius error"),
        "fp16": Tolerance(5e-2, 5e-2, fro=2e-2, reason="relative Frobenius error"),
        "bf16": Tolerance(5e-2, 5e-2, fro=2e-2, reason="relative Frobenius error"),
    },
)


# torch's own bf16 iteration misses the op's 2e-2 bound at some GPU shapes (see the parity rows
# of the CI suite record in results/): the baselines get a looser bf16 bound so the anchors run
# in CI, while kernelbench's candidates keep 2e-2.
_TORCH_BF16 = {
    "bf16": Tolerance(0.05, 0.05, fro=3.5e-2,
                              reason="torch's own bf16 iteration: up to 3e-2 from fp32 on GPU shapes"),
}


@muon_ns.candidate("torch-eager", baseline=True, tolerance=_TORCH_BF16)
def torch_eager():
    """The iteration in eager PyTorch at the input's dtype (cuBLAS on the GPU)."""
    return newton_schulz_ref


@muon_ns.candidate("torch-compile", baseline=True, tolerance=_TORCH_BF16)
def torch_compile():
    """torch.compile of the eager iteration."""
    return compile_anchor(newton_schulz_ref)


# kernelbench's Triton paths iterate in bf16 whatever the input dtype (as Muon does), so on the
# fp32 CPU workloads they are held to the bf16 bound, not to fp32's.
_BF16_ITERATION = {
    "fp32": Tolerance(
        5e-2, 5e-2, fro=3e-2,
        reason="iterates in bf16 (fp32 accumulation) on fp32 input; at 64x64 bf16 rounding alone "
        "gives 2.2e-2 against fp64 (torch's own bf16 iteration: 3.0e-2)",
    ),
}


def _triton_ns(path: str):
    from kernelbench.newton_schulz import newton_schulz

    def run(G):
        return newton_schulz(G, NS_STEPS, path=path, check_finite=False)

    return run


@muon_ns.candidate("triton-classic", requires=Requires(triton=True), tolerance=_BF16_ITERATION)
def triton_classic():
    """Symmetric upper-tile Gram GEMMs with fused epilogues, pointer loads (any GPU)."""
    return _triton_ns("classic")


@muon_ns.candidate("triton-hopper", requires=Requires(cuda=True, min_capability=(9, 0), triton=True),
                   tolerance=_BF16_ITERATION)
def triton_hopper():
    """The same kernels with TMA descriptors and persistent tiles (sm_90)."""
    return _triton_ns("hopper")


@muon_ns.candidate("triton-auto", requires=Requires(triton=True), tolerance=_BF16_ITERATION)
def triton_auto():
    """kernelbench.newton_schulz.choose_path's pick per shape and device (newton_schulz.last_path)."""
    return _triton_ns("auto")
