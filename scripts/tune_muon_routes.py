"""Re-measure Newton-Schulz's routes on this GPU and print the ``MEASURED_ROUTES`` block of
``kernelbench/newton_schulz/routing.py`` for it.

Per shape (the muon-ns op's shapes and Muon's batched llama-468m calls), every path (torch, classic,
hopper), with and without a CUDA graph where the call is small enough for one to help, is timed
by the harness's loop (median, L2 flushed); one JSON line per variant (ms, speed-up over torch
eager, relative Frobenius error against the fp32 iteration, and for graph variants whether the
result equals the same path's direct call bit for bit), then the fastest route per shape as the
table's entries. A variant that fails (e.g. hopper off sm_90) prints its error and the script
goes on. About a minute on an H200, most of it compiling.

    python scripts/tune_muon_routes.py [--budget 300]
"""

from __future__ import annotations

import argparse
import time

import torch

from kernelbench.newton_schulz import newton_schulz, newton_schulz_ref
from kernelbench.newton_schulz.routing import GRAPH_MAX_WORK, route_dims

from common import emit, first_line, interleaved_ms, rel_fro, require_cuda

SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (4096, 1024), (2048, 512),
          (96, 1024, 1024), (48, 4096, 1024), (24, 1024, 4096)]
# Graphs are tried up to 4x the default rule's limit, so the table can move that limit.
GRAPH_PROBE_MAX_WORK = 4 * GRAPH_MAX_WORK


def routes_for(shape: tuple[int, ...]) -> list[tuple[str, bool]]:
    batch, m, n = route_dims(shape)
    graphs = (False, True) if batch * m * m * n <= GRAPH_PROBE_MAX_WORK else (False,)
    return [(path, graph) for path in ("torch", "classic", "hopper") for graph in graphs]


def measure(shape: tuple[int, ...], device: torch.device) -> dict[tuple[str, bool], float]:
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    G = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
    ref = newton_schulz_ref(G.float())
    label = "x".join(map(str, shape))
    cases, outputs = {}, {}
    for path, graph in routes_for(shape):
        fn = (lambda p=path, g=graph: newton_schulz(G, path=p, graph=g, check_finite=False))
        try:
            outputs[(path, graph)] = fn()
        except Exception as err:  # OutOfResources is not a RuntimeError
            emit(shape=label, path=path, graph=graph, error=first_line(err))
            continue
        if (newton_schulz.last_path, newton_schulz.last_graph) != (path, graph):
            emit(shape=label, path=path, graph=graph, error="refused; ran "
                 f"{newton_schulz.last_path} graph={newton_schulz.last_graph}")
            continue
        cases[(path, graph)] = fn
    times = interleaved_ms(cases, rounds=2)
    eager = times.get(("torch", False))
    for (path, graph), ms in times.items():
        out = outputs[(path, graph)]
        row = dict(shape=label, path=path, graph=graph, ms=ms, fro_vs_fp32=rel_fro(out, ref))
        if eager:
            row["speedup_vs_torch_eager"] = eager / ms
        if graph and (path, False) in outputs:
            row["same_as_direct"] = torch.equal(out, outputs[(path, False)])
        emit(**row)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0, help="seconds after which shapes are skipped")
    args = parser.parse_args()
    device = require_cuda("tune_muon_routes")
    name = torch.cuda.get_device_name(device)
    fragment = name.split()[1] if len(name.split()) > 1 else name
    start = time.perf_counter()
    entries = []
    for shape in SHAPES:
        if time.perf_counter() - start > args.budget:
            emit(shape="x".join(map(str, shape)), skipped=f"budget of {args.budget:.0f} s spent")
            continue
        times = measure(shape, device)
        if times:
            best = min(times, key=times.get)
            eager = times.get(("torch", False), times[best])
            entries.append(((fragment, *route_dims(shape)), best, eager / times[best]))
    print(f"# {name}, triton {__import__('triton').__version__}, torch {torch.__version__}")
    print("MEASURED_ROUTES: dict[tuple[str, int, int, int], tuple[str, bool]] = {")
    for key, route, speedup in entries:
        print(f"    {key!r}: {route!r},  # {speedup:.2f}x")
    print("}")


if __name__ == "__main__":
    main()
