"""A training step of the Llama-style decoder (kernelbench.models.Llama) with each layer set.

Modes: ``fwd+bwd`` (logits, cross-entropy, backward) and ``train`` (the same plus one optimizer
step). Candidates differ in the layer set (RMSNorm, rotary, SwiGLU activation and loss: torch,
kernelbench, liger; see kernelbench.models.llama), in whether
the step is compiled (``torch.compile(fullgraph=True)``), and, for ``train``, in the optimizer.
Every candidate starts from the same seeded fp32 weights (cast to the workload's dtype) and sees
the same tokens, so parity compares the logits and every parameter's gradient with the torch
layers run in fp32 (fp64 on the CPU); in ``train`` mode each parity step restarts from those
weights (the optimizer's update itself is checked by the optimizer ops' parity).

Extra rows per candidate: ``tokens_per_s``; in ``train`` mode ``optimizer_ms`` (median time of
``optimizer.step()`` inside the timed steps) and ``optimizer_share`` (of the whole step).
FLOP model (fwd+bwd): 6 x matmul parameters x tokens + 6 x layers x seq x hidden x tokens for
causal attention; the optimizer's work is not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import Candidate, Op, Requires, Tolerance, Workload, torch_dtype
from .model_step import compile_step, step_tokens, tokens_per_s_row

if TYPE_CHECKING:
    import torch

MODES = ("fwd+bwd", "train")
LR = 1e-4


@dataclass(frozen=True)
class StepSpec:
    """What a candidate's factory returns: the model's layers, whether the step is compiled,
    and the optimizer of ``train`` mode."""

    layers: str
    compiled: bool = False
    optimizer: str = "torch-adamw"
    impl: str = "triton"


def _workload(name: str, tier: str, config: str, batch: int, seq: int, dtype: str, seed: int = 0,
              note: str = "") -> Workload:
    return Workload(name, tier, {"config": config, "batch": batch, "seq": seq, "dtype": dtype}, seed=seed, note=note)


def _config(workload: Workload):
    from kernelbench.models import CONFIGS

    return CONFIGS[workload.spec["config"]]


def _tokens(workload: Workload) -> int:
    return workload.spec["batch"] * workload.spec["seq"]


def _flops(workload: Workload) -> int:
    cfg = _config(workload)
    matmul_params = cfg.n_params() - cfg.vocab_size * cfg.hidden - (2 * cfg.n_layers + 1) * cfg.hidden
    if cfg.tie_embeddings:
        matmul_params += cfg.vocab_size * cfg.hidden  # the tied head is still a matmul
    tokens = _tokens(workload)
    return 6 * matmul_params * tokens + 6 * cfg.n_layers * workload.spec["seq"] * cfg.hidden * tokens


def _build_optimizer(name: str, model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    import torch

    named = list(model.named_parameters())
    params = [p for _, p in named]
    if name == "torch-adamw":
        fused = device == "cuda"
        return torch.optim.AdamW(params, lr=LR, fused=fused, foreach=None if fused else True)
    if name == "triton-adamw":
        from kernelbench.optim import TritonAdamW

        return TritonAdamW(params, lr=LR)
    if name == "adam-mini":
        from kernelbench.optim import AdamMini

        cfg = model.config
        return AdamMini(named, lr=LR, dim=cfg.hidden, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads)
    if name == "muon":
        from kernelbench.optim import Muon
        from kernelbench.optim.muon import muon_param_groups

        return Muon(muon_param_groups(named), lr=0.02, adamw_lr=LR)
    raise ValueError(f"llama-step: unknown optimizer {name!r}; known: torch-adamw, triton-adamw, adam-mini, muon")


class LlamaStepOp(Op):
    kind = "model"

    def modes(self) -> tuple[str, ...]:
        return MODES

    def make_case(self, candidate: Candidate, workload: Workload, device: str, mode: str) -> LlamaStepCase:
        return LlamaStepCase(candidate.build(), workload, device, mode)

    def make_reference_case(self, workload: Workload, device: str, mode: str) -> LlamaStepCase:
        upcast = "fp64" if device == "cpu" else "fp32"
        return LlamaStepCase(StepSpec("torch"), workload, device, "fwd+bwd", dtype=upcast)

    def flops(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        return _flops(workload)


class LlamaStepCase:
    """One model, its (compiled) step and, in train mode, its optimizer."""

    def __init__(self, spec: StepSpec, workload: Workload, device: str, mode: str,
                 dtype: str | None = None) -> None:
        from kernelbench.models import Llama

        if mode not in MODES:
            raise ValueError(f"llama-step has no mode {mode}; modes: {', '.join(MODES)}")
        self.spec, self.workload, self.device, self.mode = spec, workload, device, mode
        cfg = _config(workload)
        seq = workload.spec["seq"]
        if seq > cfg.max_seq:
            raise ValueError(f"llama-step: workload seq {seq} exceeds the config's max_seq {cfg.max_seq}")
        # Weights drawn in fp32 from the workload's seed, then cast: every candidate and the
        # reference start from the same values.
        model = Llama(cfg, spec.layers, impl=spec.impl).to(device)
        model.reset_parameters(seed=workload.seed)
        self.model = model.to(torch_dtype(dtype or workload.spec["dtype"]))
        self.step = compile_step(self._loss_and_logits, device) if spec.compiled else self._loss_and_logits
        self.optimizer = _build_optimizer(spec.optimizer, self.model, device) if mode == "train" else None
        # Parity steps restart from these weights, so logits and gradients stay comparable with
        # the reference's whatever the optimizer did (its state carries on).
        self._initial = [p.detach().clone() for p in self.model.parameters()] if self.optimizer else None
        self.optimizer_ms: list[float] = []
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # read after the timed steps
        self.logits: torch.Tensor | None = None
        self.set_step(0)

    def _loss_and_logits(self, tokens: torch.Tensor, targets: torch.Tensor):
        logits = self.model(tokens)
        return self.model.layer_set.loss(logits, targets), logits

    def set_step(self, step: int) -> None:
        import torch

        tokens = step_tokens(self.device, self.workload.seed, step, self.workload.spec["batch"],
                             self.workload.spec["seq"], self.model.config.vocab_size)
        self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if step and self._initial is not None:
            with torch.no_grad():
                for p, p0 in zip(self.model.parameters(), self._initial):
                    p.copy_(p0)

    def prepare(self) -> None:
        self.logits = None
        for p in self.model.parameters():
            p.grad = None

    def run(self) -> None:
        loss, logits = self.step(self.inputs, self.targets)
        loss.backward()
        self.logits = logits
        if self.optimizer is not None:
            self._timed_optimizer_step()

    def _timed_optimizer_step(self) -> None:
        import torch

        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.optimizer.step()
            end.record()
            self._pending.append((start, end))
        else:
            t0 = time.perf_counter()
            self.optimizer.step()
            self.optimizer_ms.append((time.perf_counter() - t0) * 1e3)

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.logits is None:
            raise RuntimeError("tensors() before run()")
        result = {"logits": self.logits.detach()}
        for name, p in self.model.named_parameters():
            if p.grad is not None:
                result[f"grad.{name}"] = p.grad
        return result

    def state_bytes(self) -> None:
        return None

    def extra_rows(self, median_ms: float) -> list[tuple[str, float, str, str]]:
        """(metric, value, unit, message) rows beside the timing: throughput, the optimizer's share."""
        rows = [tokens_per_s_row(_tokens(self.workload), median_ms)]
        if self.optimizer is None:
            return rows
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.optimizer_ms.extend(s.elapsed_time(e) for s, e in self._pending)
            self._pending = []
        if self.optimizer_ms:
            ordered = sorted(self.optimizer_ms)
            opt_ms = ordered[len(ordered) // 2]
            rows.append(("optimizer_ms", opt_ms, "ms", f"median of optimizer.step() over {len(ordered)} timed steps "
                         f"({self.spec.optimizer})"))
            rows.append(("optimizer_share", opt_ms / median_ms, "", "optimizer_ms / median step time"))
        return rows


# Logits and gradients of a whole model against fp32 (GPU) / fp64 (CPU) torch layers: errors
# compound over layers, so the bound is on the relative Frobenius norm of each tensor.
_TOLERANCES = {
    "fp32": Tolerance(0, 0, fro=1e-4, reason="whole model: relative Frobenius error per tensor"),
    "bf16": Tolerance(0, 0, fro=5e-2, reason="whole model in bf16: relative Frobenius error per tensor"),
    "fp16": Tolerance(0, 0, fro=1e-2, reason="whole model in fp16: relative Frobenius error per tensor"),
}

llama_step = LlamaStepOp(
    "llama-step",
    doc="Llama-style decoder step (fwd+bwd, or train with an optimizer) with torch / kernelbench / liger layers",
    workloads=[
        _workload("llama-tiny", "cpu", "llama-tiny", 2, 16, "fp32", seed=1),
        _workload("llama-7m", "gpu", "llama-7m", 8, 512, "bf16",
                  note="small per-GPU batch: launch overhead counts"),
        _workload("llama-1b-layer4", "gpu", "llama-1b-layer4", 4, 2048, "bf16"),
    ],
    reference="torch-eager",
    tolerances=_TOLERANCES,
    speed_anchor="torch-compile",
)


@llama_step.candidate("torch-eager", baseline=True)
def torch_eager():
    """torch.nn.RMSNorm and Hugging Face's rotary, eager."""
    return StepSpec("torch")


@llama_step.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch layers, the step under torch.compile(fullgraph=True)."""
    return StepSpec("torch", compiled=True)


@llama_step.candidate("kernelbench-eager", requires=Requires(triton=True))
def kernelbench_eager():
    """kernelbench.nn RMSNorm (fused residual add) and apply_rotary, eager."""
    return StepSpec("kernelbench")


@llama_step.candidate("kernelbench-compile", requires=Requires(triton=True))
def kernelbench_compile():
    """kernelbench layers (custom ops), the step under torch.compile(fullgraph=True)."""
    return StepSpec("kernelbench", compiled=True)


@llama_step.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True)
def liger():
    """liger-kernel's RMSNorm and rope, eager."""
    return StepSpec("liger")


def _with_optimizer(optimizer: str):
    def build():
        return StepSpec("kernelbench", compiled=True, optimizer=optimizer)

    build.__doc__ = f"kernelbench layers compiled; train mode steps {optimizer}"
    return build


# The optimizers where they are used (train mode); the layer candidates above step torch AdamW
# (fused on CUDA), the anchor.
llama_step.candidate("kernelbench-compile+triton-adamw",
                     requires=Requires(triton=True))(_with_optimizer("triton-adamw"))
llama_step.candidate("kernelbench-compile+adam-mini", requires=Requires(triton=True))(_with_optimizer("adam-mini"))
llama_step.candidate("kernelbench-compile+muon", requires=Requires(triton=True))(_with_optimizer("muon"))
