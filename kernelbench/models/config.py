"""The shape of a Llama-style decoder, as plain numbers (no torch: the registry and the CLI read it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden: int = 2048
    n_layers: int = 4
    n_heads: int = 16
    n_kv_heads: int = 8
    intermediate: int = 8192
    max_seq: int = 2048
    rope_theta: float = 10000.0
    eps: float = 1e-6
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "n_layers", "n_heads", "n_kv_heads", "intermediate", "max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig: {name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.n_heads:
            raise ValueError(f"LlamaConfig: hidden {self.hidden} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if (self.hidden // self.n_heads) % 2:
            raise ValueError(f"LlamaConfig: head dimension {self.hidden // self.n_heads} must be even for rotary")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    def n_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        heads = self.vocab_size * self.hidden * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + heads + self.hidden
