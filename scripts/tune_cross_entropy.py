"""Launch configurations of kernelbench.nn.cross_entropy's row kernels, timed one by one.

    python scripts/tune_cross_entropy.py [--workload llama-32k --workload llama3-128k] [--rounds 2]

For each workload of the ``cross-entropy`` op and each (block_v, num_warps, num_stages) in the
lists below, the forward (row kernel and the row reduction, "mean") and the backward kernel are
checked against the default launch's results and timed by the harness's loop (cold L2, median),
interleaved over ``--rounds``. One JSON line per (workload, direction, config) with ms and GB/s
of the op's bytes model (forward M*V*s, backward 2*M*V*s), then one line per workload and
direction naming the fastest config beside the default.
"""

from __future__ import annotations

import argparse
import functools

import torch

from common import emit, first_line, interleaved_ms, require_cuda

FWD = [(4096, 8, 1), (4096, 8, 3), (8192, 16, 1), (8192, 16, 2), (8192, 16, 3), (16384, 32, 1),
       (16384, 32, 2), (4096, 16, 3), (4096, 4, 3), (8192, 8, 3), (8192, 8, 4), (8192, 16, 4)]
BWD = [(4096, 8, 1), (4096, 8, 2), (8192, 16, 1), (8192, 16, 2), (16384, 32, 1), (2048, 4, 1)]


def main() -> None:
    # After common, which puts the checkout's kernelbench on the path.
    from kernelbench.harness.timing import TimingConfig
    from kernelbench.nn.crossentropy import host as K
    from kernelbench.ops import get_op
    from kernelbench.ops.base import generator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", help="cross-entropy workloads (default: the GPU ones)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    device = require_cuda("tune_cross_entropy")
    op = get_op("cross-entropy")
    names = args.workload or [w.name for w in op.workloads_for("gpu")]
    timing = TimingConfig(warmup_ms=10, rep_ms=40)
    for name in names:
        workload = op.workload(name)
        inputs = op.make_inputs(workload, "cuda", generator("cuda", 0))
        x2d, t1d = inputs["logits"], inputs["targets"]
        m, v = x2d.shape
        size = x2d.element_size()
        want_loss, lse, n_valid = K.forward(x2d, t1d, -100, "mean")
        grad = torch.ones((), device=device)
        want_dx = K.backward(grad, x2d, t1d, lse, n_valid, -100, "mean")
        defaults = {"fwd": K.fwd_config(v), "bwd": K.bwd_config(v)}
        for direction, configs, nbytes in (("fwd", FWD, m * v * size), ("bwd", BWD, 2 * m * v * size)):
            cases = {}
            for block_v, warps, stages in configs:
                cfg = K.XentConfig(block_v, warps, stages)
                if direction == "fwd":
                    run = functools.partial(K.forward, x2d, t1d, -100, "mean", config=cfg)
                else:
                    run = functools.partial(K.backward, grad, x2d, t1d, lse, n_valid, -100, "mean", config=cfg)
                try:
                    got = run()[0] if direction == "fwd" else run()
                    want = want_loss if direction == "fwd" else want_dx
                    torch.testing.assert_close(got, want, rtol=1e-5 if direction == "fwd" else 1e-2, atol=0)
                except Exception as exc:  # a config that fails to compile or disagrees is reported, not timed
                    emit(workload=name, direction=direction, config=[block_v, warps, stages], error=first_line(exc))
                    continue
                cases[cfg] = run
            times = interleaved_ms({str(c): fn for c, fn in cases.items()}, rounds=args.rounds, config=timing)
            for cfg in cases:
                ms = times[str(cfg)]
                emit(workload=name, direction=direction, config=[cfg.block_v, cfg.num_warps, cfg.num_stages],
                     ms=round(ms, 4), gb_s=round(nbytes / ms / 1e6, 1), default=cfg == defaults[direction])
            best = min(cases, key=lambda c: times[str(c)])
            default_ms = times.get(str(defaults[direction]))
            emit(workload=name, direction=direction, best=[best.block_v, best.num_warps, best.num_stages],
                 best_ms=round(times[str(best)], 4),
                 default_ms=round(default_ms, 4) if default_ms is not None else None)


if __name__ == "__main__":
    main()
