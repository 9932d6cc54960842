"""Ops that are optimizer steps (AdamW, Adam-mini, Adafactor, Muon).

A workload's ``spec["shapes"]`` lists ``(name, shape)`` of fp32 parameters; ``spec`` may add
``"hyperparams"`` (model geometry an optimizer needs, e.g. Adam-mini's ``dim`` and ``n_heads``).
Candidate factories take the named parameters and keyword hyperparameters and return the
optimizer:

    @adamw.candidate("torch-fused", requires=Requires(cuda=True), baseline=True)
    def torch_fused(named_params, *, lr, betas, eps, weight_decay):
        return torch.optim.AdamW([p for _, p in named_params], lr=lr, ..., fused=True)

Mode ``clipped-step`` (ops declared with ``clip_max_norm``): every candidate clips the gradients to
that total norm and steps. A factory with a ``max_grad_norm`` parameter gets it and clips inside its
step; any other is preceded by ``torch.nn.utils.clip_grad_norm_(params, clip_max_norm, foreach=True)``
(which scales ``p.grad`` in place), the way a training loop clips for torch's optimizers.

Parameters are drawn from the workload's seed; gradient ``step`` from (seed, step), so every
candidate and the reference see the same parameters and the same gradient stream. Besides its
named workloads, an optimizer op takes ``-w model:NAME`` and ``-w FILE`` (a parameter-shape list,
see :mod:`kernelbench.ops.shapes`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Candidate, Op, RegistrationError, StateBytes, Tolerance, Workload, generator, torch_dtype
from .shapes import PARAMS_HELP, param_workload

if TYPE_CHECKING:
    import torch


def workload_numel(workload: Workload) -> int:
    return sum(math.prod(shape) for _, shape in workload.spec["shapes"])


def make_named_params(workload: Workload, device: str, gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    import torch

    dtype = torch_dtype(workload.spec.get("dtype", "fp32"))
    params = []
    for name, shape in workload.spec["shapes"]:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02
        params.append((name, t.to(dtype)))
    return params


class OptimizerOp(Op):
    kind = "optimizer"

    def __init__(
        self,
        name: str,
        *,
        doc: str,
        workloads: Sequence[Workload],
        reference: str,
        hyperparams: Mapping[str, Any],
        bytes_per_param: Callable[[Candidate], int] | None = None,
        tolerances: Mapping[Any, Tolerance] | None = None,
        tag_values: Mapping[str, Sequence[str]] | None = None,
        speed_anchor: str | None = None,
        tensor_tolerances: Mapping[str, Mapping[Any, Tolerance]] | None = None,
        grad_scale: float = 1.0,
        clip_max_norm: float | None = None,
    ) -> None:
        if not isinstance(reference, str):
            raise RegistrationError(f"op {name}: reference names the candidate the others are checked against "
                                    f"(a string), got {type(reference).__name__}")
        super().__init__(
            name, doc=doc, workloads=workloads, reference=reference,
            tolerances=tolerances, tag_values=tag_values, speed_anchor=speed_anchor,
            tensor_tolerances=tensor_tolerances,
        )
        self.hyperparams = dict(hyperparams)
        self._bytes_per_param = bytes_per_param
        self.grad_scale = grad_scale
        # The total norm of mode clipped-step; gradients are standard normal, so any norm below
        # sqrt(numel) clips at every step.
        self.clip_max_norm = clip_max_norm

    def custom_workload(self, text: str) -> Workload | None:
        return param_workload(self.name, text)

    def workload_forms(self) -> str | None:
        return PARAMS_HELP

    def hyperparams_for(self, workload: Workload) -> dict[str, Any]:
        return {**self.hyperparams, **workload.spec.get("hyperparams", {})}

    def modes(self) -> tuple[str, ...]:
        return ("step",) if self.clip_max_norm is None else ("step", "clipped-step")

    def default_modes(self) -> tuple[str, ...]:
        # clipped-step is asked for (-m clipped-step, a suite's modes): a plain run stays the step alone.
        return ("step",)

    def make_case(self, candidate: Candidate, workload: Workload, device: str, mode: str = "step") -> OptimizerCase:
        if mode not in self.modes():
            raise ValueError(f"op {self.name} has no mode {mode}; modes: {', '.join(self.modes())}")
        clip = self.clip_max_norm if mode == "clipped-step" else None
        return OptimizerCase(self, candidate.build, workload, device, clip_max_norm=clip)

    def make_reference_case(self, workload: Workload, device: str, mode: str = "step") -> OptimizerCase:
        return self.make_case(self.get_candidate(self.reference), workload, device, mode)

    def bytes_moved(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        if self._bytes_per_param is None:
            return None
        per_param = self._bytes_per_param(candidate)
        if per_param is None:
            return None
        # A clipped step must read every gradient once more, for the norm, before the update.
        return (per_param + (4 if mode == "clipped-step" else 0)) * workload_numel(workload)


class OptimizerCase:
    def __init__(
        self, op: OptimizerOp, build: Callable[..., torch.optim.Optimizer], workload: Workload, device: str,
        clip_max_norm: float | None = None,
    ) -> None:
        import torch

        self.op, self.workload, self.device = op, workload, device
        gen = generator(device, workload.seed)
        self.named_params = [(name, torch.nn.Parameter(t)) for name, t in make_named_params(workload, device, gen)]
        self.set_step(0)
        if device == "cuda":
            torch.cuda.synchronize()
        self._allocated_before = torch.cuda.memory_allocated() if device == "cuda" else 0
        hyperparams = op.hyperparams_for(workload)
        # Clipping inside the step when the factory takes max_grad_norm, clip_grad_norm_ before it otherwise.
        self.clip_before_step = None
        if clip_max_norm is not None:
            if "max_grad_norm" in inspect.signature(build).parameters:
                hyperparams["max_grad_norm"] = clip_max_norm
            else:
                self.clip_before_step = clip_max_norm
        self._clip_params = [p for _, p in self.named_params]
        # foreach=True, torch's choice on CUDA; elsewhere torch picks (older CPU builds lack it).
        self._clip_foreach = True if device == "cuda" else None
        self.optimizer = build(self.named_params, **hyperparams)

    def set_step(self, step: int) -> None:
        import torch

        gen = generator(self.device, self.workload.seed * 7919 + step + 1)
        for _, p in self.named_params:
            g = torch.randn(p.shape, generator=gen, device=self.device, dtype=torch.float32)
            p.grad = (g * self.op.grad_scale).to(p.dtype)

    def prepare(self) -> None:
        pass  # gradients stay in place between steps; only step() is timed

    def run(self) -> None:
        if self.clip_before_step is not None:
            import torch

            torch.nn.utils.clip_grad_norm_(self._clip_params, self.clip_before_step, foreach=self._clip_foreach)
        self.optimizer.step()

    def tensors(self) -> dict[str, torch.Tensor]:
        import torch

        result: dict[str, torch.Tensor] = {}
        for name, p in self.named_params:
            result[name] = p.detach()
            for key, value in self.optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    result[f"{name}.{key}"] = value
        return result

    def state_bytes(self) -> StateBytes:
        """On CUDA: memory the optimizer holds (allocated now minus before it was built). Call it
        after the first step and before anything else is allocated (the runner does so right
        after building the case). Elsewhere, or when that figure is negative (the optimizer freed
        memory it did not allocate), the bytes of the tensors in its state."""
        tensor_bytes = self._state_tensor_bytes()
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - self._allocated_before
            if held >= 0:
                return StateBytes(held, "allocated after the first step minus before construction")
            return StateBytes(
                tensor_bytes,
                f"allocator delta was negative ({held} B: the optimizer freed "
                "memory allocated before it); bytes of the tensors in optimizer.state instead",
                trusted=False,
            )
        return StateBytes(tensor_bytes, "bytes of the tensors in optimizer.state")

    def _state_tensor_bytes(self) -> int:
        import torch

        seen: set[int] = set()
        total = 0
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
                    seen.add(value.data_ptr())
                    total += value.numel() * value.element_size()
        return total

    def telemetry(self) -> dict | None:
        """The optimizer's own telemetry, when it offers one (kernelbench's AdamMini does)."""
        report = getattr(self.optimizer, "telemetry", None)
        return report() if callable(report) else None
