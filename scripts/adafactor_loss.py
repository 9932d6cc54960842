"""Training loss of a small MLP under four Adafactor implementations, side by side.

    python scripts/adafactor_loss.py --steps 300 --out results/adafactor_loss.csv

Optimizers (same model init, same synthetic data stream, same hyperparameters): kernelbench's
Adafactor8bit with 8-bit state (``triton-8bit``) and fp32 state (``triton-fp32``), the pure-PyTorch
reference (``torch-ref``), and adafactor8bit 0.4.6 (``adafactor8bit``, when installed; it needs
CUDA). The task: a student MLP (128 -> 512 -> 512 -> 16, LayerNorm, biases) learns the argmax
labels of a fixed random teacher MLP; every weight matrix is above min_8bit_size, so the 8-bit
paths are in use. Writes one CSV row per (optimizer, step) and prints losses at a few steps.
Without CUDA the Triton kernels run in the (slow) interpreter: use a few steps only.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernelbench's kernels are defined

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HYPER = dict(lr=1e-2, beta1=None, beta2=None, decay_rate=-0.8, eps=(1e-30, 1e-3), clip_threshold=1.0,
             weight_decay=0.01, relative_step=True, scale_parameter=True)
D_IN, HIDDEN, CLASSES, BATCH = 128, 512, 16, 256


def student(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    ).to(device)


def teacher(device: str):
    gen = torch.Generator(device=device).manual_seed(1)
    w1 = torch.randn(D_IN, 256, generator=gen, device=device) / D_IN ** 0.5
    w2 = torch.randn(256, CLASSES, generator=gen, device=device) / 16.0
    return lambda x: (torch.tanh(x @ w1) @ w2).argmax(dim=-1)


def build(name: str, model: torch.nn.Module):
    params = list(model.named_parameters())
    if name == "triton-8bit":
        from kernelbench.optim.adafactor import Adafactor8bit
        return Adafactor8bit(params, quantize=True, **HYPER)
    if name == "triton-fp32":
        from kernelbench.optim.adafactor import Adafactor8bit
        return Adafactor8bit(params, quantize=False, **HYPER)
    if name == "torch-ref":
        from kernelbench.optim.adafactor_ref import AdafactorRef
        return AdafactorRef([p for _, p in params], **HYPER)
    if name == "adafactor8bit":
        from adafactor8bit import Adafactor8Bit
        h = dict(HYPER)
        return Adafactor8Bit([p for _, p in params], lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
                             beta2_decay=h["decay_rate"], eps=h["eps"], weight_decay=h["weight_decay"],
                             d=h["clip_threshold"], relative_step=h["relative_step"],
                             scale_parameter=h["scale_parameter"], scale_weight_decay=False, quantize=True)
    raise ValueError(f"unknown optimizer '{name}'")


def train(name: str, steps: int, device: str) -> list[float]:
    model = student(device)
    opt = build(name, model)
    label = teacher(device)
    gen = torch.Generator(device=device).manual_seed(2)
    losses = []
    for _ in range(steps):
        x = torch.randn(BATCH, D_IN, generator=gen, device=device)
        loss = torch.nn.functional.cross_entropy(model(x), label(x))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("results/adafactor_loss.csv"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    names = ["torch-ref", "triton-fp32", "triton-8bit"]
    if args.device == "cuda":
        try:
            import adafactor8bit  # noqa: F401
            names.append("adafactor8bit")
        except ImportError:
            print("adafactor8bit not installed: its column is left out")
    curves = {}
    for name in names:
        start = time.perf_counter()
        curves[name] = train(name, args.steps, args.device)
        print(f"{name}: {args.steps} steps in {time.perf_counter() - start:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *names])
        for step in range(args.steps):
            writer.writerow([step + 1, *(f"{curves[n][step]:.6f}" for n in names)])
    marks = sorted({1, 10, 50, 100, 200, args.steps} & set(range(1, args.steps + 1)))
    print("step   " + "  ".join(f"{n:>13}" for n in names))
    for step in marks:
        print(f"{step:<6} " + "  ".join(f"{curves[n][step - 1]:13.4f}" for n in names))
    tail = min(20, args.steps)
    print(f"mean of the last {tail} " + "  ".join(f"{sum(curves[n][-tail:]) / tail:13.4f}" for n in names))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
