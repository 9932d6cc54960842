"""Where Adafactor8bit stands on model-370m, in one process on the GPU (< 90 s on an H200).

    python scripts/probe_adafactor.py [--budget 85]

Prints one JSON line per measurement:
  * parity: the fp32-state kernels against AdafactorRef after 5 steps on a small model-370m-shaped
    model (max |diff| / max |ref| per tensor, worst tensor), and the 8-bit state's relative error
    of the cumulative parameter change over the same 5 steps;
  * step time on model-370m (367.6M fp32 params, grads set once, do_bench median with L2 flushed,
    as the harness times it) for triton-8bit, triton-fp32 and torch-ref, with the GB/s implied by
    the 24 bytes per parameter the kernels move and by the 12 an Adafactor step must move;
  * a per-kernel breakdown of one triton-8bit step (torch.profiler, mean us per launch);
  * state bytes of each (sum of the tensors in optimizer.state, not the allocator delta);
  * last, the anchor adafactor8bit 0.4.6 (when installed) in a subprocess bounded by what is left
    of the budget: its first step JIT-compiles CUDA (~95 s on a cold machine), so on a cold
    machine it prints a 'skipped' line instead of overrunning.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

START = time.perf_counter()


def emit(**row) -> None:
    row["t_s"] = round(time.perf_counter() - START, 1)
    print(json.dumps(row), flush=True)


def shapes_370m():
    from kernelbench.ops.optim_workloads import model_370m_shapes

    return [shape for _, shape in model_370m_shapes()]


def make_params(shapes, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda") * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, device="cuda")
    return params


def build(name, params):
    """The op's candidate factory with the op's hyperparameters: exactly what the harness times."""
    from kernelbench.ops.adafactor import adafactor

    hp = adafactor.hyperparams
    return adafactor.get_candidate(name).build([(f"p{i}", p) for i, p in enumerate(params)], **hp)


def state_bytes(opt) -> int:
    seen, total = set(), 0
    for state in opt.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
    return total


def bench(opt) -> float:
    import triton.testing

    opt.step()  # compile, allocate state, build launch tables
    torch.cuda.synchronize()
    return triton.testing.do_bench(opt.step, warmup=25, rep=200, return_mode="median")


def parity() -> None:
    from kernelbench.ops.optim_workloads import model_370m_shapes
    from kernelbench.optim.adafactor import Adafactor8bit
    from kernelbench.optim.adafactor_ref import AdafactorRef

    shapes = [s for _, s in model_370m_shapes(vocab=512, d=128, layers=2)]
    hp = dict(weight_decay=0.01)
    initial = [p.detach().clone() for p in make_params(shapes)]
    runs = {}
    for name, cls, kw in (("ref", AdafactorRef, {}), ("fp32", Adafactor8bit, {"quantize": False}),
                          ("8bit", Adafactor8bit, {"quantize": True})):
        params = make_params(shapes)
        opt = cls(params, **hp, **kw)
        for step in range(5):
            gen = torch.Generator(device="cuda").manual_seed(1000 + step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen, device="cuda")
            opt.step()
        runs[name] = params
    worst = max(float((t - r).abs().max() / r.abs().max()) for t, r in zip(runs["fp32"], runs["ref"]))
    num = sum(float((a - b).detach().norm() ** 2) for a, b in zip(runs["8bit"], runs["ref"]))
    den = sum(float((b - c).detach().norm() ** 2) for b, c in zip(runs["ref"], initial))
    emit(what="parity", steps=5, fp32_vs_ref_max_rel=worst, fp32_ok=worst <= 1e-5,
         eightbit_rel_err_of_change=(num / den) ** 0.5)


def kernel_breakdown(opt) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            opt.step()
        torch.cuda.synchronize()
    rows = {}
    for evt in prof.key_averages():
        total = getattr(evt, "self_device_time_total", 0)  # kernels only: host ops have none
        if total > 0:
            rows[evt.key[:48]] = round(total / 3, 1)
    emit(what="kernels_us_per_step", variant="triton-8bit", kernels=rows)


def speed(budget: float) -> None:
    params = make_params(shapes_370m())
    numel = sum(p.numel() for p in params)
    for name in ("triton-8bit", "triton-fp32", "torch-ref"):
        if name == "torch-ref" and time.perf_counter() - START > budget - 30:
            emit(what="step", candidate=name, skipped="budget")
            continue
        snapshot = [p.detach().clone() for p in params] if name == "triton-8bit" else None
        opt = build(name, params)
        ms = bench(opt)
        emit(what="step", candidate=name, workload="model-370m", median_ms=round(ms, 3),
             gbps_24B=round(24 * numel / ms / 1e6, 1), gbps_12B=round(12 * numel / ms / 1e6, 1),
             state_bytes=state_bytes(opt), target_ms=4.4)
        if name == "triton-8bit":
            kernel_breakdown(opt)
        del opt
        if snapshot is not None:  # every candidate starts from the same parameters
            with torch.no_grad():
                for p, s in zip(params, snapshot):
                    p.copy_(s)
            del snapshot
        torch.cuda.empty_cache()


def peer_child() -> None:
    """Run in a subprocess: adafactor8bit 0.4.6 through the op's factory."""
    params = make_params(shapes_370m())
    t0 = time.perf_counter()
    opt = build("adafactor8bit", params)
    opt.step()  # JIT-compiles its CUDA extension the first time on a machine
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    ms = bench(opt)
    emit(what="step", candidate="adafactor8bit", workload="model-370m", median_ms=round(ms, 3),
         first_step_s=round(first_s, 1), state_bytes=state_bytes(opt),
         grads_kept=all(p.grad is not None for p in params))


def peer(budget: float) -> None:
    try:
        import adafactor8bit  # noqa: F401
    except ImportError:
        emit(what="step", candidate="adafactor8bit", skipped="not installed")
        return
    left = budget - (time.perf_counter() - START)
    if left < 15:
        emit(what="step", candidate="adafactor8bit", skipped=f"only {left:.0f} s of the budget left")
        return
    try:
        out = subprocess.run([sys.executable, __file__, "--peer-child"], capture_output=True, text=True,
                             timeout=left)
        sys.stdout.write(out.stdout)
        if out.returncode != 0:
            emit(what="step", candidate="adafactor8bit", error=out.stderr.strip().splitlines()[-1:])
    except subprocess.TimeoutExpired:
        emit(what="step", candidate="adafactor8bit",
             skipped=f"not done within the {left:.0f} s left (cold JIT build takes ~95 s); rerun warm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=85.0, help="seconds for the whole probe")
    parser.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_adafactor needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.peer_child:
        peer_child()
        return 0
    import triton

    emit(what="env", device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    parity()
    speed(args.budget)
    peer(args.budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
