"""Models built in kernelbench for measuring layers and optimizers where they are used."""

from .llama import CONFIGS, LAYER_SETS, Llama, LlamaConfig

__all__ = ["CONFIGS", "LAYER_SETS", "Llama", "LlamaConfig"]
