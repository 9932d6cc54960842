"""Newton-Schulz from two packages (e.g. before and after a refactor), timed interleaved in one
process and checked bit for bit.

    python scripts/probes/ns_before_after.py kernelbench._before_newton_schulz kernelbench.newton_schulz

For each shape and path (auto, classic, hopper): both ``newton_schulz`` functions run on the same
bf16 input and their outputs must be equal (``torch.equal``); then both are timed by the harness's
loop (CUDA events, median, L2 flushed), alternated ``--rounds`` times. One JSON line per result;
the exit status is 1 when any output differs.
"""

from __future__ import annotations

import argparse
import importlib

import torch

from common import emit, first_line, interleaved_ms, require_cuda

# The CI suite's Newton-Schulz shapes and Muon's batched llama-468m calls.
SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (4096, 1024), (2048, 512),
          (96, 1024, 1024), (24, 1024, 4096)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="package (or module) with newton_schulz, e.g. kernelbench._before_newton_schulz")
    parser.add_argument("after", help="package (or module) with newton_schulz, e.g. kernelbench.newton_schulz")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    args = parser.parse_args()
    device = require_cuda("ns_before_after")
    functions = {label: importlib.import_module(name).newton_schulz
                 for label, name in (("before", args.before), ("after", args.after))}
    differ = False
    for shape in SHAPES:
        gen = torch.Generator(device=device).manual_seed(sum(shape))
        G = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
        for path in ("auto", "classic", "hopper"):
            label = dict(shape="x".join(map(str, shape)), path=path)
            try:
                outs = {k: fn(G, path=path) for k, fn in functions.items()}
            except Exception as err:  # a path this GPU or shape cannot take: say so, go on
                emit(**label, error=first_line(err))
                continue
            equal = torch.equal(outs["before"], outs["after"])
            differ |= not equal
            cases = {k: (lambda fn=fn, G=G, path=path: fn(G, path=path)) for k, fn in functions.items()}
            ms = interleaved_ms(cases, rounds=args.rounds)
            emit(**label, equal=equal, before_ms=ms["before"], after_ms=ms["after"],
                 after_over_before=ms["after"] / ms["before"], gpu=torch.cuda.get_device_name(device))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
