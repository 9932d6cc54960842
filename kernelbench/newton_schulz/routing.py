"""Muon's Newton-Schulz orthogonalisation with symmetric, epilogue-fused Triton GEMMs.

    X = G / (||G||_F + 1e-7)          (transposed first when rows > cols, so X is m x n, m <= n)
    repeat `steps` times:
        A = X X^T;  B = b A + c A A;  X = a X + B X      (a, b, c) = (3.4445, -4.7750, 2.0315)

in bf16 with fp32 accumulation, on a matrix (m, n) or a batch (batch, m, n); the result has the
input's dtype and orientation. Paths:

- ``classic``: pointer-load Triton GEMMs, any CUDA GPU, and the interpreter.
- ``hopper``: TMA descriptors + persistent tiles, sm_90 only.
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

Below this file: ``host.py`` (tile configurations, launches, the iteration ``forward``) and
``kernels.py`` (the Triton kernels and their math).
"""

from __future__ import annotations

import functools

import torch

from . import host
from .host import NS_COEFFICIENTS, NS_EPS, interpreting

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


# -- routing ------------------------------------------------------------------------------------
# (device-name fragment, batch, m, n) -> (path, graph): the fastest route per shape, the block
# that `python scripts/tune_muon_routes.py` prints on the GPU. Only the H200 has entries (triton
# 3.6.0, torch 2.11.0+cu130); on an H100, or any shape not listed, the default rule in
# choose_route applies (Hopper kernels on sm_90, classic elsewhere; a CUDA graph when
# batch * m * m * n <= GRAPH_MAX_WORK), which picks the same routes as this table does on the
# H200. The batched rows are Muon's llama-468m calls; the op's timings:
# results/2026-11-22-h200-ci-suite.
MEASURED_ROUTES: dict[tuple[str, int, int, int], tuple[str, bool]] = {
    ("H200", 1, 1024, 1024): ("hopper", True),
    ("H200", 1, 2048, 2048): ("hopper", True),
    ("H200", 1, 4096, 4096): ("hopper", False),
    ("H200", 1, 8192, 8192): ("hopper", False),
    ("H200", 1, 1024, 4096): ("hopper", True),
    ("H200", 1, 512, 2048): ("hopper", True),
    ("H200", 96, 1024, 1024): ("hopper", False),
    ("H200", 48, 1024, 4096): ("hopper", False),
    ("H200", 24, 1024, 4096): ("hopper", False),
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
    path = "hopper" if host.unavailable_reason(device, (m, n), (m, m)) is None else "classic"
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
    return host.forward(G, steps, path, eps)


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

    Between calls, the input and output (``static_bytes``) stay allocated; the work matrices are
    freed at the end of capture into a memory pool that every graph of the same device and stream
    shares, so the pool holds the largest call's work matrices, not the sum over shapes (replays on
    one stream never overlap, so one graph's work matrices are dead while another's run).
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
        with torch.cuda.graph(self.graph, stream=side, pool=_shared_pool(G.device, caller.cuda_stream)):
            self.output, self.norm = _run(self.input, steps, path, eps)

    @property
    def static_bytes(self) -> int:
        """Bytes this graph keeps allocated between calls: its static input, output and norm."""
        return sum(t.untyped_storage().nbytes() for t in (self.input, self.output, self.norm) if t is not None)

    def __call__(self, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.input.copy_(G)
        self.graph.replay()
        return self.output.clone(), self.norm


_GRAPHS: dict[tuple, _GraphedCall] = {}
_POOLS: dict[tuple, tuple] = {}  # (device, caller stream) -> the memory pool its graphs share


def _shared_pool(device: torch.device, stream: int) -> tuple:
    key = (device, stream)
    if key not in _POOLS:
        _POOLS[key] = torch.cuda.graph_pool_handle()
    return _POOLS[key]
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
    _POOLS.clear()


def graph_static_bytes(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> int:
    """Bytes the cached graphs of calls on a G of this shape, dtype and device keep allocated
    between calls (their static input, output and norm; every path, step count and stream)."""
    device = torch.device(device)
    return sum(call.static_bytes for key, call in _GRAPHS.items()
               if key[3] == tuple(shape) and key[4] == dtype and key[5] == device)
