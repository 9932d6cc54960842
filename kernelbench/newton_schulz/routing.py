"""Muon's Newton-Schulz orthogonalisation with symmetric, epilogue-fused Triton GEMMs.

    X = G / (||G||_F + 1e-7)          (transposed first when rows > cols, so X is m x n, m <= n)
    repeat `steps` times:
        A = X X^T;  B = b A + c A A;  X = a X + B X      (a, b, c) = (3.4445, -4.7750, 2.0315)

in bf16 with fp32 accumulation, on a matrix (m, n) or a batch (batch, m, n); the result has the
input's dtype and orientation. Paths:

- ``classic``: pointer-load Triton GEMMs (``classic.py``), any CUDA GPU, and the interpreter.
- ``hopper``: TMA descriptors + persistent tiles (``hopper.py``), sm_90 only.
- ``torch``: the same iteration with torch's bf16 matmul (cuBLAS).
- ``auto``: :func:`choose_route` picks a path, and whether to replay a CUDA graph, by device
  and shape (MEASURED_ROUTES, then a default rule); ``newton_schulz.last_path`` and
  ``newton_schulz.last_graph`` name what the last call ran.

Per iteration: three launches (Gram, fused polynomial, fused update); per call two more (the
norm, the normalise-and-transpose into bf16). The Frobenius norm stays on the device. The only
host sync is the optional finiteness check, made after every kernel is queued.

Small shapes are bound by the host, not the GPU: at 1024 x 1024 the 17 launches take several
times longer in Python and the driver than the GPU work. There each call replays a CUDA graph
captured once per (shape, dtype, path, stream): see _GraphedCall for what it costs and keeps.
"""

from __future__ import annotations

import functools
import math

import torch

from .._device import sm_count
from . import classic
from .classic import GemmConfig, interpreting

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
PATHS = ("auto", "classic", "hopper", "torch")
INPUT_DTYPES = (torch.float32, torch.bfloat16)


def newton_schulz_ref(G: torch.Tensor, steps: int = 5, eps: float = NS_EPS) -> torch.Tensor:
    """Pure PyTorch, in G's own dtype (kernelbench.ops.muon_ns.newton_schulz_ref is the same)."""
    a, b, c = NS_COEFFICIENTS
    X = G.mT if G.size(-2) > G.size(-1) else G
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.mT if G.size(-2) > G.size(-1) else X


# -- tile configs -----------------------------------------------------------------------------
# Candidates, largest first. 128x256x64 with 8 warps (two warpgroups of 64x256 wgmma) and 3
# stages (3 * (128 + 256) * 64 * 2 B = 144 KiB of shared memory) is the tile that reaches cuBLAS
# rates on Hopper when there are enough tiles to fill the SMs; smaller tiles trade per-tile
# efficiency for more tiles, which wins when the big tile leaves SMs idle (n <= 4096).
# THROUGHPUT is the assumed per-SM rate of each tile relative to the largest: an estimate that
# picked the fastest (Gram, update) pair of a full sweep on every measured shape.
TILE_CONFIGS = (
    GemmConfig(128, 256, 64, num_stages=3, num_warps=8),
    GemmConfig(128, 128, 64, num_stages=4, num_warps=8),
    GemmConfig(64, 128, 64, num_stages=4, num_warps=4),
    GemmConfig(64, 64, 64, num_stages=4, num_warps=4),
)
THROUGHPUT = {(128, 256): 1.0, (128, 128): 0.85, (64, 128): 0.65, (64, 64): 0.45}
# The interpreter: tiles small enough that test matrices of a few dozen rows span several, and
# no smaller (the interpreter's time grows with the number of programs).
INTERPRETER_CONFIG = GemmConfig(32, 64, 32, num_stages=1, num_warps=4, group_m=2)


def sym_tile_count(m: int, cfg: GemmConfig) -> int:
    """Tiles the Gram kernels launch for an m x m symmetric result (upper triangle only)."""
    return sum(math.ceil((m - i * cfg.block_m) / cfg.block_n) for i in range(math.ceil(m / cfg.block_m)))


def _cost(tiles: int, cfg: GemmConfig, sms: int) -> float:
    # Waves of tiles (a partial wave costs a whole one) times the time of one tile.
    return math.ceil(tiles / sms) * cfg.block_m * cfg.block_n / THROUGHPUT[(cfg.block_m, cfg.block_n)]


def configs_for(m: int, n: int, batch: int, sms: int) -> tuple[GemmConfig, GemmConfig]:
    """(Gram config, update config) for X of shape (batch, m, n) on a GPU of ``sms`` SMs, by the
    wave model above. The stages are the most a launch uses: the Hopper kernels run fewer where
    the output's epilogue would not fit shared memory (hopper.stages_that_fit)."""
    gram = min(TILE_CONFIGS, key=lambda c: _cost(batch * sym_tile_count(m, c), c, sms))
    upd = min(TILE_CONFIGS, key=lambda c: _cost(batch * math.ceil(m / c.block_m) * math.ceil(n / c.block_n), c, sms))
    return gram, upd


@functools.lru_cache(maxsize=256)
def pick_configs(m: int, n: int, batch: int, device: torch.device) -> tuple[GemmConfig, GemmConfig]:
    """configs_for on ``device`` (INTERPRETER_CONFIG for both off CUDA)."""
    if device.type != "cuda":
        return INTERPRETER_CONFIG, INTERPRETER_CONFIG
    return configs_for(m, n, batch, sm_count(device))


# -- routing ------------------------------------------------------------------------------------
# (device-name fragment, batch, m, n) -> (path, graph), measured on the GPU: the block that
# `python scripts/probes/muon_routes.py` prints (each comment: speed-up over torch eager). Only the
# H200 has entries (triton 3.6.0, torch 2.11.0+cu130); on an H100, or any shape not listed, the
# default rule in choose_route applies (Hopper kernels on sm_90, classic elsewhere; a CUDA graph
# when batch * m * m * n <= GRAPH_MAX_WORK), which picks the same routes as this table does on
# the H200. The batched rows are Muon's llama-468m calls; results/2026-11-22-h200-ci-suite holds
# the op's timings.
MEASURED_ROUTES: dict[tuple[str, int, int, int], tuple[str, bool]] = {
    ("H200", 1, 1024, 1024): ("hopper", True),  # 2.98x
    ("H200", 1, 2048, 2048): ("hopper", True),  # 1.12x
    ("H200", 1, 4096, 4096): ("hopper", False),  # 1.47x
    ("H200", 1, 8192, 8192): ("hopper", False),  # 1.46x
    ("H200", 1, 1024, 4096): ("hopper", True),  # 3.50x
    ("H200", 1, 512, 2048): ("hopper", True),  # 6.18x
    ("H200", 96, 1024, 1024): ("hopper", False),  # 1.59x
    ("H200", 48, 1024, 4096): ("hopper", False),  # 2.28x
    ("H200", 24, 1024, 4096): ("hopper", False),  # 1.52x
}

# Replay a CUDA graph of the whole call (see _GraphedCall) when batch * m * m * n is at most this.
# Below it a call is bound by the host's 17 kernel launches; above it the GPU is busy longer
# than the launches take, so a graph only adds its input copy and output clone.
GRAPH_MAX_WORK = 2**33  # 2048 x 2048 x 2048


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def route_dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, m, n) with m <= n: the orientation the iteration runs in."""
    batch = shape[0] if len(shape) == 3 else 1
    rows, cols = shape[-2], shape[-1]
    return batch, min(rows, cols), max(rows, cols)


def graph_by_default(shape: tuple[int, ...], device: torch.device | str) -> bool:
    """Whether a call of this shape replays a CUDA graph when ``graph=None`` and no measured
    route says otherwise: on CUDA, for work small enough to be launch-bound."""
    batch, m, n = route_dims(shape)
    return torch.device(device).type == "cuda" and batch * m * m * n <= GRAPH_MAX_WORK


def choose_route(shape: tuple[int, ...], device: torch.device | str) -> tuple[str, bool]:
    """(path, graph) that ``path="auto"`` runs for a tensor of ``shape`` on ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        return ("classic" if interpreting() else "torch"), False
    batch, m, n = route_dims(shape)
    name = _device_name(device)
    for (fragment, bb, mm, nn), route in MEASURED_ROUTES.items():
        if fragment in name and (bb, mm, nn) == (batch, m, n):
            return route
    from . import hopper

    path = "hopper" if hopper.unavailable_reason(device, (m, n), (m, m)) is None else "classic"
    return path, graph_by_default(shape, device)


def choose_path(shape: tuple[int, ...], device: torch.device | str) -> str:
    """The path ``path="auto"`` runs for a tensor of ``shape`` on ``device``."""
    return choose_route(shape, device)[0]


# -- the entry point ----------------------------------------------------------------------------
def _validate(G: torch.Tensor, steps: int, path: str) -> None:
    if not isinstance(G, torch.Tensor):
        raise TypeError(f"newton_schulz needs a torch.Tensor, got {type(G).__name__}")
    if G.dim() not in (2, 3):
        raise ValueError(
            f"newton_schulz needs a 2-D matrix or a 3-D batch of matrices; got a {G.dim()}-D tensor "
            f"of shape {tuple(G.shape)}"
        )
    if G.numel() == 0:
        raise ValueError(f"newton_schulz got an empty tensor of shape {tuple(G.shape)}")
    if G.dtype not in INPUT_DTYPES:
        raise ValueError(f"newton_schulz accepts float32 or bfloat16 input; got {G.dtype}")
    if type(G) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"newton_schulz takes a plain tensor; got a {type(G).__name__} (a tensor subclass's "
                        "storage is not its data: pass its local tensor, e.g. DTensor.to_local() of a whole matrix)")
    if G.device.type == "meta":
        raise ValueError("newton_schulz got a meta tensor (no storage); materialise it first")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int; got {steps!r}")
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; accepted: {', '.join(PATHS)}")
    if path in ("classic", "hopper") and G.device.type != "cuda" and not interpreting():
        raise ValueError(f"path {path!r} runs Triton kernels: it needs a CUDA tensor (or TRITON_INTERPRET=1)")


def newton_schulz(G: torch.Tensor, steps: int = 5, path: str = "auto", check_finite: bool = True,
                  eps: float = NS_EPS, graph: bool | None = None) -> torch.Tensor:
    """Orthogonalise G (m x n or batch x m x n; fp32 or bf16) by `steps` quintic iterations.

    check_finite: raise ValueError when G holds inf or NaN. It costs one host sync, taken after
    all the work is queued; pass False where no sync is allowed (Muon.step does): a non-finite
    G then gives a NaN result, as torch's iteration would.
    graph: replay a CUDA graph of the whole call (see _GraphedCall): True, False, or None for
    the route's choice (``path="auto"``) or graph_by_default's size rule (explicit paths).
    Never while the caller is itself capturing a graph: the kernels are then launched into it.
    ``newton_schulz.last_path`` and ``newton_schulz.last_graph`` say what the last call ran.
    """
    _validate(G, steps, path)
    if G.device.type == "cuda" and G.device.index != torch.cuda.current_device():
        with torch.cuda.device(G.device):  # Triton launches on the current device
            return newton_schulz(G, steps, path, check_finite, eps, graph)
    if path == "auto":
        path, route_graph = choose_route(tuple(G.shape), G.device)
        graph = route_graph if graph is None else graph
    elif graph is None:
        graph = graph_by_default(tuple(G.shape), G.device)
    graph = bool(graph) and G.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()
    newton_schulz.last_path = path
    newton_schulz.last_graph = graph
    if graph:
        out, norm = _graphed_call(G, steps, path, eps)
    else:
        out, norm = _run(G, steps, path, eps)
    if check_finite:
        if norm is None:
            norm = G.float().norm()
        if not bool(torch.isfinite(norm).all()):
            raise ValueError("newton_schulz input holds inf or NaN (its Frobenius norm is not finite)")
    return out


newton_schulz.last_path = None
newton_schulz.last_graph = False


def _run(G: torch.Tensor, steps: int, path: str, eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The call without a graph: (result, Frobenius norm of G or None)."""
    if path == "torch":
        return newton_schulz_ref(G.to(torch.bfloat16), steps, eps).to(G.dtype), None
    return _newton_schulz_triton(G, steps, path, eps)


# -- CUDA graphs ----------------------------------------------------------------------------------
class _GraphedCall:
    """One call of a given (path, steps, eps, shape, dtype, device, stream), captured once and
    replayed: one graph launch instead of 17 kernel launches and their Python.

    The graph reads its input from a static buffer and writes a static output, so a replay is:
    copy G into the input buffer, replay, clone the output (the caller gets its own tensor; the
    next call overwrites the static one). Those two copies are each one pass over G, small
    beside the iteration at the shapes graphs are used for. The buffers (input, output and the
    iteration's bf16 work matrices, about 2 + 4 matrices of G's size) stay allocated, in the
    graph's private memory pool, until clear_graph_cache(). One graph per stream: two streams
    replaying one graph's buffers at once would race.
    """

    def __init__(self, G: torch.Tensor, steps: int, path: str, eps: float) -> None:
        self.input = torch.empty(G.shape, dtype=G.dtype, device=G.device)
        self.input.copy_(G)
        caller = torch.cuda.current_stream(G.device)
        # A first call outside capture compiles the kernels and builds the cached tile tables
        # (a host-to-device copy, which capture forbids); on a side stream, as capture wants.
        side = torch.cuda.Stream(G.device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            _run(self.input, steps, path, eps)
        caller.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # On the side stream: torch.cuda.graph's default capture stream belongs to the device of its
        # first use, and capturing on another GPU's stream would switch the launches to that GPU.
        with torch.cuda.graph(self.graph, stream=side):
            self.output, self.norm = _run(self.input, steps, path, eps)

    def __call__(self, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.input.copy_(G)
        self.graph.replay()
        return self.output.clone(), self.norm


_GRAPHS: dict[tuple, _GraphedCall] = {}
MAX_GRAPHS = 32  # distinct (shape, dtype, path, stream) calls kept; the oldest goes first


def _graphed_call(G: torch.Tensor, steps: int, path: str, eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    key = (path, steps, eps, tuple(G.shape), G.dtype, G.device, torch.cuda.current_stream(G.device).cuda_stream)
    call = _GRAPHS.get(key)
    if call is None:
        if len(_GRAPHS) >= MAX_GRAPHS:
            del _GRAPHS[next(iter(_GRAPHS))]
        call = _GRAPHS[key] = _GraphedCall(G, steps, path, eps)
    return call(G)


def clear_graph_cache() -> None:
    """Drop every captured call and its buffers (they are recaptured on next use)."""
    _GRAPHS.clear()


def _newton_schulz_triton(G: torch.Tensor, steps: int, path: str, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if path == "hopper":
        from . import hopper as kernels
    else:
        kernels = classic
    squeeze = G.dim() == 2
    G3 = G.unsqueeze(0) if squeeze else G
    transposed = G3.size(-2) > G3.size(-1)
    Gv = G3.mT if transposed else G3  # (batch, m, n), m <= n: a view, no copy
    batch, m, n = Gv.shape
    if path == "hopper":
        reason = kernels.unavailable_reason(G.device, (m, n), (m, m))
        if reason is not None:
            raise ValueError(f"path 'hopper' is unavailable: {reason}")
    gram_cfg, upd_cfg = pick_configs(m, n, batch, G.device)

    norm = torch.linalg.vector_norm(Gv, dim=(-2, -1), dtype=torch.float32)
    x = torch.empty((batch, m, n), device=G.device, dtype=torch.bfloat16)
    classic.normalize(Gv, norm, x, eps)
    out = torch.empty_like(G3)  # the caller's dtype and orientation
    out_view = out.mT if transposed else out
    if steps == 0:
        out_view.copy_(x)
        return (out.squeeze(0) if squeeze else out), norm

    a, b, c = NS_COEFFICIENTS
    gram = torch.empty((batch, m, m), device=G.device, dtype=torch.bfloat16)
    poly = torch.empty_like(gram)
    x_next = torch.empty_like(x)
    for step in range(steps):
        kernels.sym_gram(x, gram, gram_cfg)
        kernels.sym_gram(gram, poly, gram_cfg, alpha=b, beta=c, fuse_poly=True)
        last = step == steps - 1
        kernels.update(poly, x, out_view if last else x_next, a, upd_cfg)
        x, x_next = x_next, x
    return (out.squeeze(0) if squeeze else out), norm
