"""RMSNorm bf16 forward at wide rows (M * N = 2^27): does loading the weight together with x
(EARLY_WEIGHT) close the gap to torch.compile at N = 32768? Also at 8192 and 16384, to see whether
it should apply there too. One JSON line per row: do_bench median (L2 flushed), % of the copy
rate measured here, ratio to the best anchor (torch.compile, liger, F.rms_norm), and for the
early-weight rows whether the output equals the default's bit for bit. ~40 s on an H200.

    python scripts/probe_rms_fwd.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernelbench.harness.ceilings import measure_ceilings
from kernelbench.nn.rmsnorm import _rmsnorm_fwd
from kernelbench.ops.rmsnorm import rmsnorm_ref

EPS = 1e-6


def main() -> None:
    copy = measure_ceilings().copy_gbps
    try:
        import torch.distributed.tensor  # noqa: F401  (liger's forward checks for DTensor inputs)
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        liger = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)  # noqa: E731
    except ImportError:
        liger = None
    print(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": round(copy)}), flush=True)
    for n in (8192, 16384, 32768, 65536):
        m = 2**27 // n
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, generator=gen, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, generator=gen, device="cuda")).bfloat16()
        compiled = torch.compile(rmsnorm_ref, dynamic=False)
        anchors = {"torch.compile": lambda: compiled(x, w, EPS), "F.rms_norm": lambda: F.rms_norm(x, (n,), w, EPS)}
        if liger is not None:
            anchors["liger"] = lambda: liger(x, w)
        ours = {"default": {}, "early_weight=1": {"early_weight": True}, "early_weight=0": {"early_weight": False}}
        times = {}
        with torch.no_grad():
            for name, fn in anchors.items():
                times[name] = do_bench(fn, warmup=25, rep=100, return_mode="median")
            outputs = {}
            for name, cfg in ours.items():
                outputs[name] = _rmsnorm_fwd(x, w, None, EPS, **cfg)[0]
                times[name] = do_bench(lambda cfg=cfg: _rmsnorm_fwd(x, w, None, EPS, **cfg), warmup=25, rep=100,
                                       return_mode="median")
        best_anchor = min(times[a] for a in anchors)
        for name, ms in sorted(times.items(), key=lambda kv: kv[1]):
            row = {"n": n, "row": name, "ms": round(ms, 4), "pct_copy": round(100 * 4 * m * n / ms / 1e6 / copy, 1),
                   "vs_best_anchor": round(ms / best_anchor, 3)}
            if name in ours:
                row["equal_to_default"] = bool(torch.equal(outputs[name], outputs["default"]))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
