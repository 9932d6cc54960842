"""Models built in kernelbench for measuring layers and optimizers where they are used.

The grid (:mod:`.grid`) and the configuration (:mod:`.config`) import without torch; the model
itself (:mod:`.llama`) is imported on first use of its names.
"""

from .config import LlamaConfig
from .grid import CONFIGS, GRID

__all__ = ["CONFIGS", "GRID", "LAYER_SETS", "LAYER_SLOTS", "Llama", "LlamaConfig", "layer_set_doc"]

_FROM_LLAMA = ("LAYER_SETS", "LAYER_SLOTS", "Llama", "layer_set_doc")


def __getattr__(name: str):
    if name in _FROM_LLAMA:
        from . import llama

        return getattr(llama, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
