"""A training step (fwd+bwd) of Hugging Face causal LMs built from configs, unpatched or patched.

The models are transformers' own ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` with random weights
(no download) at the shapes of real checkpoints, cut to a few layers. Candidates: the model as
transformers ships it, the model after ``kernelbench.nn.patch_hf_model``, and the model after
liger-kernel's per-instance patch, each eager and under ``torch.compile``. Every case builds its
model from the workload's seed (fp32, cast to the workload's dtype) and sees the same tokens, so
parity compares the logits and every gradient with the unpatched model in fp32 (fp64 on the CPU).

Parity runs on workloads of few tokens (the ``-parity`` ones and the CPU one): the fp32
reference's logits, their fp32 copy in the loss and its gradient over a 150k vocabulary at 8k
tokens would not fit beside the candidates' models, so the timed workloads build no reference.
FLOP model: 6 x matmul parameters x tokens + 6 x layers x seq x hidden x tokens (causal attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import Op, Requires, Tolerance, Workload, torch_dtype
from .model_step import compile_step, gradients, step_tokens, tokens_per_s_row

if TYPE_CHECKING:
    import torch


def hf_config(grid_name: str) -> tuple[str, dict[str, Any]]:
    """(transformers family, config kwargs) of the model grid's ``grid_name``: the same shapes as
    llama-step's model, as the family's own config (Qwen2 brings its q / k / v biases)."""
    from ..models.grid import BY_NAME

    row = BY_NAME[grid_name]
    cfg = row.config
    family = "Qwen2" if row.like.startswith("Qwen") else "Llama"
    return family, dict(hidden_size=cfg.hidden, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                        intermediate_size=cfg.intermediate, vocab_size=cfg.vocab_size, num_hidden_layers=cfg.n_layers,
                        max_position_embeddings=cfg.max_seq, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.eps,
                        tie_word_embeddings=cfg.tie_embeddings)


PATCHES = ("none", "kernelbench", "liger")
# Parity runs at most this many tokens per step (see the module docstring).
PARITY_MAX_TOKENS = 2048


@dataclass(frozen=True)
class HFStepSpec:
    patch: str = "none"
    compiled: bool = False


def hf_model(config_name: str, seed: int, device: str, dtype: str) -> torch.nn.Module:
    """The transformers model of ``hf_config(config_name)``, initialised from ``seed`` in fp32 on
    ``device``, then cast to ``dtype``."""
    import torch
    import transformers

    family, kwargs = hf_config(config_name)
    config = getattr(transformers, f"{family}Config")(**kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, f"{family}ForCausalLM")(config).float()
    return model.to(torch_dtype(dtype))


def _liger_patch(model: torch.nn.Module) -> None:
    """liger-kernel's per-instance patch of RMSNorm and SwiGLU; its rope goes in per instance too.
    liger swaps rope and the loss in transformers' modules, for every model of the process, and
    its cross-entropy writes the gradient into the logits returned: those two stay out."""
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    from kernelbench.nn.hf_patch import attention_class, attention_forward, bind_forward

    _apply_liger_kernel_to_instance(model=model, rope=False, cross_entropy=False, fused_linear_cross_entropy=False)
    cls = attention_class(model)
    bind_forward(model, cls, attention_forward(cls, "liger", lambda hf_rotary: liger_rotary_pos_emb))


def _workload(name: str, tier: str, config: str, batch: int, seq: int, dtype: str, seed: int = 0,
              note: str = "") -> Workload:
    return Workload(name, tier, {"config": config, "batch": batch, "seq": seq, "dtype": dtype}, seed=seed, note=note)


def _tokens(workload: Workload) -> int:
    return workload.spec["batch"] * workload.spec["seq"]


def _flops(workload: Workload) -> int:
    _, cfg = hf_config(workload.spec["config"])
    d, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim", d // cfg["num_attention_heads"])
    attn = d * head_dim * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"])
    matmul = layers * (attn + 3 * d * cfg["intermediate_size"]) + cfg["vocab_size"] * d  # lm_head
    tokens = _tokens(workload)
    return 6 * matmul * tokens + 6 * layers * workload.spec["seq"] * d * tokens


class HFStepOp(Op):
    kind = "model"

    def modes(self) -> tuple[str, ...]:
        return ("fwd+bwd",)

    def make_case(self, candidate, workload: Workload, device: str, mode: str) -> HFStepCase:
        return HFStepCase(candidate.build(), workload, device)

    def make_reference_case(self, workload: Workload, device: str, mode: str) -> HFStepCase:
        if _tokens(workload) > PARITY_MAX_TOKENS:
            raise ValueError(f"hf-step: parity runs on at most {PARITY_MAX_TOKENS} tokens (an fp32 reference over the "
                             f"full vocabulary); {workload.name} has {_tokens(workload)}: {workload.name}-parity "
                             "checks it")
        return HFStepCase(HFStepSpec(), workload, device, dtype="fp64" if device == "cpu" else "fp32")

    def flops(self, workload: Workload, candidate, mode: str) -> int | None:
        return _flops(workload)


class HFStepCase:
    """One model and its (compiled) loss-and-logits step."""

    def __init__(self, spec: HFStepSpec, workload: Workload, device: str, dtype: str | None = None) -> None:
        if spec.patch not in PATCHES:
            raise ValueError(f"hf-step: unknown patch {spec.patch!r}; known: {', '.join(PATCHES)}")
        self.spec, self.workload, self.device = spec, workload, device
        self.model = hf_model(workload.spec["config"], workload.seed, device, dtype or workload.spec["dtype"])
        if spec.patch == "kernelbench":
            from kernelbench.nn import patch_hf_model

            patch_hf_model(self.model)
        elif spec.patch == "liger":
            _liger_patch(self.model)
        self.model.train()
        # liger's patch is compiled with graph breaks allowed, as liger supports it; the others whole.
        self.step = (compile_step(self._loss_and_logits, device, fullgraph=spec.patch != "liger")
                     if spec.compiled else self._loss_and_logits)
        self.logits: torch.Tensor | None = None
        self.set_step(0)

    def _loss_and_logits(self, tokens: torch.Tensor):
        out = self.model(input_ids=tokens, labels=tokens)
        return out.loss, out.logits

    def set_step(self, step: int) -> None:
        tokens = step_tokens(self.device, self.workload.seed, step, self.workload.spec["batch"],
                             self.workload.spec["seq"] - 1, self.model.config.vocab_size)
        self.inputs = tokens  # the model shifts the labels itself: seq tokens in, seq - 1 targets

    def prepare(self) -> None:
        self.logits = None
        for p in self.model.parameters():
            p.grad = None

    def run(self) -> None:
        loss, logits = self.step(self.inputs)
        loss.backward()
        self.logits = logits

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.logits is None:
            raise RuntimeError("tensors() before run()")
        return {"logits": self.logits.detach(), **gradients(self.model)}

    def state_bytes(self) -> None:
        return None

    def extra_rows(self, median_ms: float) -> list[tuple[str, float, str, str]]:
        return [tokens_per_s_row(_tokens(self.workload), median_ms)]


# Whole model against the unpatched one in fp32 / fp64, relative Frobenius error per tensor. bf16
# is looser than llama-step's: transformers rotates q / k with bf16 cos / sin and rounds after
# every product, and each layer compounds the gap. The unpatched model itself, in bf16, is 0.093
# from fp32 on Llama-3.2-1B's shapes (results/2026-11-27-4xh200-hf-parity): this bound catches gross
# errors; tests/gpu/test_hf_patch_gpu.py holds a patched model to the unpatched model's own bf16 error.
_TOLERANCES = {
    "fp32": Tolerance(0, 0, fro=1e-4, reason="whole model: relative Frobenius error per tensor"),
    "bf16": Tolerance(0, 0, fro=0.12, reason="whole model in bf16 (the unpatched model's own bf16 error: up to "
                      "0.093), q / k rotated in bf16 by transformers"),
}

hf_step = HFStepOp(
    "hf-step",
    doc="Hugging Face Llama / Qwen2 step (fwd+bwd) from configs: unpatched, kernelbench-patched, liger-patched",
    workloads=[
        _workload("hf-tiny", "cpu", "llama-tiny", 2, 16, "fp32", seed=1),
        _workload("hf-smollm-135m-layer4", "gpu", "smollm-135m-layer4", 8, 2048, "bf16"),
        _workload("hf-qwen2.5-0.5b-layer4", "gpu", "qwen2.5-0.5b-layer4", 4, 2048, "bf16"),
        _workload("hf-llama-3.2-1b-layer4", "gpu", "llama-3.2-1b-layer4", 4, 2048, "bf16"),
        *(_workload(f"hf-{name}-parity", "gpu", name, 1, 512, "bf16", note="few tokens: the parity run")
          for name in ("smollm-135m-layer4", "qwen2.5-0.5b-layer4", "llama-3.2-1b-layer4")),
    ],
    reference="hf-eager",
    tolerances=_TOLERANCES,
    speed_anchor="hf-compile",
)

_HF = ("transformers",)


@hf_step.candidate("hf-eager", requires=Requires(packages=_HF), baseline=True)
def hf_eager():
    """The model as transformers ships it, eager."""
    return HFStepSpec()


@hf_step.candidate("hf-compile", requires=Requires(packages=_HF), baseline=True)
def hf_compile():
    """The model as transformers ships it, the step under torch.compile(fullgraph=True)."""
    return HFStepSpec(compiled=True)


@hf_step.candidate("kernelbench-eager", requires=Requires(triton=True, packages=_HF))
def kernelbench_eager():
    """kernelbench.nn.patch_hf_model: RMSNorm, rotary, SwiGLU activation and loss, eager."""
    return HFStepSpec("kernelbench")


@hf_step.candidate("kernelbench-compile", requires=Requires(triton=True, packages=_HF))
def kernelbench_compile():
    """kernelbench.nn.patch_hf_model, the step under torch.compile(fullgraph=True)."""
    return HFStepSpec("kernelbench", compiled=True)


@hf_step.candidate("liger-eager", requires=Requires(cuda=True, packages=(*_HF, "liger_kernel")), baseline=True)
def liger_eager():
    """liger-kernel's per-instance patch (RMSNorm, SwiGLU) and its rope, eager."""
    return HFStepSpec("liger")


@hf_step.candidate("liger-compile", requires=Requires(cuda=True, packages=(*_HF, "liger_kernel")), baseline=True)
def liger_compile():
    """liger-kernel's patch under torch.compile(fullgraph=False), graph breaks allowed."""
    return HFStepSpec("liger", compiled=True)
