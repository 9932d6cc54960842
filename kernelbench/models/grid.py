"""The model grid: the layer shapes of common open model families, a few layers deep so that one
GPU holds a training step of each, with the batch x sequence each is timed at.

``GRID`` is the one table. ``CONFIGS`` (name -> :class:`LlamaConfig`, what ``train --model`` and
``-w model:NAME`` read) and llama-step's workloads are made from it. A model not in the grid is
written as a spec, ``hidden=576,layers=4,heads=9,kv_heads=3,intermediate=1536,vocab=49152`` (see
``SPEC_KEYS``), and tokens as ``BxS`` (``4x2048``). The shapes are the families' (the embedding tied
where theirs is); the layers are the Llama block of kernelbench.models.llama (no attention bias).
Nothing here imports torch: the registry and the command line read this before anything runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass

from .config import LlamaConfig


@dataclass(frozen=True)
class GridModel:
    """One row of the grid: a model ``name``, the family member whose shapes it has (``like``),
    its configuration and the ``batch`` x ``seq`` it is timed at. ``tier``: "cpu" (tiny, the CPU
    tests and suites) or "gpu"."""

    name: str
    like: str
    config: LlamaConfig
    batch: int
    seq: int
    tier: str = "gpu"
    seed: int = 0
    note: str = ""

    @property
    def tokens(self) -> str:
        return f"{self.batch}x{self.seq}"


_LLAMA_32_1B = LlamaConfig(vocab_size=128256, hidden=2048, n_layers=4, n_heads=32, n_kv_heads=8, intermediate=8192,
                           max_seq=2048, rope_theta=500000.0, eps=1e-5, tie_embeddings=True)

GRID: tuple[GridModel, ...] = (
    GridModel("llama-tiny", "a toy model (Triton runs in the interpreter on the CPU)",
              LlamaConfig(vocab_size=128, hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=128,
                          max_seq=64), 2, 16, tier="cpu", seed=1),
    GridModel("llama-7m", "a 7M-parameter Llama that trains for hundreds of steps in a minute",
              LlamaConfig(vocab_size=4096, hidden=256, n_layers=6, n_heads=8, n_kv_heads=4, intermediate=768,
                          max_seq=512), 8, 512, note="small per-GPU batch: launch overhead counts"),
    GridModel("llama-1b-layer4", "a 1B-class Llama (Llama-2 vocabulary)",
              LlamaConfig(vocab_size=32000, hidden=2048, n_layers=4, n_heads=16, n_kv_heads=8, intermediate=8192,
                          max_seq=2048), 4, 2048),
    GridModel("smollm-135m-layer4", "SmolLM-135M",
              LlamaConfig(vocab_size=49152, hidden=576, n_layers=4, n_heads=9, n_kv_heads=3, intermediate=1536,
                          max_seq=2048, rope_theta=10000.0, eps=1e-5, tie_embeddings=True), 8, 2048),
    GridModel("qwen2.5-0.5b-layer4", "Qwen2.5-0.5B",
              LlamaConfig(vocab_size=151936, hidden=896, n_layers=4, n_heads=14, n_kv_heads=2, intermediate=4864,
                          max_seq=2048, rope_theta=1000000.0, eps=1e-6, tie_embeddings=True), 4, 2048),
    GridModel("qwen2.5-1.5b-layer4", "Qwen2.5-1.5B",
              LlamaConfig(vocab_size=151936, hidden=1536, n_layers=4, n_heads=12, n_kv_heads=2, intermediate=8960,
                          max_seq=4096, rope_theta=1000000.0, eps=1e-6, tie_embeddings=True), 2, 4096),
    GridModel("llama-3.2-1b-layer4", "Llama-3.2-1B", _LLAMA_32_1B, 4, 2048),
    GridModel("llama-3.2-1b-layer4-1x512", "Llama-3.2-1B", _LLAMA_32_1B, 1, 512,
              note="one short sequence: the vocabulary's head and launch overhead dominate"),
    GridModel("llama-3-8b-layer2", "Llama-3-8B",
              LlamaConfig(vocab_size=128256, hidden=4096, n_layers=2, n_heads=32, n_kv_heads=8, intermediate=14336,
                          max_seq=4096, rope_theta=500000.0, eps=1e-5), 1, 4096),
)

CONFIGS: dict[str, LlamaConfig] = {row.name: row.config for row in GRID}
BY_NAME: dict[str, GridModel] = {row.name: row for row in GRID}

# Spec key -> (LlamaConfig field, type). The first six are required.
SPEC_KEYS: dict[str, tuple[str, type]] = {
    "hidden": ("hidden", int), "layers": ("n_layers", int), "heads": ("n_heads", int),
    "kv_heads": ("n_kv_heads", int), "intermediate": ("intermediate", int), "vocab": ("vocab_size", int),
    "rope_theta": ("rope_theta", float), "eps": ("eps", float), "tie": ("tie_embeddings", bool),
    "max_seq": ("max_seq", int),
}
REQUIRED_KEYS = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")
SPEC_FORM = ("hidden=..,layers=..,heads=..,kv_heads=..,intermediate=..,vocab=.. "
             "[,rope_theta=..,eps=..,tie=0|1,max_seq=..]")
_TOKENS = re.compile(r"(\d+)x(\d+)")


def is_model_spec(text: str) -> bool:
    """True for text written as a spec (``key=value,...``), right or wrong."""
    return "=" in text


_KIND_WORDS = {int: "an integer", float: "a number", bool: "0 or 1"}


def _parse_value(value: str, kind: type) -> object | None:
    if kind is bool:
        return {"0": False, "1": True, "false": False, "true": True}.get(value)
    try:
        return kind(value)
    except ValueError:
        return None


def parse_model_spec(text: str) -> LlamaConfig:
    """The configuration ``hidden=..,layers=..,...`` writes; a one-line ValueError naming the keys."""
    accepted = f"accepted keys: {', '.join(SPEC_KEYS)} (the first {len(REQUIRED_KEYS)} required)"
    values: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in SPEC_KEYS:
            raise ValueError(f"model {text}: unknown key {key!r}; {accepted}")
        if SPEC_KEYS[key][0] in values:
            raise ValueError(f"model {text}: {key} given twice")
        attr, kind = SPEC_KEYS[key]
        parsed = _parse_value(value, kind)
        if parsed is None:
            raise ValueError(f"model {text}: {key}={value} is not {_KIND_WORDS[kind]}")
        values[attr] = parsed
    missing = [k for k in REQUIRED_KEYS if SPEC_KEYS[k][0] not in values]
    if missing:
        raise ValueError(f"model {text}: missing {', '.join(missing)}; {accepted}")
    try:
        return LlamaConfig(**values)
    except ValueError as exc:
        raise ValueError(f"model {text}: {str(exc).removeprefix('LlamaConfig: ')}") from None


def model_config(text: str) -> LlamaConfig:
    """The configuration a grid name or a spec names; a one-line ValueError otherwise."""
    if text in CONFIGS:
        return CONFIGS[text]
    if is_model_spec(text):
        return parse_model_spec(text)
    close = difflib.get_close_matches(text, CONFIGS, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ValueError(f"unknown model '{text}'.{hint} Grid: {', '.join(sorted(CONFIGS))}; or {SPEC_FORM}")


def parse_tokens(text: str) -> tuple[int, int]:
    """(batch, seq) of ``BxS``; a one-line ValueError otherwise."""
    match = _TOKENS.fullmatch(text.strip())
    if not match or not all(int(v) >= 1 for v in match.groups()):
        raise ValueError(f"{text}: expected BATCHxSEQ with both at least 1, e.g. 4x2048")
    return int(match.group(1)), int(match.group(2))


def fit_seq(config: LlamaConfig, seq: int) -> LlamaConfig:
    """``config`` with room for ``seq`` positions (its rotary table grows to fit)."""
    return config if seq <= config.max_seq else dataclasses.replace(config, max_seq=seq)
