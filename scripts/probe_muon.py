"""Newton-Schulz and Muon on the GPU: Muon's llama-468m step, then auto vs torch per shape.

One process, < 60 s on an H200 (much of it Triton compiling). Run from the repository root:

    python scripts/probe_muon.py            # Muon step on llama-468m (fp32 weights, the batched
                                            # shapes Muon makes), then auto vs torch eager at
                                            # ANCHORS.md's and Muon's shapes
    python scripts/probe_muon.py --variants # every path, with and without a CUDA graph, per shape,
                                            # and the MEASURED_ROUTES block to paste into
                                            # kernelbench/muon/newton_schulz.py
    python scripts/probe_muon.py --sweep    # also every (Gram, update) tile config per path

Times: median of triton.testing.do_bench (L2 flushed before each call). Per shape one line per
variant: ms, speed-up over torch-eager (the op's anchor), relative Frobenius error against the
fp32 iteration, and for graph variants whether the result equals the same path's direct call
bit for bit. Every section runs under try/except: a failure prints its error and the probe goes
on. Sections that would start after --budget seconds are skipped and say so.
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


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def variants(shape: tuple[int, ...], every: bool) -> dict[str, tuple[str, bool] | None]:
    """variant name -> the (path, graph) route it stands for (None: auto's current choice);
    without ``every`` only torch-eager and auto."""
    if not every:
        return {"torch-eager": ("torch", False), "auto": None}
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


def probe_shape(shape: tuple[int, ...], device: torch.device, every: bool) -> dict[str, tuple[float, tuple[str, bool]]]:
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    G = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
    ref = ns.newton_schulz_ref(G.float())
    times: dict[str, float] = {}
    results: dict[str, tuple[float, tuple[str, bool]]] = {}
    label = "x".join(map(str, shape))
    direct: dict[str, torch.Tensor] = {}
    for name, route in variants(shape, every).items():
        if name == "torch-eager":
            fn = lambda: ns.newton_schulz_ref(G)  # noqa: E731  the op's anchor, as the harness runs it
        elif route is None:
            fn = lambda: ns.newton_schulz(G, check_finite=False)  # noqa: E731
        else:
            fn = lambda r=route: ns.newton_schulz(G, path=r[0], graph=r[1], check_finite=False)  # noqa: E731
        try:
            out = fn()
        except Exception as err:  # noqa: BLE001  (OutOfResources is not a RuntimeError)
            print(f"  {label} {name}: failed: {type(err).__name__}: {first_line(err)}", flush=True)
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
        except Exception as err:  # noqa: BLE001
            print(f"  sweep {path}: {type(err).__name__}: {first_line(err)}")
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
        except Exception as err:  # noqa: BLE001
            print(f"  muon step ns_path={path}: failed: {type(err).__name__}: {first_line(err)}", flush=True)
            continue
        print(f"  muon step llama-468m  ns_path={path:<8} {t:8.2f} ms  {ref_t / t:5.2f}x  "
              f"(adamw: {opt.adamw_backend}; last NS ran {ns.newton_schulz.last_path}"
              f"{'+graph' if ns.newton_schulz.last_graph else ''})", flush=True)


def section(name: str, fn, *args) -> None:
    """Run one section; a failure is printed and the probe goes on."""
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001
        print(f"  {name}: failed: {type(err).__name__}: {first_line(err)}", flush=True)


def probe_shapes(device: torch.device, args: argparse.Namespace, start: float) -> None:
    name = torch.cuda.get_device_name(device)
    fragment = name.split()[1] if len(name.split()) > 1 else name
    routes = []
    for shape in ANCHOR_SHAPES + MUON_SHAPES:
        label = "x".join(map(str, shape))
        if time.perf_counter() - start > args.budget:
            print(f"  {label}: skipped (budget {args.budget:.0f} s spent)")
            continue
        try:
            results = probe_shape(shape, device, args.variants)
        except Exception as err:  # noqa: BLE001
            print(f"  {label}: failed: {type(err).__name__}: {first_line(err)}", flush=True)
            continue
        if results and args.variants:
            best = min(results, key=lambda k: results[k][0])
            batch, m, n = ns._dims(shape)
            anchor = results.get("torch-eager", results[best])[0]
            routes.append(((fragment, batch, m, n), results[best][1], results[best][0], anchor))
        if args.sweep:
            section(f"sweep {label}", sweep, shape, device)
    if routes:
        print("MEASURED_ROUTES: dict[tuple[str, int, int, int], tuple[str, bool]] = {")
        for key, route, t, anchor in routes:
            print(f"    {key!r}: {route!r},  # {t:.3f} ms, torch-eager {anchor:.3f} ms: {anchor / t:.2f}x")
        print("}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=55.0, help="seconds after which sections are skipped")
    parser.add_argument("--variants", action="store_true", help="every path with and without a graph per shape")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs per shape")
    parser.add_argument("--no-step", action="store_true", help="skip the Muon optimizer step")
    args = parser.parse_args()
    start = time.perf_counter()
    device = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(device)}, triton {triton.__version__}, torch {torch.__version__}; "
          f"MEASURED_ROUTES entries now: {len(ns.MEASURED_ROUTES)}", flush=True)
    if args.no_step:
        print("  muon step: skipped")
    else:
        section("muon step", probe_muon_step, device)
    print(f"# {time.perf_counter() - start:.0f} s so far", flush=True)
    section("shapes", probe_shapes, device, args, start)
    print(f"# done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
