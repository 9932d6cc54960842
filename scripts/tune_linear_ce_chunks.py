"""Chunk lengths of kernelbench.nn.linear_cross_entropy, timed against torch.compile of the plain loss.

    python scripts/tune_linear_ce_chunks.py [--shape 4096x4096x128256 ...] [--chunks 1024 2048 4096 8192]
        [--rounds 3]

For each N x H x V (default: the ``linear-cross-entropy`` op's GPU workloads, bf16) the forward and
backward of the loss (gradients for hidden and weight) at each chunk length below N, at N (one
chunk) and at the default plan (``plan_chunk_rows``), and as ``torch.compile`` of the plain loss,
timed by the harness's loop (cold L2, median), interleaved over ``--rounds``. One JSON line per
(shape, variant) with ms, the ratio to the compiled plain loss, and the peak memory above the
inputs. Each extra chunk re-reads dW (V x H) in its accumulating GEMM, so the best length grows
with H; the logits buffer grows with it.
"""

from __future__ import annotations

import argparse
import math

import torch

from common import emit, interleaved_ms, require_cuda


def main() -> None:
    from kernelbench.harness.timing import TimingConfig
    from kernelbench.ops import get_op

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="NxHxV (default: the op's GPU workloads)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=300.0)
    args = parser.parse_args()
    device = require_cuda("tune_linear_ce_chunks")
    shapes = ([tuple(int(d) for d in s.split("x")) for s in args.shape] if args.shape else
              [w.spec["shape"] for w in get_op("linear-cross-entropy").workloads_for("gpu")])
    config = TimingConfig(rep_ms=args.rep_ms / args.rounds, warmup_ms=25.0)
    gen = torch.Generator(device=device).manual_seed(0)
    for n, h, v in shapes:
        time_shape(n, h, v, args.chunks, args.rounds, config, gen, device)
        torch.cuda.empty_cache()


def time_shape(n: int, h: int, v: int, chunks: list[int], rounds: int, config, gen, device) -> None:
    """One JSON line per variant of one N x H x V."""
    from kernelbench.harness.memory import peak_memory_delta
    from kernelbench.nn.linear_crossentropy import linear_cross_entropy, linear_cross_entropy_ref, plan_chunk_rows

    hidden = torch.randn((n, h), generator=gen, device=device).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn((v, h), generator=gen, device=device) * (2 / math.sqrt(h))).to(torch.bfloat16)
    weight.requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen, device=device)
    default_rows = plan_chunk_rows(n, h, v, 2)
    compiled = torch.compile(linear_cross_entropy_ref)

    def step(loss_fn):
        def run() -> None:
            hidden.grad = weight.grad = None
            loss_fn().backward()
        return run

    cases = {"torch-compile": step(lambda: compiled(hidden, weight, targets))}
    for rows in sorted({*(c for c in chunks if c < n), n, default_rows}):
        cases[f"chunk-{rows}"] = step(lambda rows=rows: linear_cross_entropy(hidden, weight, targets,
                                                                            chunk_rows=rows))
    peaks = {}
    for name, fn in cases.items():
        fn()  # compiled, launchers bound: the peak is a step's own
        peaks[name] = peak_memory_delta(fn)
    ms = interleaved_ms(cases, rounds, config)
    anchor = ms["torch-compile"]
    for name, value in ms.items():
        emit(shape=f"{n}x{h}x{v}", variant=name, default=name == f"chunk-{default_rows}", ms=round(value, 4),
             ratio_vs_compile=round(value / anchor, 4), peak_mb=round(peaks[name] / 1e6, 1))


if __name__ == "__main__":
    main()
