"""Before / after of kernel code in one process: kernelbench's layers, Newton-Schulz and optimizers
imported from two source trees, checked bit for bit and timed interleaved.

    git worktree add .before/BASE BASE      # the tree before the change, any commit
    python scripts/before_after.py --before .before/BASE [--after .] [--only nn ns adamw] [--rounds 3]

Each tree's ``kernelbench`` package is imported under a name of its own (``kb_before``,
``kb_after``), its custom ops renamed to match (``kb_before::rms_norm_fwd``), so both register
beside each other. Per case, on inputs both sides share:
- the check: outputs and gradients (layers), the result (Newton-Schulz), parameters and every
  state tensor after a few steps (optimizers) must be bit-identical, on a first call (which binds
  launch plans) and on a later one (bound plans, direct launches);
- the time: device time by the harness's loop (CUDA events, L2 flushed, median), the two sides
  alternated ``--rounds`` times; for launch-bound cases also the host time per call.
One JSON line per case, then a summary line; exit status 1 when any tensor differs or a case fails.
``--tiny``: small shapes, the check only; runs on the CPU in the Triton interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from common import emit, first_line, interleaved_host_us, interleaved_ms

GROUPS = {"nn": ("rmsnorm", "rotary", "swiglu", "cross-entropy"), "ns": ("newton-schulz",),
          "optim": ("adamw", "adam-mini", "adafactor", "muon")}
KINDS = tuple(kind for kinds in GROUPS.values() for kind in kinds)
_PACKAGE_NAME = re.compile(r"\bkernelbench(?=[.:])")


class _Tree(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``<root>/kernelbench`` as the package ``alias``, every ``kernelbench.`` and
    ``kernelbench::`` in its source (imports, op names) renamed to ``alias``."""

    def __init__(self, root: Path, alias: str) -> None:
        self.package, self.alias = root / "kernelbench", alias

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.alias and not fullname.startswith(self.alias + "."):
            return None
        base = self.package.joinpath(*fullname.split(".")[1:])
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(fullname, base / "__init__.py", loader=self,
                                                          submodule_search_locations=[str(base)])
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"), loader=self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        path = module.__spec__.origin
        source = _PACKAGE_NAME.sub(self.alias, Path(path).read_text())
        # Compiled under the file's own name, line for line: Triton and torch.library read the
        # kernels' and the ops' source from the file.
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)


def load_tree(root: Path, alias: str) -> Callable[[str], ModuleType]:
    """``import_module`` for the tree at ``root``: ``tree("nn")`` is its ``kernelbench.nn``."""
    if not (root / "kernelbench" / "__init__.py").is_file():
        raise SystemExit(f"before_after: {root} holds no kernelbench package (give a checkout or worktree)")
    sys.meta_path.insert(0, _Tree(root.resolve(), alias))
    return lambda name: importlib.import_module(f"{alias}.{name}")


# ------------------------------------------------------------------------------------------------
# Cases: each builds shared inputs and returns, per tree, (a call to time, a call returning tensors)
# ------------------------------------------------------------------------------------------------
def _randn(shape, gen, device, dtype=torch.bfloat16, grad=False):
    return torch.randn(shape, generator=gen, device=device).to(dtype).requires_grad_(grad)


def _layer(call: Callable, leaves: list, grads_out: Callable | None) -> tuple[Callable, Callable]:
    """(run, results) of a layer call; ``grads_out(outs)``: upstream gradients (None: no backward)."""
    def run():
        outs = call()
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        if grads_out is not None:
            for t in leaves:
                t.grad = None
            torch.autograd.backward(outs, grads_out(outs))
        return outs

    def results():
        outs = [o.detach().clone() for o in run()]
        return outs + ([t.grad.clone() for t in leaves] if grads_out is not None else [])

    return run, results


def rmsnorm_case(shape, residual, backward, device):
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    x = _randn(shape, gen, device, grad=backward)
    w = (1 + 0.1 * _randn(shape[-1:], gen, device)).requires_grad_(backward)
    r = _randn(shape, gen, device, grad=backward) if residual else None
    dys = [_randn(shape, gen, device) for _ in range(2)]
    leaves = [t for t in (x, w, r) if t is not None]
    grads = (lambda outs: dys[:len(outs)]) if backward else None
    return lambda tree: _layer(lambda: tree("nn").rms_norm(x, w, 1e-6, residual=r, impl="triton"), leaves, grads)


def rotary_case(batch, hq, hk, seq, dim, rot, style, layout, backward, device):
    gen = torch.Generator(device=device).manual_seed(seq + dim)
    shape = (lambda h: (batch, h, seq, dim)) if layout == "bhsd" else (lambda h: (batch, seq, h, dim))
    q, k = _randn(shape(hq), gen, device, grad=backward), _randn(shape(hk), gen, device, grad=backward)
    angles = torch.rand((seq + 3, rot), generator=gen, device=device) * 6.0
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    dq, dk = _randn(q.shape, gen, device), _randn(k.shape, gen, device)
    grads = (lambda outs: [dq, dk]) if backward else None
    kwargs = dict(style=style, layout=layout, position_offset=3, impl="triton")
    return lambda tree: _layer(lambda: tree("nn").apply_rotary(q, k, cos, sin, **kwargs), [q, k], grads)


def swiglu_case(shape, backward, device):
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    gate, up = _randn(shape, gen, device, grad=backward), _randn(shape, gen, device, grad=backward)
    dy = _randn(shape, gen, device)
    grads = (lambda outs: [dy]) if backward else None
    return lambda tree: _layer(lambda: tree("nn").silu_mul(gate, up, impl="triton"), [gate, up], grads)


def xent_case(rows, vocab, reduction, backward, device):
    gen = torch.Generator(device=device).manual_seed(rows + vocab)
    logits = _randn((rows, vocab), gen, device, grad=backward)
    targets = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    targets[::7] = -100  # ignored rows
    grads = (lambda outs: [torch.ones_like(outs[0])]) if backward else None
    return lambda tree: _layer(lambda: tree("nn").cross_entropy(logits, targets, reduction=reduction, impl="triton"),
                               [logits], grads)


def ns_case(shape, dtype, path, device):
    gen = torch.Generator(device=device).manual_seed(sum(shape))
    G = torch.randn(shape, generator=gen, device=device).to(dtype)

    def side(tree):
        fn = tree("newton_schulz").newton_schulz
        return (lambda: fn(G, path=path)), (lambda: [fn(G, path=path).clone()])
    return side


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so that fp8 values and NaNs compare bit for bit."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def optim_case(cls_name, shapes, kwargs, device, named=False, groups=None, steps=3):
    """Both optimizers from the same parameters, ``steps`` steps on the same gradients; results:
    every parameter and state tensor. Timed: ``step()`` with gradients set once."""
    def side(tree):
        gen = torch.Generator(device=device).manual_seed(0)
        params = [(n, torch.nn.Parameter(torch.randn(s, generator=gen, device=device) * 0.02)) for n, s in shapes]
        cls = getattr(tree("optim"), cls_name)
        if groups is not None:
            arg = groups(tree, params)
        else:
            arg = params if named else [p for _, p in params]
        opt = cls(arg, **kwargs)

        def results():
            grad_gen = torch.Generator(device=device).manual_seed(1)
            for _ in range(steps):
                for _, p in params:
                    p.grad = torch.randn(p.shape, generator=grad_gen, device=device)
                opt.step()
            out = []
            for _, p in params:
                out.append(_bytes(p).clone())
                out += [_bytes(v).clone() for _, v in sorted(opt.state[p].items()) if torch.is_tensor(v)]
            return out

        return opt.step, results
    return side


def _muon_groups(tree, params):
    return tree("optim.muon").muon_param_groups(params)


def cases(kinds, tiny: bool, device) -> Iterator[tuple[dict, Callable, bool]]:
    """(label, side factory, launch-bound) per case; built one at a time, so that only one case's
    tensors live at once."""
    modes = (False, True)
    if "rmsnorm" in kinds:
        shapes = ([((3, 40), True), ((2, 3, 24), False)] if tiny else
                  [((8, 4096), True), ((8, 4096), False), ((37, 1000), True), ((4, 5, 760), True),
                   ((32768, 4096), False), ((32768, 4096), True), ((8192, 12000), False), ((4096, 32768), True)])
        for shape, residual in shapes:
            for backward in modes:
                label = dict(kind="rmsnorm", shape="x".join(map(str, shape)), residual=residual)
                yield label | _mode(backward), rmsnorm_case(shape, residual, backward, device), shape[0] <= 8
    if "rotary" in kinds:
        shapes = ([(1, 2, 1, 5, 8, 8, "half", "bhsd"), (1, 2, 2, 3, 8, 4, "interleaved", "bshd")] if tiny else
                  [(8, 32, 8, 2048, 128, 128, "half", "bhsd"), (8, 32, 8, 1, 128, 128, "half", "bhsd"),
                   (2, 5, 1, 37, 64, 48, "interleaved", "bshd")])
        for shape in shapes:
            for backward in modes:
                label = dict(kind="rotary", shape="x".join(map(str, shape[:6])), style=shape[6], layout=shape[7])
                yield label | _mode(backward), rotary_case(*shape, backward, device), shape[3] == 1
    if "swiglu" in kinds:
        for shape in ([(4, 33)] if tiny else [(8192, 8192), (37, 1001), (8, 4096)]):
            for backward in modes:
                yield (dict(kind="swiglu", shape="x".join(map(str, shape))) | _mode(backward),
                       swiglu_case(shape, backward, device), shape[0] <= 8)
    if "cross-entropy" in kinds:
        for rows, vocab, reduction in ([(6, 50, "mean")] if tiny else
                                       [(8192, 32000, "mean"), (37, 1001, "none"), (8, 32000, "sum")]):
            for backward in modes:
                yield (dict(kind="cross-entropy", shape=f"{rows}x{vocab}", reduction=reduction) | _mode(backward),
                       xent_case(rows, vocab, reduction, backward, device), rows <= 8)
    if "newton-schulz" in kinds:
        runs = ([((40, 56), torch.bfloat16, "classic"), ((2, 33, 45), torch.float32, "classic")] if tiny else
                [(shape, torch.bfloat16, path) for shape in ((1024, 1024), (4096, 4096))
                 for path in ("auto", "classic", "hopper")]
                + [(shape, torch.bfloat16, "auto") for shape in ((8192, 8192), (4096, 1024), (96, 1024, 1024),
                                                                 (24, 1024, 4096))]
                + [((333, 517), torch.bfloat16, "classic"), ((2048, 2048), torch.float32, "auto")])
        for shape, dtype, path in runs:
            label = dict(kind="newton-schulz", shape="x".join(map(str, shape)), dtype=str(dtype)[6:], path=path)
            yield label, ns_case(shape, dtype, path, device), False
    from kernelbench.ops import optim_workloads as W

    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if "adamw" in kinds:
        for workload in ([W.MODEL_TINY] if tiny else [W.SINGLE_4096x1024, W.MODEL_370M]):
            yield (dict(kind="adamw", workload=workload.name), optim_case("TritonAdamW", workload.spec["shapes"], hp,
                                                                          device), workload is W.SINGLE_4096x1024)
    if "adam-mini" in kinds:
        workload = W.LLAMA_TINY if tiny else W.LLAMA_468M
        for state in ("fp32", "bf16", "fp8"):
            kwargs = dict(hp, **workload.spec["hyperparams"], state_dtype=state, verbose=False)
            yield (dict(kind="adam-mini", workload=workload.name, state=state),
                   optim_case("AdamMini", workload.spec["shapes"], kwargs, device, named=True), False)
    if "adafactor" in kinds:
        workload = W.MODEL_TINY if tiny else W.MODEL_370M
        yield (dict(kind="adafactor", workload=workload.name),
               optim_case("Adafactor8bit", workload.spec["shapes"], dict(lr=1e-2, weight_decay=0.01), device), False)
    if "muon" in kinds:
        workload = W.LLAMA_TINY if tiny else W.LLAMA_468M
        shapes = [(n, s) for n, s in workload.spec["shapes"] if ".layers." not in n or ".layers.0." in n
                  or ".layers.1." in n]
        yield (dict(kind="muon", workload=f"{workload.name}-2-layers"),
               optim_case("Muon", shapes, dict(lr=0.02), device, groups=_muon_groups), False)


def _mode(backward: bool) -> dict:
    return {"mode": "fwd+bwd" if backward else "fwd"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree before the change (holds kernelbench/)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1],
                        help="source tree after the change (default: this checkout)")
    parser.add_argument("--only", nargs="+", default=list(GROUPS), metavar="GROUP_OR_KIND",
                        help=f"groups ({', '.join(GROUPS)}) or kinds ({', '.join(KINDS)}); default: all")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--tiny", action="store_true", help="small shapes, the check only (CPU: Triton interpreter)")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    unknown = sorted(set(args.only) - set(GROUPS) - set(KINDS))
    if unknown:
        raise SystemExit(f"before_after: unknown {', '.join(unknown)}; known: {', '.join([*GROUPS, *KINDS])}")
    kinds = {kind for name in args.only for kind in GROUPS.get(name, (name,))}
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.tiny:
        device = torch.device("cpu")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is defined
    else:
        raise SystemExit("before_after needs a CUDA GPU (or --tiny, the check only, in the Triton interpreter)")
    trees = {"before": load_tree(args.before, "kb_before"), "after": load_tree(args.after, "kb_after")}
    out = args.out.open("a") if args.out else None

    def report(**row):
        emit(**row)
        if out is not None:
            print(json.dumps(row), file=out, flush=True)

    env = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
               before=str(args.before), after=str(args.after))
    report(start=True, **env)
    counts = dict(cases=0, differ=0, errors=0)
    for label, make, launch_bound in cases(kinds, args.tiny, device):
        counts["cases"] += 1
        try:
            sides = {name: make(tree) for name, tree in trees.items()}
            first = {name: results() for name, (_, results) in sides.items()}
            later = {name: results() for name, (_, results) in sides.items()}
            equal = all(torch.equal(a, b) for when in (first, later) for a, b in zip(when["before"], when["after"]))
            equal &= all(len(when["before"]) == len(when["after"]) for when in (first, later))
            row = dict(label, equal=equal, tensors=len(first["after"]))
            del first, later
            if not args.tiny:
                runs = {name: run for name, (run, _) in sides.items()}
                ms = interleaved_ms(runs, rounds=args.rounds)
                row.update(before_ms=ms["before"], after_ms=ms["after"], after_over_before=ms["after"] / ms["before"])
                if launch_bound:
                    us = interleaved_host_us(runs, rounds=args.rounds)
                    row.update(before_host_us=us["before"], after_host_us=us["after"],
                               host_after_over_before=us["after"] / us["before"])
        except Exception as err:  # one failing case must not lose the others
            counts["errors"] += 1
            report(**label, error=first_line(err))
            continue
        finally:
            sides = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
        counts["differ"] += not equal
        report(**row)
    report(summary=True, **counts, **env)
    return 1 if counts["differ"] or counts["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
