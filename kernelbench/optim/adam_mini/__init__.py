"""Adam-mini on kernelbench's Triton kernels, one concern per file:

- ``optimizer.py``: ``AdamMini``, the ``torch.optim.Optimizer`` (param groups, name sets, state,
  checkpoints, telemetry, FSDP2, the PyTorch path of strided blocks);
- ``partition.py``: which blocks each parameter is cut into (the official name sets, rules, presets);
- ``host.py``: ``LaunchConfig``, launch plans and launches, the plans of cross-rank statistics;
- ``kernels.py``: the Triton kernels and the fp8 format;
- ``reference.py``: the pure-PyTorch fp32 reference (``AdamMiniReference``, ``adam_mini_block_ref``).
"""

from .host import FP8_SCALE_BLOCK, LaunchConfig
from .optimizer import STATE_DTYPES, AdamMini
from .partition import Rule, partition_param
from .reference import AdamMiniReference, adam_mini_block_ref, round_to_e4m3_ref

__all__ = ["FP8_SCALE_BLOCK", "STATE_DTYPES", "AdamMini", "AdamMiniReference", "LaunchConfig", "Rule",
           "adam_mini_block_ref", "partition_param", "round_to_e4m3_ref"]
