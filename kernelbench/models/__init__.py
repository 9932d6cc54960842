"""Models built in kernelbench for measuring layers and optimizers where they are used."""

from .llama import CONFIGS, LAYER_SETS, LAYER_SLOTS, Llama, LlamaConfig, layer_set_doc

__all__ = ["CONFIGS", "LAYER_SETS", "LAYER_SLOTS", "Llama", "LlamaConfig", "layer_set_doc"]
