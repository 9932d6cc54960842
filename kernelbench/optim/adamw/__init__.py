"""TritonAdamW on kernelbench's Triton kernels, one concern per file:

- ``optimizer.py``: ``TritonAdamW``, the ``torch.optim.Optimizer`` (param groups, state, checkpoints, FSDP2);
- ``host.py``: launch constants, launch plans, ``StepIncrementer``, scalar packing, ``adamw_step_flat``;
- ``kernels.py``: the Triton kernels, with the math and why they match torch bit for bit.
"""

from .host import BLOCK, StepIncrementer, adamw_step_flat, reciprocal_in_fp64
from .optimizer import TritonAdamW

__all__ = ["BLOCK", "StepIncrementer", "TritonAdamW", "adamw_step_flat", "reciprocal_in_fp64"]
