"""Tune kernelbench.nn's RMSNorm and rotary kernels: launch configurations side by side with
liger-kernel and torch.compile, in one process, triton do_bench (median, L2 flushed).

Cases (each prints a table sorted by time, then a BEST line):
  harness     what `kernelbench run` measures: the op's registered candidates (triton, torch-compile,
              liger) through the harness's own FunctionCase and time_cuda (prepare outside the
              timing, L2 flushed, median), RMSNorm 32768x4096 and rotary, fwd and fwd+bwd; each row
              also gives host_us, the host time of one call (perf_counter over back-to-back calls):
              when host_us nears the GPU time the measurement is launch-bound, not kernel-bound
  rms-fwd     RMSNorm bf16 (32768, 4096) forward: forward configs (block_m, num_warps,
              programs_per_sm = persistent grid)
  rms-fb      the same shape forward+backward: backward configs (block_m, num_warps,
              programs_per_sm, prefetch) after the default forward
  sweep-N     forward+backward at N in --sweep-n, M = 2^27 / N: forward and backward configs
  rope-fwd    rotary bf16 q (8, 32, 2048, 128), k (8, 8, 2048, 128), HF rotate_half:
              (block_h, block_s, num_warps)
  rope-fb     rotary forward+backward: the --rope-fb-top fastest forward configs, used both ways
  wide        RMSNorm forward+backward at N in --wide-n (M = 2^27 / N, bf16): the default
              backward (the wide kernel up to N = 16384, above it two passes + dw column kernel),
              the WIDE configs (N = 16384: the two-pass kernels it replaced; 32768 and 65536: dw
              accumulated in the two-pass dx kernel, dw_in_dx, with programs_per_sm, num_warps,
              chunk_n, reverse_pass2), torch.compile and liger; each config row names its compiled
              registers / spills / shared memory and grid
  rope-host   rotary forward and forward+backward through apply_rotary: device ms and host_us with
              the launches as shipped (CachedLauncher) and forced onto Triton's launch path

"default" rows go through the public autograd path (rms_norm / apply_rotary, impl="triton");
config rows call the launch functions directly. Ratios are against the best anchor (liger,
torch.compile, and for RMSNorm forward F.rms_norm) of the same case; below 1 is faster.
The last line is a JSON summary of the best config per case.

  python scripts/probe_nn.py                        # everything, ~80 s on an H200
  python scripts/probe_nn.py --cases rms-fwd,rope-fwd --rms-fwd "block_m=1,num_warps=8;block_m=2,num_warps=16"
  python scripts/probe_nn.py --cases wide --no-compile  # the wide case without compile anchors, < 1 min
  python scripts/probe_nn.py --cases wide,rope-host  # with torch.compile anchors and launch overhead

Configs on the command line: ';' between configs, ',' between key=value pairs; "default" is the
built-in choice. A sweep config is "fwd:k=v,...|bwd:k=v,..." (either side may be left out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
from triton.testing import do_bench

from kernelbench.nn.rmsnorm import _rmsnorm_bwd, _rmsnorm_fwd, rms_norm
from kernelbench.nn.rotary import _launch, apply_rotary
from kernelbench.ops.rmsnorm import rmsnorm_ref as hf_rmsnorm
from kernelbench.ops.rotary import rotary_ref as hf_rotary
from kernelbench.ops.rotary import rotary_tables

RMS_FWD = ("default;block_m=1,num_warps=8;block_m=2,num_warps=16;block_m=4,num_warps=16;block_m=4,num_warps=8;"
           "block_m=8,num_warps=16")
# The backward prefetches by default: prefetch=0 rows show what it buys.
RMS_BWD = ("default;prefetch=0;num_warps=8,programs_per_sm=2;num_warps=16,programs_per_sm=2;"
           "block_m=2,num_warps=16,programs_per_sm=2")
SWEEP = ("default;bwd:prefetch=0;fwd:num_warps=16|bwd:num_warps=16,programs_per_sm=1;fwd:programs_per_sm=2;"
         "fwd:programs_per_sm=8")
# Backward configs of the wide case per N (";" between configs, "," between key=value), after the
# default forward; the default backward is the autograd row. N = 16384: the default is the wide
# kernel (1 split, 32 warps), wide_splits=0 the two-pass row kernels it replaced. N = 32768 and
# 65536: the two-pass dx kernel with dw accumulated in its pass 2 (dw_in_dx: one fp32 partial row
# per program in L2, 1 or 2 programs per SM, chunk_n wide chunks), and pass 2 reversed
# (reverse_pass2) with and without it. The wide kernel's configs there spilled (1 to 7+ ms on an
# H200): dropped.
DW_IN_DX = ("dw_in_dx=1,programs_per_sm=1,num_warps=16;dw_in_dx=1,programs_per_sm=2,num_warps=16;"
            "dw_in_dx=1,programs_per_sm=1,num_warps=8;dw_in_dx=1,programs_per_sm=2,num_warps=8;"
            "dw_in_dx=1,programs_per_sm=1,num_warps=8,chunk_n=4096;dw_in_dx=1,programs_per_sm=2,num_warps=8,chunk_n=4096;"
            "dw_in_dx=1,programs_per_sm=1,num_warps=32,chunk_n=16384;"
            "dw_in_dx=1,programs_per_sm=1,num_warps=16,reverse_pass2=1;"
            "dw_in_dx=1,programs_per_sm=2,num_warps=16,reverse_pass2=1;"
            "dw_in_dx=0,reverse_pass2=1;dw_in_dx=0,programs_per_sm=1")
WIDE = {
    16384: "wide_splits=0;wide_splits=1,num_warps=16",
    32768: DW_IN_DX,
    65536: DW_IN_DX,
}
ROPE = ("default;block_h=1,block_s=32,num_warps=4;block_h=1,block_s=16,num_warps=2;"
        "block_h=1,block_s=32,num_warps=2;block_h=1,block_s=64,num_warps=4;block_h=1,block_s=64,num_warps=8;"
        "block_h=1,block_s=128,num_warps=8;block_h=2,block_s=16,num_warps=4;block_h=2,block_s=32,num_warps=4;"
        "block_h=4,block_s=8,num_warps=4;block_h=4,block_s=16,num_warps=4;block_h=8,block_s=4,num_warps=4;"
        "block_h=8,block_s=8,num_warps=4;block_h=8,block_s=8,num_warps=8")
EPS = 1e-6


def parse_configs(text: str) -> list[dict]:
    configs = []
    for item in filter(None, (c.strip() for c in text.split(";"))):
        if item == "default":
            configs.append({})
            continue
        configs.append({k.strip(): int(v) for k, v in (kv.split("=") for kv in item.split(","))})
    return configs


def parse_sweep(text: str) -> list[tuple[dict, dict]]:
    out = []
    for item in filter(None, (c.strip() for c in text.split(";"))):
        sides = {"fwd": {}, "bwd": {}}
        if item != "default":
            for part in item.split("|"):
                side, _, kvs = part.partition(":")
                sides[side.strip()] = parse_configs(kvs)[0]
        out.append((sides["fwd"], sides["bwd"]))
    return out


def label(cfg: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "default"


class Case:
    """Rows of one case: (name, kind, ms); prints them sorted with GB/s, % copy, vs best anchor."""

    def __init__(self, name: str, nbytes: int, copy_gbps: float, rep: int):
        self.name, self.nbytes, self.copy_gbps, self.rep = name, nbytes, copy_gbps, rep
        self.rows: list[tuple[str, str, float]] = []

    def time(self, name: str, kind: str, fn) -> None:
        try:
            fn()  # compile / autotune outside the timing
            torch.cuda.synchronize()
            ms = do_bench(fn, warmup=10, rep=self.rep, return_mode="median")
        except Exception as exc:  # one broken config must not cost the rest of the probe
            print(f"  {self.name}: {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
            return
        self.rows.append((name, kind, ms))

    def report(self) -> dict:
        anchors = [ms for _, kind, ms in self.rows if kind == "anchor"]
        best_anchor = min(anchors) if anchors else None
        print(f"\n== {self.name}  ({self.nbytes / 2**20:.0f} MiB moved; copy {self.copy_gbps:.0f} GB/s)")
        print(f"  {'candidate':58s} {'ms':>8s} {'GB/s':>7s} {'%copy':>6s} {'vs anchor':>9s}")
        for name, kind, ms in sorted(self.rows, key=lambda r: r[2]):
            gbps = self.nbytes / ms / 1e6
            ratio = f"{ms / best_anchor:9.3f}" if best_anchor else ""
            tag = f"[{kind}] " if kind == "anchor" else ""
            print(f"  {tag + name:58s} {ms:8.4f} {gbps:7.0f} {100 * gbps / self.copy_gbps:6.1f} {ratio}")
        ours = [(ms, name) for name, kind, ms in self.rows if kind == "ours"]
        summary = {"case": self.name}
        if ours:
            ms, name = min(ours)
            summary.update(best=name, ms=round(ms, 4), pct_copy=round(100 * self.nbytes / ms / 1e6 / self.copy_gbps, 1))
            if best_anchor:
                summary["vs_best_anchor"] = round(ms / best_anchor, 3)
            print(f"  BEST {self.name}: {name}  {ms:.4f} ms" +
                  (f"  = {ms / best_anchor:.3f}x best anchor" if best_anchor else ""))
        sys.stdout.flush()
        return summary


def copy_bandwidth() -> float:
    src = torch.empty(2**27, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() * 2 / ms / 1e6


def liger_rmsnorm():
    try:
        import torch.distributed.tensor  # noqa: F401  (liger's forward checks for DTensor inputs)
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        print("liger_kernel not installed: no liger rows", flush=True)
        return None
    return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)


def liger_rope():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None

    def run(q, k, cos, sin):
        out = LigerRopeFunction.apply(q, k, cos.unsqueeze(0), sin.unsqueeze(0))
        return out[0], out[1]

    return run


def rms_inputs(m: int, n: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((m, n), generator=gen, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(n, generator=gen, device="cuda")).bfloat16()
    dy = torch.randn((m, n), generator=gen, device="cuda").bfloat16()
    return x, w, dy


def autograd_fb(fn, x, w, dy):
    xg, wg = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)

    def run():
        xg.grad = wg.grad = None
        fn(xg, wg).backward(dy)

    return run


def rms_anchors(case: Case, x, w, dy, backward: bool, compile_anchor: bool, liger) -> None:
    if compile_anchor:
        compiled = torch.compile(hf_rmsnorm, dynamic=False)
        fn = lambda a, b: compiled(a, b, EPS)  # noqa: E731
        case.time("torch.compile", "anchor", autograd_fb(fn, x, w, dy) if backward else lambda: fn(x, w))
    if liger is not None:
        case.time("liger", "anchor", autograd_fb(liger, x, w, dy) if backward else lambda: liger(x, w))
    if not backward:
        case.time("F.rms_norm", "anchor", lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS))
    ours = lambda a, b: rms_norm(a, b, EPS, impl="triton")  # noqa: E731
    case.time("default (autograd path)", "ours", autograd_fb(ours, x, w, dy) if backward else lambda: ours(x, w))


def rms_fwd_case(args, copy_gbps, liger) -> dict:
    x, w, dy = rms_inputs(32768, 4096)
    case = Case("rms-fwd 32768x4096", 2 * x.numel() * 2, copy_gbps, args.rep)
    with torch.no_grad():
        rms_anchors(case, x, w, dy, False, args.compile, liger)
        for cfg in parse_configs(args.rms_fwd):
            case.time(f"fwd {label(cfg)}", "ours", lambda cfg=cfg: _rmsnorm_fwd(x, w, None, EPS, **cfg))
    return case.report()


def composite_fb(x, w, dy, fwd_cfg: dict, bwd_cfg: dict):
    def run():
        _, _, rstd = _rmsnorm_fwd(x, w, None, EPS, **fwd_cfg)
        _rmsnorm_bwd(x, w, rstd, dy, None, **bwd_cfg)

    return run


def rms_fb_case(args, copy_gbps, liger) -> dict:
    x, w, dy = rms_inputs(32768, 4096)
    case = Case("rms-fb 32768x4096", 5 * x.numel() * 2, copy_gbps, args.rep)
    rms_anchors(case, x, w, dy, True, args.compile, liger)
    for cfg in parse_configs(args.rms_bwd):
        case.time(f"fwd default | bwd {label(cfg)}", "ours", composite_fb(x, w, dy, {}, cfg))
    return case.report()


def sweep_case(n: int, args, copy_gbps, liger) -> dict:
    x, w, dy = rms_inputs(2**27 // n, n)
    case = Case(f"sweep-n{n} fb {x.shape[0]}x{n}", 5 * x.numel() * 2, copy_gbps, args.rep)
    rms_anchors(case, x, w, dy, True, args.compile, liger)
    for fwd_cfg, bwd_cfg in parse_sweep(args.sweep):
        if not fwd_cfg and not bwd_cfg:
            continue  # the autograd default row covers it
        case.time(f"fwd {label(fwd_cfg)} | bwd {label(bwd_cfg)}", "ours", composite_fb(x, w, dy, fwd_cfg, bwd_cfg))
    summary = case.report()
    del x, w, dy
    torch.cuda.empty_cache()
    return summary


def wide_plan_stats(x, w, dy, cfg: dict) -> str:
    """Registers, spills and shared memory of the backward's main kernel for ``cfg``, and its grid."""
    from kernelbench.nn import rmsnorm

    _, _, rstd = _rmsnorm_fwd(x, w, None, EPS)
    rmsnorm._bwd_plans.clear()
    _rmsnorm_bwd(x, w, rstd, dy, None, **cfg)
    (plan,) = rmsnorm._bwd_plans.values()
    dx = torch.empty_like(x)
    partial = torch.empty((plan.partial_rows, x.shape[1]), dtype=torch.float32, device=x.device)
    args = [x, x.stride(0), w, dy, dy.stride(0), dy, 0, rstd, dx, dx.stride(0), partial, *x.shape]
    compiled = plan.main.kernel.warmup(*args, grid=(1,), **plan.main.meta)
    compiled._init_handles()
    return (f"regs {compiled.n_regs} spills {compiled.n_spills} smem {compiled.metadata.shared // 1024} KB "
            f"grid {'x'.join(map(str, plan.main.grid))}")


def wide_case(n: int, args, copy_gbps, liger) -> dict:
    x, w, dy = rms_inputs(2**27 // n, n)
    case = Case(f"wide-n{n} fb {x.shape[0]}x{n}", 5 * x.numel() * 2, copy_gbps, args.rep)
    rms_anchors(case, x, w, dy, True, args.compile, liger)  # includes the default backward
    configs = parse_configs(args.wide if args.wide else WIDE.get(n, "wide_splits=0"))
    for cfg in configs:
        try:
            stats = wide_plan_stats(x, w, dy, cfg)
        except Exception as exc:  # noqa: BLE001  (a config that does not compile is reported, not fatal)
            print(f"  {case.name}: {label(cfg)} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                  flush=True)
            continue
        case.time(f"bwd {label(cfg)}  ({stats})", "ours", composite_fb(x, w, dy, {}, cfg))
    summary = case.report()
    del x, w, dy
    torch.cuda.empty_cache()
    return summary


def rope_host_cases(args, copy_gbps) -> list[dict]:
    """apply_rotary (the default path) forward and forward+backward: device ms and host_us, with
    its launchers as shipped and with every one forced onto Triton's own launch path."""
    from kernelbench.nn import rotary

    q, k, cos, sin, dq, dk = rope_inputs()
    nbytes = 2 * (q.numel() + k.numel()) * 2
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)

    def fwd():
        with torch.no_grad():
            apply_rotary(q, k, cos, sin, impl="triton")

    def fb():
        qg.grad = kg.grad = None
        torch.autograd.backward(apply_rotary(qg, kg, cos, sin, impl="triton"), (dq, dk))

    summaries = []
    for name, fn, moved in (("fwd", fwd, nbytes), ("fwd+bwd", fb, 2 * nbytes)):
        case = Case(f"rope-host {name}", moved, copy_gbps, args.rep)
        for mode in ("cached", "triton-launch"):
            fn()
            for launcher in rotary._launchers.values():
                launcher._cacheable = mode == "cached"
            try:
                ms = do_bench(fn, warmup=10, rep=args.rep, return_mode="median")
                case.rows.append((f"apply_rotary {mode}  (host {host_us(fn, 50):.1f} us/call)", "ours", ms))
            finally:
                for launcher in rotary._launchers.values():
                    launcher._cacheable = True
        summaries.append(case.report())
    return summaries


def rope_inputs():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((8, 32, 2048, 128), generator=gen, device="cuda").bfloat16()
    k = torch.randn((8, 8, 2048, 128), generator=gen, device="cuda").bfloat16()
    cos, sin = rotary_tables(2048, 128, "cuda", torch.bfloat16)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    return q, k, cos, sin, dq, dk


def rope_launch(q, k, cos, sin, cfg: dict, backward: bool):
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _launch(q, k, q_out, k_out, cos, sin, None, 0, interleaved=False, backward=backward, copy_pass=True, **cfg)
    return q_out, k_out


def rope_cases(args, copy_gbps) -> list[dict]:
    q, k, cos, sin, dq, dk = rope_inputs()
    nbytes = 2 * (q.numel() + k.numel()) * 2
    liger = liger_rope()

    def fb(fn):
        qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)

        def run():
            qg.grad = kg.grad = None
            torch.autograd.backward(fn(qg, kg, cos, sin), (dq, dk))

        return run

    ours = lambda a, b, c, s: apply_rotary(a, b, c, s, impl="triton")  # noqa: E731
    compiled = torch.compile(hf_rotary, dynamic=False) if args.compile else None
    fwd = Case("rope-fwd 8x(32+8)x2048x128", nbytes, copy_gbps, args.rep)
    with torch.no_grad():
        if compiled is not None:
            fwd.time("torch.compile", "anchor", lambda: compiled(q, k, cos, sin))
        if liger is not None:
            fwd.time("liger", "anchor", lambda: liger(q, k, cos, sin))
        fwd.time("default (autograd path)", "ours", lambda: ours(q, k, cos, sin))
        for cfg in parse_configs(args.rope):
            if cfg:
                fwd.time(f"cfg {label(cfg)}", "ours", lambda cfg=cfg: rope_launch(q, k, cos, sin, cfg, False))
    summaries = [fwd.report()]

    fb_case = Case("rope-fb", 2 * nbytes, copy_gbps, args.rep)
    if compiled is not None:
        compiled_fb = torch.compile(hf_rotary, dynamic=False)
        fb_case.time("torch.compile", "anchor", fb(compiled_fb))
    if liger is not None:
        fb_case.time("liger", "anchor", fb(liger))
    fb_case.time("default (autograd path)", "ours", fb(ours))
    top = sorted((ms, name) for name, kind, ms in fwd.rows if kind == "ours" and name.startswith("cfg "))
    for _, name in top[: args.rope_fb_top]:
        cfg = parse_configs(name.removeprefix("cfg "))[0]

        def run(cfg=cfg):
            rope_launch(q, k, cos, sin, cfg, False)
            rope_launch(dq, dk, cos, sin, cfg, True)

        fb_case.time(f"cfg {label(cfg)} (fwd and bwd launches)", "ours", run)
    summaries.append(fb_case.report())
    return summaries


def host_us(fn, calls: int = 20) -> float:
    """Host time of one call: back-to-back calls, no synchronisation inside the loop."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def harness_cases(args, copy_gbps) -> list[dict]:
    """The harness's measurement of each registered candidate (see the module docstring)."""
    from kernelbench.harness.timing import TimingConfig, time_cuda
    from kernelbench.ops.rmsnorm import rmsnorm
    from kernelbench.ops.rotary import rotary

    config = TimingConfig(warmup_ms=10, rep_ms=args.rep)
    summaries = []
    for op, workload_name in ((rmsnorm, "32768x4096-bf16"), (rotary, "8x32x8x2048x128-bf16")):
        workload = op.workload(workload_name)
        for mode in op.modes():
            case = Case(f"harness {op.name} {workload_name} {mode}", op.bytes_moved(workload, None, mode),
                        copy_gbps, args.rep)
            for name in ("triton", "torch-compile", "liger"):
                try:
                    cand = op.get_candidate(name)
                    if cand.requires.unmet("cuda"):
                        continue
                    fcase = op.make_case(cand, workload, "cuda", mode)
                    times = time_cuda(fcase.run, fcase.prepare, config).times
                    ms = sorted(times)[len(times) // 2]

                    def call(fcase=fcase):
                        fcase.prepare()
                        fcase.run()

                    host = host_us(call)
                except Exception as exc:  # noqa: BLE001  (one candidate must not cost the rest)
                    print(f"  {case.name}: {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                          flush=True)
                    continue
                case.rows.append((f"{name}  (host {host:.0f} us/call)", "ours" if name == "triton" else "anchor", ms))
                del fcase
            summaries.append(case.report())
            torch.cuda.empty_cache()
    return summaries


def guarded(name: str, fn, *args) -> list[dict]:
    """Run one section; a failure prints and costs only that section."""
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001
        print(f"section {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        return []
    return out if isinstance(out, list) else [out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="harness,rms-fwd,rms-fb,sweep,rope",
                        help="comma list of harness, rms-fwd, rms-fb, sweep, rope, wide, rope-host")
    parser.add_argument("--sweep-n", default="256,16384,65536")
    parser.add_argument("--rms-fwd", default=RMS_FWD, help="forward configs of rms-fwd")
    parser.add_argument("--rms-bwd", default=RMS_BWD, help="backward configs of rms-fb")
    parser.add_argument("--sweep", default=SWEEP, help="fwd:...|bwd:... configs of each sweep point")
    parser.add_argument("--wide-n", default="16384,32768,65536", help="row widths of the wide case")
    parser.add_argument("--wide", default="", help="backward configs of the wide case at every N (default: WIDE)")
    parser.add_argument("--rope", default=ROPE, help="rotary configs (block_h, block_s, num_warps)")
    parser.add_argument("--rope-fb-top", type=int, default=4, help="how many of the fastest rope-fwd configs rope-fb times")
    parser.add_argument("--rep", type=int, default=30, help="do_bench rep, ms per row")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile anchors")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if hasattr(torch._dynamo.config, "recompile_limit"):  # one compiled anchor per sweep shape
        torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.cache_size_limit = 64

    start = time.time()
    copy_gbps = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"copy {copy_gbps:.0f} GB/s", flush=True)
    liger = liger_rmsnorm()
    summaries = []
    if "harness" in cases:
        summaries += guarded("harness", harness_cases, args, copy_gbps)
        print(f"  ({time.time() - start:.0f} s so far)", flush=True)
    if "rms-fwd" in cases:
        summaries += guarded("rms-fwd", rms_fwd_case, args, copy_gbps, liger)
    if "rms-fb" in cases:
        summaries += guarded("rms-fb", rms_fb_case, args, copy_gbps, liger)
    if "sweep" in cases:
        for n in map(int, args.sweep_n.split(",")):
            summaries += guarded(f"sweep-n{n}", sweep_case, n, args, copy_gbps, liger)
            print(f"  ({time.time() - start:.0f} s so far)", flush=True)
    if "rope" in cases:
        summaries += guarded("rope", rope_cases, args, copy_gbps)
    if "wide" in cases:
        for n in map(int, args.wide_n.split(",")):
            summaries += guarded(f"wide-n{n}", wide_case, n, args, copy_gbps, liger)
            print(f"  ({time.time() - start:.0f} s so far)", flush=True)
    if "rope-host" in cases:
        summaries += guarded("rope-host", rope_host_cases, args, copy_gbps)
    print(f"\nprobe_nn done in {time.time() - start:.0f} s")
    print(json.dumps({"probe_nn_best": summaries}))


if __name__ == "__main__":
    main()
