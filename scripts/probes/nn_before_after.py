"""RMSNorm and rotary from two versions of their modules (e.g. before and after a refactor),
checked bit for bit and timed interleaved in one process.

    git show REV:kernelbench/nn/rmsnorm.py > kernelbench/nn/_before_rmsnorm.py
    git show REV:kernelbench/nn/rotary.py > kernelbench/nn/_before_rotary.py
    python scripts/probes/nn_before_after.py [--rounds 3] [--tiny]

The "before" files are loaded with their custom ops renamed (``kernelbench_before::``), so they
register beside the current ones. For every case (RMSNorm bf16 (32768, 4096) and the sweep
N in {1024, 8192, 32768, 65536} at M x N = 2^27, with and without a residual; rotary q
(8, 32, 2048, 128), k (8, 8, 2048, 128)) and mode (fwd, fwd+bwd): outputs and gradients must be
``torch.equal``, then both sides are timed by the harness's loop, alternated ``--rounds`` times.
One JSON line per result; exit status 1 when any tensor differs. ``--tiny``: small shapes, the
check only (runs on the CPU in the Triton interpreter).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from common import emit, interleaved_ms, require_cuda

NN = Path(__file__).resolve().parents[2] / "kernelbench" / "nn"


def load_before(name: str) -> ModuleType:
    """kernelbench/nn/_before_<name>.py as kernelbench.nn._before_<name>, its ops renamed."""
    path = NN / f"_before_{name}.py"
    if not path.exists():
        raise SystemExit(f"nn_before_after: {path} is missing; write it with "
                         f"git show REV:kernelbench/nn/{name}.py > {path}")
    source = path.read_text().replace("kernelbench::", "kernelbench_before::").replace(
        "torch.ops.kernelbench.", "torch.ops.kernelbench_before.")
    module_name = f"kernelbench.nn._before_{name}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__, module.__package__ = str(path), "kernelbench.nn"
    sys.modules[module_name] = module
    # The same line numbers as the file: Triton reads each kernel's source from it.
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def rmsnorm_case(fn: Callable, m: int, n: int, residual: bool, backward: bool, device) -> tuple[Callable, Callable]:
    """(a call to time, a call returning every output and gradient) for rms_norm ``fn``."""
    gen = torch.Generator(device=device).manual_seed(m + n)
    x = torch.randn(m, n, generator=gen, device=device).bfloat16().requires_grad_(backward)
    w = (1 + 0.1 * torch.randn(n, generator=gen, device=device)).bfloat16().requires_grad_(backward)
    r = torch.randn(m, n, generator=gen, device=device).bfloat16().requires_grad_(backward) if residual else None
    dy = torch.randn(m, n, generator=gen, device=device).bfloat16()
    dh = torch.randn(m, n, generator=gen, device=device).bfloat16() if residual else None
    leaves = [t for t in (x, w, r) if t is not None]

    def run() -> list[torch.Tensor]:
        out = fn(x, w, 1e-6, residual=r, impl="triton")
        outs = list(out) if isinstance(out, tuple) else [out]
        if backward:
            for t in leaves:
                t.grad = None
            torch.autograd.backward(outs, [dy, dh][: len(outs)])
        return outs

    def results() -> list[torch.Tensor]:
        outs = [o.detach() for o in run()]
        return outs + ([t.grad for t in leaves] if backward else [])

    return run, results


def rotary_case(fn: Callable, shape: tuple, backward: bool, device) -> tuple[Callable, Callable]:
    batch, hq, hk, seq, dim = shape
    gen = torch.Generator(device=device).manual_seed(seq)
    q = torch.randn(batch, hq, seq, dim, generator=gen, device=device).bfloat16().requires_grad_(backward)
    k = torch.randn(batch, hk, seq, dim, generator=gen, device=device).bfloat16().requires_grad_(backward)
    angles = torch.rand(seq, dim, generator=gen, device=device) * 6.0
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    dq = torch.randn(q.shape, generator=gen, device=device).bfloat16()
    dk = torch.randn(k.shape, generator=gen, device=device).bfloat16()

    def run() -> list[torch.Tensor]:
        outs = list(fn(q, k, cos, sin, impl="triton"))
        if backward:
            q.grad = k.grad = None
            torch.autograd.backward(outs, [dq, dk])
        return outs

    def results() -> list[torch.Tensor]:
        outs = [o.detach() for o in run()]
        return outs + ([q.grad, k.grad] if backward else [])

    return run, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--tiny", action="store_true", help="small shapes, bit check only (CPU interpreter)")
    args = parser.parse_args()
    if args.tiny:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("nn_before_after --tiny on the CPU needs TRITON_INTERPRET=1")
        norm_shapes = [(6, 40), (3, 5000), (2, 9000), (2, 20000)]
        rotary_shapes = [(1, 4, 2, 8, 16)]
    else:
        device = require_cuda("nn_before_after")
        norm_shapes = [(32768, 4096)] + [(2**27 // n, n) for n in (1024, 8192, 32768, 65536)]
        rotary_shapes = [(8, 32, 8, 2048, 128)]

    from kernelbench.nn import rmsnorm, rotary

    before = {"rmsnorm": load_before("rmsnorm").rms_norm, "rotary": load_before("rotary").apply_rotary}
    after = {"rmsnorm": rmsnorm.rms_norm, "rotary": rotary.apply_rotary}
    def cases():
        """(label, {side: (run, results)}), built one at a time: the large shapes' tensors of
        every case at once would not fit in GPU memory."""
        sides = (("before", before), ("after", after))
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            for m, n in norm_shapes:
                for residual in (False, True):
                    label = dict(op="rmsnorm", shape=f"{m}x{n}", residual=residual, mode=mode)
                    yield label, {side: rmsnorm_case(fns["rmsnorm"], m, n, residual, backward, device)
                                  for side, fns in sides}
            for shape in rotary_shapes:
                yield (dict(op="rotary", shape="x".join(map(str, shape)), mode=mode),
                       {side: rotary_case(fns["rotary"], shape, backward, device) for side, fns in sides})

    failed = False
    for label, case in cases():
        got = {side: results() for side, (_, results) in case.items()}
        equal = [torch.equal(a, b) for a, b in zip(got["before"], got["after"])]
        failed |= not all(equal)
        row = dict(**label, check="bit-identical outputs and grads", equal=all(equal), tensors=len(equal))
        del got
        if args.tiny:
            emit(**row)
            continue
        times = interleaved_ms({side: run for side, (run, _) in case.items()}, rounds=args.rounds)
        emit(**row, before_ms=times["before"], after_ms=times["after"],
             after_over_before=times["after"] / times["before"], gpu=torch.cuda.get_device_name(device))
        del case
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
