"""A Llama-style decoder built in kernelbench, for measuring layers inside a model and for training.

Each of ``n_layers`` blocks:

    h   = x + o_proj(attention(rotary(q_proj(norm1(x))), rotary(k_proj(..)), v_proj(..)))
    out = h + down_proj(silu(gate_proj(norm2(h))) * up_proj(norm2(h)))

with RMSNorm, rotary embeddings in Hugging Face's rotate_half style, grouped-query attention
(``n_kv_heads`` key/value heads shared by ``n_heads`` query heads) through causal
``F.scaled_dot_product_attention``, a final RMSNorm and an output head (untied unless
``tie_embeddings``). Parameter names follow Hugging Face's Llama (``model.embed_tokens``,
``model.layers.N.self_attn.q_proj``, ``model.layers.N.mlp.gate_proj``, ``lm_head``...), so
optimizers that partition by name (Adam-mini) see what they would see on the real model.

``layers`` picks the implementation of each slot in ``LAYER_SLOTS`` (RMSNorm, rotary, the
SwiGLU activation ``silu(gate) * up`` and the loss); everything else is the same code. The table
says what each layer set puts in each slot; an op of kernelbench.ops that is one of these layers
names its slot (``model_layer``), so ``train`` finds the layer ops in the registry. The residual
add before each norm goes through the layer set too, so an implementation that fuses it
(kernelbench's) can. ``impl`` is kernelbench's layers' ``impl`` ("auto", "triton", "torch"), one for
every slot or a mapping {slot: impl} (slots left out: "auto"). ``overrides`` replaces single
layers of the set by plain functions (a kernel under test): ``"norm"`` ``fn(x, weight, eps)``,
``"rotary"`` ``fn(q, k, cos, sin)``, ``"silu_mul"`` ``fn(gate, up)``, ``"loss"`` ``fn(logits,
targets)`` (mean over every position).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .config import LlamaConfig
from .grid import CONFIGS  # noqa: F401  (the grid's models, by name)

LAYER_SETS = ("torch", "kernelbench", "liger")
# slot -> layer set -> what that set puts there.
LAYER_SLOTS: dict[str, dict[str, str]] = {
    "norm": {"torch": "torch.nn.RMSNorm", "kernelbench": "kernelbench's Triton RMSNorm (fused residual add)",
             "liger": "liger-kernel's RMSNorm"},
    "rotary": {"torch": "the eager rotary (Hugging Face's)", "kernelbench": "kernelbench's Triton rotary",
               "liger": "liger-kernel's rotary"},
    "silu_mul": {"torch": "F.silu(gate) * up", "kernelbench": "kernelbench's Triton SwiGLU activation",
                 "liger": "liger-kernel's SwiGLU activation"},
    # liger's cross-entropy writes its gradient into the logits the model returns: torch's loss.
    "loss": {"torch": "cross-entropy on fp32-upcast logits (Hugging Face's)",
             "kernelbench": "kernelbench's Triton cross-entropy", "liger": "torch's loss"},
}


def layer_set_doc(name: str) -> str:
    """What the layer set ``name`` puts in each slot, in words."""
    return ", ".join(impls[name] for impls in LAYER_SLOTS.values())


def rotary_tables(config: LlamaConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos / sin of shape (max_seq, head_dim), rotate_half layout (frequencies repeated)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
    angles = torch.outer(torch.arange(config.max_seq, dtype=torch.float64, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def eager_rotary(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb on (B, H, S, D) q / k and (S, D) tables."""
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _eager_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _upcast_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # bf16 / fp16 logits upcast to fp32 (Hugging Face's loss); fp64 stays fp64.
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(upcast.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class FunctionRMSNorm(nn.Module):
    """An RMSNorm module (``weight`` at one, as torch's) around a function ``fn(x, weight, eps)``."""

    def __init__(self, hidden: int, eps: float, fn: Callable) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps, self.fn = eps, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.weight, self.eps)


class LayerSet:
    """The RMSNorm, rotary, SwiGLU-activation and loss implementations a model is built with:
    ``loss(logits, targets)`` is the mean cross-entropy (fp32) over every position."""

    def __init__(self, name: str, impl: str | Mapping[str, str] = "auto",
                 overrides: Mapping[str, Callable] | None = None) -> None:
        if name not in LAYER_SETS:
            raise ValueError(f"layers must be one of {', '.join(LAYER_SETS)}, got {name!r}")
        for what, given in (("overrides", overrides or {}), ("impl", impl if isinstance(impl, Mapping) else {})):
            unknown = set(given) - set(LAYER_SLOTS)
            if unknown:
                raise ValueError(f"{what}: unknown layer {sorted(unknown)}; accepted: {', '.join(LAYER_SLOTS)}")
        self.name = name
        # kernelbench's impl per slot ("auto" for a slot a mapping leaves out).
        self.impls = {slot: impl.get(slot, "auto") if isinstance(impl, Mapping) else impl for slot in LAYER_SLOTS}
        self.overrides = dict(overrides or {})
        self.rotary: Callable = eager_rotary
        self.silu_mul: Callable = _eager_silu_mul
        self.loss: Callable = _upcast_cross_entropy
        if name == "kernelbench":
            from kernelbench.nn import apply_rotary, cross_entropy, silu_mul

            rotary_impl, silu_impl, loss_impl = self.impls["rotary"], self.impls["silu_mul"], self.impls["loss"]
            self.rotary = lambda q, k, cos, sin: apply_rotary(q, k, cos, sin, impl=rotary_impl)
            self.silu_mul = lambda gate, up: silu_mul(gate, up, impl=silu_impl)
            self.loss = lambda logits, targets: cross_entropy(logits, targets, impl=loss_impl)
        elif name == "liger":
            from liger_kernel.ops.rope import LigerRopeFunction
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            # liger takes cos / sin as (1, S, D) or (B, S, D) in q's dtype
            self.rotary = lambda q, k, cos, sin: LigerRopeFunction.apply(
                q, k, cos.to(q.dtype).unsqueeze(0), sin.to(q.dtype).unsqueeze(0))
            self.silu_mul = LigerSiLUMulFunction.apply
        for slot in ("rotary", "silu_mul", "loss"):
            if slot in self.overrides:
                setattr(self, slot, self.overrides[slot])

    def norm(self, hidden: int, eps: float) -> nn.Module:
        if "norm" in self.overrides:
            return FunctionRMSNorm(hidden, eps, self.overrides["norm"])
        if self.name == "kernelbench":
            from kernelbench.nn import RMSNorm

            return RMSNorm(hidden, eps=eps, impl=self.impls["norm"])
        if self.name == "liger":
            from liger_kernel.transformers.rms_norm import LigerRMSNorm

            return LigerRMSNorm(hidden, eps=eps)
        return nn.RMSNorm(hidden, eps=eps)

    def add_norm(self, norm: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), fused where the implementation offers it."""
        x = x.to(residual.dtype)
        if self.name == "kernelbench" and "norm" not in self.overrides:
            return norm(x, residual)
        h = x + residual
        return norm(h), h


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layers: LayerSet) -> None:
        super().__init__()
        self.config, self.layers = config, layers
        d, hd = config.hidden, config.head_dim
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = self.layers.rotary(q, k, cos[:s], sin[:s])
        if c.n_kv_heads != c.n_heads:
            repeat = c.n_heads // c.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, c.n_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig, layers: LayerSet) -> None:
        super().__init__()
        self.layers = layers
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.layers.silu_mul(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layers: LayerSet) -> None:
        super().__init__()
        self.layers = layers
        self.input_layernorm = layers.norm(config.hidden, config.eps)
        self.self_attn = Attention(config, layers)
        self.post_attention_layernorm = layers.norm(config.hidden, config.eps)
        self.mlp = MLP(config, layers)

    def forward(self, normed: torch.Tensor, residual: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Takes norm1(x) and x; returns the MLP's output and the residual stream h, whose sum is
        the next layer's input (left unadded so that the next norm can fuse the add)."""
        attn = self.self_attn(normed, cos, sin)
        normed, h = self.layers.add_norm(self.post_attention_layernorm, attn, residual)
        return self.mlp(normed), h


class _Body(nn.Module):
    """Holds the parameters under Hugging Face's ``model.`` prefix."""

    def __init__(self, config: LlamaConfig, layers: LayerSet) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config, layers) for _ in range(config.n_layers))
        self.norm = layers.norm(config.hidden, config.eps)


class Llama(nn.Module):
    """``forward(tokens)`` -> logits (B, S, vocab); ``loss(tokens, targets)`` -> mean cross-entropy."""

    def __init__(self, config: LlamaConfig, layers: str = "torch", *, impl: str | Mapping[str, str] = "auto",
                 overrides: Mapping[str, Callable] | None = None, fused_head_loss: bool | str = False) -> None:
        super().__init__()
        if fused_head_loss not in (True, False, "auto"):
            raise ValueError(f"fused_head_loss: True, False or 'auto', got {fused_head_loss!r}")
        if fused_head_loss and (layers != "kernelbench" or "loss" in (overrides or {})):
            raise ValueError("fused_head_loss: kernelbench's fused linear + cross-entropy replaces the output head "
                             "and kernelbench's loss; it needs layers='kernelbench' and no 'loss' override, got "
                             f"layers={layers!r}")
        self.config = config
        self.layer_set = LayerSet(layers, impl, overrides)
        # The output head and the loss as one op, chunk by chunk, never holding the logits; "auto":
        # where the batch's logits are many enough for that to pay (linear_crossentropy.fusing_pays).
        self.fused_head_loss = fused_head_loss
        self.model = _Body(config, self.layer_set)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rotary_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, seed: int | None = None) -> None:
        """Normal(0, 0.02) linear and embedding weights, residual projections scaled by
        1/sqrt(2 * n_layers) (GPT-2's scheme), norms at one."""
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.lm_head.weight.device).manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                with torch.no_grad():
                    p.normal_(0.0, std, generator=gen)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final norm's output (B, S, hidden): what the output head reads."""
        s = tokens.shape[1]
        if s > self.config.max_seq:
            raise ValueError(f"Llama: sequence length {s} exceeds max_seq {self.config.max_seq}")
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rope_cos, self.rope_sin
        layers = self.model.layers
        normed, residual = layers[0].input_layernorm(x), x
        for i, layer in enumerate(layers):
            out, h = layer(normed, residual, cos, sin)
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            normed, residual = self.layer_set.add_norm(nxt, out, h)
        return normed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden_states(tokens))

    def head_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(mean cross-entropy, logits) of the final hidden states: the one place the output head
        and the loss meet. Where the head and loss are fused the logits are never materialised (None)."""
        if self.fuses_head_loss(hidden.numel() // hidden.shape[-1]):
            from kernelbench.nn import linear_cross_entropy

            return linear_cross_entropy(hidden, self.lm_head.weight, targets), None
        logits = self.lm_head(hidden)
        return self.layer_set.loss(logits, targets), logits

    def fuses_head_loss(self, rows: int) -> bool:
        """Whether a batch of ``rows`` tokens takes the fused head and loss."""
        if self.fused_head_loss == "auto":
            from kernelbench.nn.linear_crossentropy import fusing_pays

            return fusing_pays(rows, self.config.vocab_size)
        return self.fused_head_loss

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.head_loss(self.hidden_states(tokens), targets)[0]
