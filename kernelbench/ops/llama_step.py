"""A training step of the Llama-style decoder (kernelbench.models.Llama) with each layer set.

Workloads: the model grid (kernelbench.models.grid), each model at its batch x sequence; ``-w``
also takes ``MODEL@BxS[:dtype]``, MODEL a grid name or a spec ``hidden=..,layers=..,...`` (the
CLI's ``--model`` / ``--tokens`` write these).
Modes: ``fwd+bwd`` (logits, cross-entropy, backward) and ``train`` (the same plus one optimizer
step). Candidates differ in the layer set (RMSNorm, rotary, SwiGLU activation and loss: torch,
kernelbench, liger; see kernelbench.models.llama), in whether
the step is compiled (``torch.compile(fullgraph=True)``, or ``mode="reduce-overhead"``: CUDA
graphs), and, for ``train``, in the optimizer. Each candidate's speed anchor is the torch layers
compiled the same way (eager, compile or CUDA graphs).
Every candidate starts from the same seeded fp32 weights (cast to the workload's dtype) and sees
the same tokens, so parity compares the logits and every parameter's gradient with the torch
layers run in fp32 (fp64 on the CPU); in ``train`` mode each parity step restarts from those
weights (the optimizer's update itself is checked by the optimizer ops' parity).

Extra rows per candidate: ``tokens_per_s``; on CUDA ``peak_mem_bytes`` (the step's own weights,
gradients, activations and optimizer state at its peak); in ``train`` mode ``optimizer_ms`` (median time of
``optimizer.step()`` inside the timed steps) and ``optimizer_share`` (of the whole step).
FLOP model (fwd+bwd): 6 x matmul parameters x tokens + 6 x layers x seq x hidden x tokens for
causal attention; the optimizer's work is not counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..models.config import LlamaConfig
from ..models.grid import GRID, SPEC_FORM, GridModel, fit_seq, is_model_spec, model_config, parse_tokens
from .base import Candidate, Op, Requires, Tolerance, UsageError, Workload, torch_dtype
from .model_step import compile_step, gradients, step_tokens, tokens_per_s_row
from .shapes import CUSTOM_TIER

if TYPE_CHECKING:
    import torch

MODES = ("fwd+bwd", "train")
LR = 1e-4
COMPILE_MODES = ("eager", "compile", "cudagraphs")
# Inductor's option to launch user-defined Triton kernels (ours) through its static launcher.
STATIC_LAUNCH_OPTIONS = {"static_launch_user_defined_triton_kernels": True}
# Spelled as the CLI and reports name a workload written on the command line: MODEL@BxS[:dtype].
_AT, _DTYPE_SEP = "@", ":"
WORKLOAD_FORM = f"MODEL@BxS[:dtype]: MODEL a grid name or {SPEC_FORM}, e.g. llama-7m@2x512 (run's --model / --tokens)"


@dataclass(frozen=True)
class StepSpec:
    """What a candidate's factory returns: the model's layers, how the step is compiled (one of
    ``COMPILE_MODES``) and the optimizer of ``train`` mode."""

    layers: str
    compile: str = "eager"
    optimizer: str = "torch-adamw"
    impl: str = "triton"
    slot_impl: tuple[tuple[str, str], ...] = ()  # (slot, impl) pairs that replace ``impl`` for that slot
    fused_head_loss: bool | str = False  # lm_head + loss as kernelbench.nn.linear_cross_entropy (or "auto")
    # Inductor launches our Triton kernels through its static launcher, as it launches its own
    # (torch.compile's options; Inductor's default runs user kernels through Triton's launcher).
    static_launch: bool = False


def _spec(model: str, config: LlamaConfig, batch: int, seq: int, dtype: str) -> dict:
    return {"model": model, "config": dataclasses.asdict(fit_seq(config, seq)), "batch": batch, "seq": seq,
            "dtype": dtype}


def _grid_workload(row: GridModel) -> Workload:
    dtype = "fp32" if row.tier == "cpu" else "bf16"
    note = f"{row.like}: {row.config.n_layers} layers, {row.tokens} tokens" + (f"; {row.note}" if row.note else "")
    return Workload(row.name, row.tier, _spec(row.name, row.config, row.batch, row.seq, dtype), seed=row.seed,
                    note=note)


def parse_workload(text: str) -> Workload | None:
    """The workload ``MODEL@BxS[:dtype]`` writes (None for text not written so); a one-line
    UsageError when MODEL, the tokens or the dtype is wrong."""
    model, at, rest = text.rpartition(_AT)
    if not at:
        if not is_model_spec(text):
            return None
        raise UsageError(f"-w {text}: a model written as a spec needs its tokens: {text}@BxS (e.g. @4x2048)")
    tokens, _, dtype = rest.partition(_DTYPE_SEP)
    dtype = dtype or "bf16"
    if dtype not in _TOLERANCES:
        raise UsageError(f"-w {text}: dtype {dtype!r}; accepted: {', '.join(_TOLERANCES)}")
    try:
        config = model_config(model)
        batch, seq = parse_tokens(tokens)
    except ValueError as exc:
        raise UsageError(f"-w {text}: {exc}") from None
    return Workload(text, CUSTOM_TIER, _spec(model, config, batch, seq, dtype))


def model_workload_texts(op: str | None, model: str | None, tokens: str | None,
                         workloads: list[str] | None) -> list[str] | None:
    """The -w texts ``run --model M --tokens BxS`` means: ``M@BxS`` (M alone for a grid name
    without --tokens) after any -w given; --tokens alone sets the tokens of every -w given."""
    if model is None and tokens is None:
        return workloads
    if op != "llama-step":
        raise UsageError("--model / --tokens: llama-step options only (kernelbench run llama-step --model NAME "
                         "--tokens BxS)")
    for flag, text, parse in (("--model", model, model_config), ("--tokens", tokens, parse_tokens)):
        try:
            if text is not None:
                parse(text)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    given = list(workloads or [])
    if model is None:
        if not given:
            raise UsageError("--tokens needs --model or -w (the workloads whose tokens it sets)")
        return [w if _AT in w else f"{w}{_AT}{tokens}" for w in given]
    if tokens is None and is_model_spec(model):
        raise UsageError("--model written as a spec needs --tokens BxS (a model outside the grid has no default)")
    return given + [model if tokens is None else f"{model}{_AT}{tokens}"]


def _config(workload: Workload) -> LlamaConfig:
    return LlamaConfig(**workload.spec["config"])


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

    def custom_workload(self, text: str) -> Workload | None:
        return parse_workload(text)

    def workload_forms(self) -> str | None:
        return WORKLOAD_FORM

    def anchor_for(self, candidate: str) -> str | None:
        """The torch layers compiled as ``candidate`` is: a layer set's gain, not the compiler's."""
        return _ANCHORS[self.get_candidate(candidate).build().compile]

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
        from kernelbench.models.llama import LAYER_SLOTS

        if mode not in MODES:
            raise ValueError(f"llama-step has no mode {mode}; modes: {', '.join(MODES)}")
        self.spec, self.workload, self.device, self.mode = spec, workload, device, mode
        cfg = _config(workload)
        seq = workload.spec["seq"]
        if seq > cfg.max_seq:
            raise ValueError(f"llama-step: workload seq {seq} exceeds the config's max_seq {cfg.max_seq}")
        # Weights drawn in fp32 from the workload's seed, then cast: every candidate and the
        # reference start from the same values.
        impls = {slot: spec.impl for slot in LAYER_SLOTS} | dict(spec.slot_impl)
        model = Llama(cfg, spec.layers, impl=impls, fused_head_loss=spec.fused_head_loss).to(device)
        model.reset_parameters(seed=workload.seed)
        self.model = model.to(torch_dtype(dtype or workload.spec["dtype"]))
        self.step = self._loss_and_logits
        if spec.compile not in COMPILE_MODES:
            raise ValueError(f"llama-step: compile {spec.compile!r}; accepted: {', '.join(COMPILE_MODES)}")
        self._cudagraphs = spec.compile == "cudagraphs"
        # What impl="auto" chose at this model's shapes, recorded on its first eager step (a
        # choice is measured per process: reports name it so a figure can be reproduced).
        self.auto_choices: dict[tuple, str] | None = None
        self._records_choices = spec.layers == "kernelbench" and "auto" in impls.values()
        if spec.compile != "eager":
            if "auto" in impls.values():
                # impl="auto" measures each layer's shapes on an eager call; the trace then reads
                # those choices (kernelbench.nn.autoselect.compiled_choice).
                self.set_step(0)
                with self._recording():
                    self._loss_and_logits(self.inputs, self.targets)[0].backward()
                self.model.zero_grad(set_to_none=True)
            options = STATIC_LAUNCH_OPTIONS if spec.static_launch else None
            self.step = compile_step(self._loss_and_logits, device,
                                     mode="reduce-overhead" if self._cudagraphs else None, options=options)
        self.optimizer = _build_optimizer(spec.optimizer, self.model, device) if mode == "train" else None
        # Parity steps restart from these weights, so logits and gradients stay comparable with
        # the reference's whatever the optimizer did (its state carries on).
        self._initial = [p.detach().clone() for p in self.model.parameters()] if self.optimizer else None
        self.optimizer_ms: list[float] = []
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # read after the timed steps
        self.loss: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        self.set_step(0)

    def _loss_and_logits(self, tokens: torch.Tensor, targets: torch.Tensor):
        return self.model.head_loss(self.model.hidden_states(tokens), targets)

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
        self.loss = self.logits = None
        for p in self.model.parameters():
            p.grad = None

    def run(self) -> None:
        if self._cudagraphs:
            import torch

            # Each call is a new training step: the graphs' outputs of the last one may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        if self._records_choices and self.auto_choices is None:  # the first step only: no context
            with self._recording():                                  # manager on the timed steps
                loss, logits = self.step(self.inputs, self.targets)
                loss.backward()
        else:
            loss, logits = self.step(self.inputs, self.targets)
            loss.backward()
        self.loss, self.logits = loss, logits
        if self.optimizer is not None:
            self._timed_optimizer_step()

    @contextlib.contextmanager
    def _recording(self):
        from kernelbench.nn.autoselect import recording_choices

        if not self._records_choices or self.auto_choices is not None:
            yield
            return
        with recording_choices() as seen:
            yield
        self.auto_choices = seen

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
        if self.loss is None:
            raise RuntimeError("tensors() before run()")
        # The loss at the model's dtype, held to that dtype's tolerance; a fused head keeps no logits.
        result = {"loss": self.loss.detach().to(self.model.lm_head.weight.dtype)}
        if self.logits is not None:
            result["logits"] = self.logits.detach()
        return {**result, **gradients(self.model)}

    def state_bytes(self) -> None:
        return None

    def _peak_memory(self) -> tuple[int, int]:
        """(allocated, requested) peak bytes of one step plus what stays resident. Allocated counts
        the allocator's blocks, which may exceed a request by up to 1 MB where a cached block is
        not split, so two steps holding the same tensors can differ by that slack; requested
        counts the tensors' own bytes."""
        import torch

        resident = [*self.model.parameters(), *self.model.buffers()]
        if self.optimizer is not None:
            resident += [t for state in self.optimizer.state.values() for t in state.values()
                         if isinstance(t, torch.Tensor)]
        held = sum(t.numel() * t.element_size() for t in {id(t): t for t in resident}.values())
        self.prepare()
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()
        torch.cuda.reset_peak_memory_stats()
        self.run()
        torch.cuda.synchronize()
        after = torch.cuda.memory_stats()
        return tuple(held + after[f"{kind}_bytes.all.peak"] - before[f"{kind}_bytes.all.current"]
                     for kind in ("allocated", "requested"))

    def extra_rows(self, median_ms: float) -> list[tuple[str, float, str, str]]:
        """(metric, value, unit, message) rows beside the timing: throughput, the optimizer's
        share, peak memory (measured last: its extra step is not among the timed ones)."""
        rows = [tokens_per_s_row(_tokens(self.workload), median_ms)]
        if self.auto_choices:
            from kernelbench.nn.autoselect import choices_as_run, describe_choices

            compiled = self.spec.compile != "eager"
            triton = sum(impl == "triton" for impl in choices_as_run(self.auto_choices, traced=compiled).values())
            rows.append(("auto_triton_choices", triton, "", f"of {len(self.auto_choices)} impl='auto' choices "
                         "(op, shape, mode) took Triton: " + describe_choices(self.auto_choices, traced=compiled)))
        if self.optimizer is not None:
            rows += self._optimizer_rows(median_ms)
        if self.device == "cuda":
            allocated, requested = self._peak_memory()
            unseen = " (CUDA graphs' pool held before the step is not seen)" if self._cudagraphs else ""
            rows.append(("peak_mem_bytes", allocated, "B",
                         "weights, optimizer state and the allocator's peak during one more step beyond what "
                         "was allocated before it" + unseen))
            rows.append(("peak_mem_requested_bytes", requested, "B",
                         "as peak_mem_bytes, counting the bytes the step's tensors asked for, without the "
                         "allocator's rounding of blocks" + unseen))
        return rows

    def _optimizer_rows(self, median_ms: float) -> list[tuple[str, float, str, str]]:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.optimizer_ms.extend(s.elapsed_time(e) for s, e in self._pending)
            self._pending = []
        if not self.optimizer_ms:
            return []
        ordered = sorted(self.optimizer_ms)
        opt_ms = ordered[len(ordered) // 2]
        return [("optimizer_ms", opt_ms, "ms", f"median of optimizer.step() over {len(ordered)} timed steps "
                 f"({self.spec.optimizer})"),
                ("optimizer_share", opt_ms / median_ms, "", "optimizer_ms / median step time")]


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
    workloads=[_grid_workload(row) for row in GRID],
    reference="torch-eager",
    tolerances=_TOLERANCES,
    speed_anchor="torch-compile",
)
_ANCHORS = {"eager": "torch-eager", "compile": "torch-compile", "cudagraphs": "torch-cudagraphs"}


@llama_step.candidate("torch-eager", baseline=True)
def torch_eager():
    """torch.nn.RMSNorm and Hugging Face's rotary, eager."""
    return StepSpec("torch")


@llama_step.candidate("torch-compile", baseline=True)
def torch_compile():
    """torch layers, the step under torch.compile(fullgraph=True)."""
    return StepSpec("torch", compile="compile")


@llama_step.candidate("torch-cudagraphs", requires=Requires(cuda=True), baseline=True)
def torch_cudagraphs():
    """torch layers, the step under torch.compile(mode="reduce-overhead") (CUDA graphs)."""
    return StepSpec("torch", compile="cudagraphs")


@llama_step.candidate("kernelbench-eager", requires=Requires(triton=True))
def kernelbench_eager():
    """kernelbench.nn RMSNorm (fused residual add) and apply_rotary, eager."""
    return StepSpec("kernelbench")


@llama_step.candidate("kernelbench-eager+auto", requires=Requires(triton=True))
def kernelbench_eager_auto():
    """kernelbench layers eager at the library's defaults: impl="auto" (RMSNorm, rotary and the SwiGLU
    activation each take the faster of Triton and torch at this model's shapes, measured once,
    cached, launch time included) and the output head and loss fused where the logits are many
    (fused_head_loss="auto")."""
    return StepSpec("kernelbench", impl="auto", fused_head_loss="auto")


@llama_step.candidate("kernelbench-compile+auto", requires=Requires(triton=True))
def kernelbench_compile_auto():
    """kernelbench layers compiled at the library's defaults: impl="auto", whose choices an eager step
    measured at this model's shapes are constants of the graph, and fused_head_loss="auto"."""
    return StepSpec("kernelbench", compile="compile", impl="auto", fused_head_loss="auto")


@llama_step.candidate("kernelbench-compile+auto+triton-rotary", requires=Requires(triton=True))
def kernelbench_compile_auto_triton_rotary():
    """kernelbench-compile+auto with our rotary kernel in the graph, where "auto" leaves rotary to
    Inductor (torch's formula, fused with the copies beside it)."""
    return StepSpec("kernelbench", compile="compile", impl="auto", slot_impl=(("rotary", "triton"),),
                    fused_head_loss="auto")


@llama_step.candidate("kernelbench-compile", requires=Requires(triton=True))
def kernelbench_compile():
    """kernelbench layers (custom ops), the step under torch.compile(fullgraph=True)."""
    return StepSpec("kernelbench", compile="compile")


@llama_step.candidate("kernelbench-compile+static-launch", requires=Requires(cuda=True, triton=True))
def kernelbench_compile_static_launch():
    """kernelbench-compile with Inductor's static launcher for our Triton kernels (less host time a launch)."""
    return StepSpec("kernelbench", compile="compile", static_launch=True)


@llama_step.candidate("kernelbench-compile+auto+static-launch", requires=Requires(cuda=True, triton=True))
def kernelbench_compile_auto_static_launch():
    """kernelbench-compile+auto with Inductor's static launcher for our Triton kernels."""
    return StepSpec("kernelbench", compile="compile", impl="auto", fused_head_loss="auto", static_launch=True)


@llama_step.candidate("kernelbench-cudagraphs", requires=Requires(cuda=True, triton=True))
def kernelbench_cudagraphs():
    """kernelbench layers (custom ops), the step under torch.compile(mode="reduce-overhead")."""
    return StepSpec("kernelbench", compile="cudagraphs")


@llama_step.candidate("kernelbench-cudagraphs+auto", requires=Requires(cuda=True, triton=True))
def kernelbench_cudagraphs_auto():
    """kernelbench layers at the library's defaults (impl="auto", fused_head_loss="auto"), the step
    under torch.compile(mode="reduce-overhead")."""
    return StepSpec("kernelbench", compile="cudagraphs", impl="auto", fused_head_loss="auto")


@llama_step.candidate("kernelbench-eager+fused-loss", requires=Requires(triton=True))
def kernelbench_eager_fused_loss():
    """kernelbench layers eager; the output head and loss as one chunked linear + cross-entropy."""
    return StepSpec("kernelbench", fused_head_loss=True)


@llama_step.candidate("kernelbench-compile+fused-loss", requires=Requires(triton=True))
def kernelbench_compile_fused_loss():
    """kernelbench layers compiled; the output head and loss as one chunked linear + cross-entropy."""
    return StepSpec("kernelbench", compile="compile", fused_head_loss=True)


@llama_step.candidate("liger", requires=Requires(cuda=True, packages=("liger_kernel",)), baseline=True)
def liger():
    """liger-kernel's RMSNorm and rope, eager."""
    return StepSpec("liger")


def _with_optimizer(optimizer: str):
    def build():
        return StepSpec("kernelbench", compile="compile", optimizer=optimizer)

    build.__doc__ = f"kernelbench layers compiled; train mode steps {optimizer}"
    return build


# The optimizers where they are used (train mode); the layer candidates above step torch AdamW
# (fused on CUDA), the anchor.
llama_step.candidate("kernelbench-compile+triton-adamw",
                     requires=Requires(triton=True))(_with_optimizer("triton-adamw"))
llama_step.candidate("kernelbench-compile+adam-mini", requires=Requires(triton=True))(_with_optimizer("adam-mini"))
llama_step.candidate("kernelbench-compile+muon", requires=Requires(triton=True))(_with_optimizer("muon"))
