"""Without a GPU, the Triton kernels run in the Triton interpreter, which must be switched on
before the module defining them is imported.

The package is meant to be installed (`pip install -e examples/my_rmsnorm`), which registers its
entry point. kernelbench's own test suite also collects these tests where it is not installed:
then the plugin is loaded from the source folder, as `--plugin my_rmsnorm.plugin` would."""

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    importlib.metadata.distribution("my-rmsnorm")
except importlib.metadata.PackageNotFoundError:
    from kernelbench.ops import plugins

    if importlib.util.find_spec("my_rmsnorm") is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    assert plugins.load("my_rmsnorm.plugin").error is None, plugins.errors()
