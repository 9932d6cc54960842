"""Newton-Schulz and Muon on the GPU: every path, with and without a CUDA graph, beside torch, in
one process (~60-90 s on an H200, much of it Triton compiling). Run from the repository root:

    python scripts/probe_muon.py            # ANCHORS.md's shapes, Muon's batched llama-468m
                                            # shapes, then a Muon step on llama-468m
    python scripts/probe_muon.py --sweep    # also every (Gram, update) tile config per path
    python scripts/probe_muon.py --budget 60 --no-step

Times: median of triton.testing.do_bench (L2 flushed before each call). Per shape one line per
variant: ms, speed-up over torch-eager (the op's anchor), relative Frobenius error against the
fp32 iteration, and for graph variants whether the result equals the same path's direct call
bit for bit. Ends with the MEASURED_ROUTES block (fastest variant per shape) to paste into
kernelbench/muon/newton_schulz.py. Sections that would start after --budget seconds are skipped
and say so.
"""

from __future__ import annotations

import argparse
import importlib
import time

import torch
import triton

# The module (kernelbench.muon exports the function of the same name).
ns = importlib.import_module("kernelbench.muon.newton_schulz")

ANCHOR_SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (4096, 1024), (2048, 512)]
# Muon's Newton-Schulz calls on llama-468m: same-shape weights are batched (kernelbench.optim.muon).
MUON_SHAPES = [(96, 1024, 1024), (48, 4096, 1024), (24, 1024, 4096)]
# Graph variants are measured only up to this much work (batch * m * m * n): past it the GPU
# outlasts the launches and a graph cannot help.
GRAPH_PROBE_MAX_WORK = 4 * ns.GRAPH_MAX_WORK


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def variants(shape: tuple[int, ...]) -> dict[str, tuple[str, bool] | None]:
    """variant name -> the (path, graph) route it stands for (None: auto's current choice)."""
    batch, m, n = ns._dims(shape)
    graphs = (False, True) if batch * m * m * n <= GRAPH_PROBE_MAX_WORK else (False,)
    out: dict[str, tuple[str, bool] | None] = {"torch-eager": ("torch", False)}
    for path in ("torch", "classic", "hopper"):
        for graph in graphs:
            if path == "torch" and not graph:
                continue  # that is torch-eager
            out[f"{path}{'+graph' if graph else ''}"] = (path, graph)
    out["auto"] = None
    return out


def probe_shape(shape: tuple[int, ...], device: torch.device) -> dict[str, tuple[float, tuple[str, bool]]]:
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    G = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
    ref = ns.newton_schulz_ref(G.float())
    times: dict[str, float] = {}
    results: dict[str, tuple[float, tuple[str, bool]]] = {}
    label = "x".join(map(str, shape))
    direct: dict[str, torch.Tensor] = {}
    for name, route in variants(shape).items():
        if name == "torch-eager":
            fn = lambda: ns.newton_schulz_ref(G)  # noqa: E731  the op's anchor, as the harness runs it
        elif route is None:
            fn = lambda: ns.newton_schulz(G, check_finite=False)  # noqa: E731
        else:
            fn = lambda r=route: ns.newton_schulz(G, path=r[0], graph=r[1], check_finite=False)  # noqa: E731
        try:
            out = fn()
        except (ValueError, RuntimeError) as err:
            print(f"  {label} {name}: unavailable: {str(err).splitlines()[0]}")
            continue
        if name != "torch-eager":  # what really ran (a graph is refused where it can't be used)
            route = (ns.newton_schulz.last_path, ns.newton_schulz.last_graph)
        t = bench(fn)
        times[name] = t
        extra = ""
        if route[1] and route[0] in direct:
            extra = f" same-as-direct={torch.equal(out, direct[route[0]])}"
        elif not route[1]:
            direct[route[0]] = out
        if name == "auto":
            extra += f" ran={route[0]}{'+graph' if route[1] else ''}"
        base = times.get("torch-eager", t)
        print(f"  {label:>14} {name:<14} {t:8.3f} ms  {base / t:5.2f}x  fro {rel_fro(out, ref):.4f}{extra}",
              flush=True)
        if name != "auto":
            results[name] = (t, route)
    return results


def sweep(shape: tuple[int, ...], device: torch.device) -> None:
    """Every (Gram config, update config) pair per Triton path: is the wave model right?"""
    G = torch.randn(shape, device=device).to(torch.bfloat16)
    batch, m, n = ns._dims(shape)
    original = ns.pick_configs
    chosen = original(m, n, batch, device)
    for path in ("classic", "hopper"):
        rows = []
        try:
            for gram in ns.TILE_CONFIGS:
                for upd in ns.TILE_CONFIGS:
                    ns.pick_configs = lambda *args, g=gram, u=upd: (g, u)
                    fn = lambda: ns.newton_schulz(G, path=path, graph=False, check_finite=False)  # noqa: E731
                    rows.append((bench(fn), gram, upd))
        except (ValueError, RuntimeError) as err:
            print(f"  sweep {path}: {str(err).splitlines()[0]}")
        finally:
            ns.pick_configs = original
        for t, gram, upd in sorted(rows, key=lambda r: r[0])[:3]:
            mark = " (pick_configs' choice)" if (gram, upd) == chosen else ""
            print(f"    sweep {path} gram {gram.block_m}x{gram.block_n} update {upd.block_m}x{upd.block_n}: "
                  f"{t:.3f} ms{mark}")


def probe_muon_step(device: torch.device) -> None:
    """One optimizer step on llama-468m's parameters: torch reference Muon against ours."""
    from kernelbench.ops.optim_workloads import LLAMA_468M
    from kernelbench.optim.muon import Muon, MuonReference, muon_param_groups

    gen = torch.Generator(device=device).manual_seed(0)
    named = [(name, torch.nn.Parameter(torch.randn(shape, device=device, generator=gen) * 0.02))
             for name, shape in LLAMA_468M.spec["shapes"]]
    for _, p in named:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    hp = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01, adamw_lr=3e-4, adamw_weight_decay=0.01)
    ref_t = bench(MuonReference(muon_param_groups(named), **hp).step)
    print(f"  muon step llama-468m  torch-reference {ref_t:8.2f} ms", flush=True)
    for path in ("auto", "torch", "classic", "hopper"):
        opt = Muon(muon_param_groups(named), ns_path=path, **hp)
        try:
            t = bench(opt.step)
        except (ValueError, RuntimeError) as err:
            print(f"  muon step ns_path={path}: {str(err).splitlines()[0]}")
            continue
        print(f"  muon step llama-468m  ns_path={path:<8} {t:8.2f} ms  {ref_t / t:5.2f}x  "
              f"(adamw: {opt.adamw_backend}; last NS ran {ns.newton_schulz.last_path}"
              f"{'+graph' if ns.newton_schulz.last_graph else ''})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=70.0, help="seconds after which sections are skipped")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs per shape")
    parser.add_argument("--no-step", action="store_true", help="skip the Muon optimizer step")
    args = parser.parse_args()
    start = time.perf_counter()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    fragment = name.split()[1] if len(name.split()) > 1 else name
    print(f"# {name}, triton {triton.__version__}, torch {torch.__version__}; "
          f"MEASURED_ROUTES entries now: {len(ns.MEASURED_ROUTES)}")
    routes = []
    for shape in ANCHOR_SHAPES + MUON_SHAPES:
        if time.perf_counter() - start > args.budget:
            print(f"  {'x'.join(map(str, shape))}: skipped (budget {args.budget:.0f} s spent)")
            continue
        results = probe_shape(shape, device)
        if results:
            best = min(results, key=lambda k: results[k][0])
            batch, m, n = ns._dims(shape)
            anchor = results.get("torch-eager", results[best])[0]
            routes.append(((fragment, batch, m, n), results[best][1], results[best][0], anchor))
        if args.sweep:
            sweep(shape, device)
    print(f"# {time.perf_counter() - start:.0f} s so far")
    print("MEASURED_ROUTES: dict[tuple[str, int, int, int], tuple[str, bool]] = {")
    for key, route, t, anchor in routes:
        print(f"    {key!r}: {route!r},  # {t:.3f} ms, torch-eager {anchor:.3f} ms: {anchor / t:.2f}x")
    print("}")
    if args.no_step or time.perf_counter() - start > args.budget:
        print("  muon step: skipped")
    else:
        probe_muon_step(device)
    print(f"# done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
