"""Ops that are functions of tensors (RMSNorm, rotary, Newton-Schulz), forward and backward.

Candidate factories take no argument and return the callable to time; it is called with the op's
inputs as keyword arguments and returns a tensor or a tuple of tensors (named by ``outputs``):

    @rmsnorm.candidate("torch-compile")
    def torch_compile():
        return compile_anchor(rmsnorm_ref_hf)

An op that declares its dimensions (``dims=Dims(...)``) also takes workloads written as shapes
(``-w 16384x4096:bf16``) and sweeps (``--sweep N=256..65536``). A candidate must leave its inputs
as they were, except those the op names in ``inplace`` (outputs written into an input, such as a
loss's gradient written into its logits); parity and timing check it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Candidate, Op, RegistrationError, Tolerance, UsageError, Workload, generator
from .shapes import Dims, is_shape_text, shape_workload, sweep_texts

if TYPE_CHECKING:
    import torch

MODES = ("fwd", "fwd+bwd")


class FunctionOp(Op):
    kind = "function"

    def __init__(
        self,
        name: str,
        *,
        doc: str,
        workloads: Sequence[Workload],
        make_inputs: Callable[[Workload, str, torch.Generator], dict[str, Any]],
        reference: Callable[..., Any],
        outputs: Sequence[str],
        grad_inputs: Sequence[str] = (),
        modes: Sequence[str] = ("fwd",),
        bytes_moved: Callable[[Workload, str], int] | None = None,
        flops: Callable[[Workload, str], int] | None = None,
        tolerances: Mapping[Any, Tolerance] | None = None,
        tag_values: Mapping[str, Sequence[str]] | None = None,
        speed_anchor: str | None = None,
        tensor_tolerances: Mapping[str, Mapping[Any, Tolerance]] | None = None,
        model_layer: str | None = None,
        dims: Dims | None = None,
        inplace: Sequence[str] = (),
    ) -> None:
        unknown = set(modes) - set(MODES)
        if unknown:
            raise RegistrationError(f"op {name}: unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
        for what, value in (("make_inputs", make_inputs), ("reference", reference)):
            if not callable(value):
                raise RegistrationError(f"op {name}: {what} must be callable, got {type(value).__name__}")
        if isinstance(outputs, str) or not outputs:
            raise RegistrationError(f"op {name}: outputs names the results, e.g. outputs=('y',); got {outputs!r}")
        if dims is not None and not isinstance(dims, Dims):
            raise RegistrationError(f"op {name}: dims takes Dims(...), got {type(dims).__name__}")
        super().__init__(
            name, doc=doc, workloads=workloads, reference=reference,
            tolerances=tolerances, tag_values=tag_values, speed_anchor=speed_anchor,
            tensor_tolerances=tensor_tolerances, model_layer=model_layer,
        )
        self.make_inputs = make_inputs
        self.output_names = tuple(outputs)
        self.grad_inputs = tuple(grad_inputs)
        self._modes = tuple(modes)
        self._bytes_moved = bytes_moved
        self._flops = flops
        self.dims = dims
        self.inplace = frozenset(inplace)

    def custom_workload(self, text: str) -> Workload | None:
        if not is_shape_text(text):
            return None
        if self.dims is None:
            raise UsageError(f"-w {text}: op '{self.name}' declares no dimensions, so it takes named workloads "
                             f"only: {', '.join(self.workloads)}")
        return shape_workload(self.name, self.dims, text)

    def workload_forms(self) -> str | None:
        return f"a shape {self.dims.describe()}" if self.dims is not None else None

    def sweep(self, sweep: str, base: str | None, tier: str) -> list[str]:
        if self.dims is None:
            return super().sweep(sweep, base, tier)
        return sweep_texts(self.name, self.dims, sweep,
                           base or (self.dims.small if tier == "cpu" else self.dims.example))

    def modes(self) -> tuple[str, ...]:
        return self._modes

    def make_case(self, candidate: Candidate, workload: Workload, device: str, mode: str) -> FunctionCase:
        fn = candidate.build()
        if not callable(fn):
            raise RegistrationError(f"{self.name}/{candidate.name}: its factory returned {type(fn).__name__}, "
                                    "not the function to time")
        return FunctionCase(self, fn, workload, device, mode, candidate.mutates_inputs)

    def make_reference_case(self, workload: Workload, device: str, mode: str) -> FunctionCase:
        import torch

        # Higher precision where the device allows it: fp64 on the CPU, fp32 on the GPU.
        upcast = torch.float64 if device == "cpu" else torch.float32
        return FunctionCase(self, self.reference, workload, device, mode, mutates=False, upcast=upcast)

    def bytes_moved(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        return self._bytes_moved(workload, mode) if self._bytes_moved else None

    def flops(self, workload: Workload, candidate: Candidate, mode: str) -> int | None:
        return self._flops(workload, mode) if self._flops else None


class FunctionCase:
    """Inputs drawn from the workload's seed (plus the parity step), the callable, its results.

    ``pure``: a call depends on nothing but this step's inputs, so the harness may draw fresh
    inputs each timing round and check the timed output against the reference's."""

    pure = True

    def __init__(
        self,
        op: FunctionOp,
        fn: Callable[..., Any],
        workload: Workload,
        device: str,
        mode: str,
        mutates: bool,
        upcast: torch.dtype | None = None,
    ) -> None:
        if mode not in op.modes():
            raise ValueError(f"op {op.name} has no mode {mode}; modes: {op.modes()}")
        self.op, self.fn, self.workload, self.device, self.mode = op, fn, workload, device, mode
        self.mutates, self.upcast = mutates, upcast
        self.backward = mode == "fwd+bwd"
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.set_step(0)

    def set_step(self, step: int) -> None:
        import torch

        gen = generator(self.device, self.workload.seed * 1_000_003 + step)
        inputs = self.op.make_inputs(self.workload, self.device, gen)
        self.input_dtypes = {k: v.dtype for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        if self.upcast is not None:
            inputs = {k: _upcast(v, self.upcast) for k, v in inputs.items()}
        self.pristine = (
            {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)} if self.mutates else None
        )
        if self.backward:
            for name in self.op.grad_inputs:
                inputs[name] = inputs[name].detach().requires_grad_(True)
        self.inputs = inputs
        self.grad_seed = self.workload.seed * 1_000_003 + step + 500_009
        self.grad_outputs: tuple[torch.Tensor, ...] | None = None
        self.outputs = None

    def prepare(self) -> None:
        self.outputs = None  # free the last result before the next one is made
        if self.pristine is not None:
            import torch

            with torch.no_grad():
                for name, value in self.pristine.items():
                    self.inputs[name].copy_(value)
        if self.backward:
            for name in self.op.grad_inputs:
                self.inputs[name].grad = None

    def run(self) -> None:
        out = self.fn(**self.inputs)
        outputs = out if isinstance(out, tuple) else (out,)
        self.outputs = outputs
        if self.backward:
            import torch

            if self.grad_outputs is None:
                self.grad_outputs = self._make_grad_outputs(outputs)
            torch.autograd.backward(outputs, self.grad_outputs)

    def _make_grad_outputs(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        # Drawn in fp32 and rounded to the workload's dtype first, so the fp32 / fp64 reference
        # back-propagates exactly the upstream gradient the candidate sees.
        import torch

        gen = generator(self.device, self.grad_seed)
        base_dtype = next(iter(self.input_dtypes.values()))
        grads = []
        for out in outputs:
            g = torch.randn(out.shape, generator=gen, device=self.device, dtype=torch.float32)
            grads.append(g.to(base_dtype).to(out.dtype))
        return tuple(grads)

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.outputs is None:
            raise RuntimeError("tensors() before run()")
        result = {name: t.detach() for name, t in zip(self.op.output_names, self.outputs)}
        if self.backward:
            for name in self.op.grad_inputs:
                grad = self.inputs[name].grad
                if grad is not None:
                    result[f"grad_{name}"] = grad
        return result

    def state_bytes(self) -> None:
        return None

    def input_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors the next ``run`` reads (the harness checks that it leaves them as they were)."""
        import torch

        return {k: v for k, v in self.inputs.items() if isinstance(v, torch.Tensor)}

    @property
    def inplace_inputs(self) -> frozenset[str]:
        """Inputs the op declares as in-place outputs: a candidate may overwrite these."""
        return self.op.inplace


# Dynamo recompiles a function once per new input shape and, past its recompile limit (8 by
# default), silently runs it eagerly: a sweep of many shapes would time the anchor as eager.
_ANCHOR_RECOMPILE_LIMIT = 256


def compile_anchor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile(fn, dynamic=False) for an anchor timed on many shapes in one process: the
    recompile limit is raised so that every shape gets compiled code."""
    import torch
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), _ANCHOR_RECOMPILE_LIMIT))
    return torch.compile(fn, dynamic=False)


def _upcast(value: Any, dtype: torch.dtype) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value
