"""Measure Newton-Schulz paths and tile configs on this GPU (run on the GPU machine):

    python -m kernelbench.muon.tune            # ANCHORS.md's shapes
    python -m kernelbench.muon.tune 1024x4096  # others

For each shape: torch eager (bf16 cuBLAS), each Triton path with the configs pick_configs
chooses, then every (Gram, update) tile config on the Hopper path. Median of
triton.testing.do_bench (L2 flushed), interleaved in one process. Prints the rows for
newton_schulz.MEASURED_ROUTES (fastest path per shape) for pasting in.
"""

from __future__ import annotations

import sys

import torch
import triton

from . import newton_schulz as ns


def _bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main(shapes: list[tuple[int, int]]) -> None:
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    print(f"# {name}, triton {triton.__version__}, torch {torch.__version__}")
    routes = []
    for rows, cols in shapes:
        G = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        times = {"torch": _bench(lambda: ns.newton_schulz_ref(G))}
        for path in ("classic", "hopper"):
            try:
                times[path] = _bench(lambda: ns.newton_schulz(G, path=path, check_finite=False))
            except ValueError as err:
                print(f"  {path}: {err}")
        best = min(times, key=times.get)
        ratio = " ".join(f"{p} {t:.3f} ms ({times['torch'] / t:.2f}x)" for p, t in times.items())
        print(f"{rows}x{cols}: {ratio}; fastest {best}")
        routes.append(((name.split()[1] if len(name.split()) > 1 else name), min(rows, cols), max(rows, cols), best))
        if "hopper" in times:
            _sweep(G)
    print("MEASURED_ROUTES = {")
    for fragment, m, n, best in routes:
        print(f"    ({fragment!r}, {m}, {n}): {best!r},")
    print("}")


def _sweep(G: torch.Tensor) -> None:
    """Every (Gram config, update config) pair on the Hopper path: is the wave model right?"""
    original = ns.pick_configs
    results = []
    try:
        for gram in ns.TILE_CONFIGS:
            for upd in ns.TILE_CONFIGS:
                ns.pick_configs = lambda *args, g=gram, u=upd: (g, u)
                t = _bench(lambda: ns.newton_schulz(G, path="hopper", check_finite=False))
                results.append((t, gram, upd))
    finally:
        ns.pick_configs = original
    chosen = original(min(G.shape), max(G.shape), 1, G.device)
    for t, gram, upd in sorted(results, key=lambda r: r[0])[:3]:
        mark = " (pick_configs' choice)" if (gram, upd) == chosen else ""
        print(f"    gram {gram.block_m}x{gram.block_n} update {upd.block_m}x{upd.block_n}: {t:.3f} ms{mark}")


if __name__ == "__main__":
    args = sys.argv[1:] or ["1024x1024", "2048x2048", "4096x4096", "8192x8192", "4096x1024", "2048x512"]
    main([tuple(int(v) for v in a.split("x")) for a in args])
