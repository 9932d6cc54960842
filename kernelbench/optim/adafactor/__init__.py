"""Adafactor with 8-bit state on kernelbench's Triton kernels, one concern per file:

- ``optimizer.py``: ``Adafactor8bit``, the ``torch.optim.Optimizer`` (param groups, hyperparameter
  checks, state layout and initialisation, checkpoints, FSDP2);
- ``host.py``: the state format's block sizes, ``LaunchConfig``, launch plans, the launches of a step
  (single-device and sharded), ``dequantize_state``;
- ``kernels.py``: the Triton kernels, with the math and the 8-bit encodings;
- ``reference.py``: ``AdafactorRef``, the pure-PyTorch fp32 reference.
"""

from .host import COL_BLOCK, FLAT_BLOCK, ROW_BLOCK, LaunchConfig, dequantize_state
from .optimizer import Adafactor8bit
from .reference import AdafactorRef

__all__ = ["COL_BLOCK", "FLAT_BLOCK", "ROW_BLOCK", "Adafactor8bit", "AdafactorRef", "LaunchConfig",
           "dequantize_state"]
