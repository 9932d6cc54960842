"""Former home of Newton-Schulz, now ``kernelbench.newton_schulz``: kept only until
``kernelbench/ops/muon_ns.py`` imports from there."""

from kernelbench.newton_schulz import *  # noqa: F403
from kernelbench.newton_schulz import __all__  # noqa: F401
