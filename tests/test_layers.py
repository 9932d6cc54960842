"""The layering: each layer imports without the ones above it. Every module of a layer is imported
in a fresh interpreter, which then lists the kernelbench modules it loaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["kernelbench.optim", "kernelbench.nn", "kernelbench.newton_schulz", "kernelbench.models",
           "kernelbench.fast_launch"]
# Modules of the op layer that declare no op (the vocabulary, the op kinds, workloads written as
# shapes, the plugin loader).
OP_INFRASTRUCTURE = {"kernelbench.ops", "kernelbench.ops.base", "kernelbench.ops.function_op",
                     "kernelbench.ops.launched_op", "kernelbench.ops.optimizer_op", "kernelbench.ops.optim_workloads",
                     "kernelbench.ops.shapes", "kernelbench.ops.plugins"}
ABOVE_HARNESS = ("kernelbench.session", "kernelbench.report", "kernelbench.cli", "kernelbench.config",
                 "kernelbench.train")

PROBE = """
import importlib, json, os, pkgutil, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
def walk(name):
    module = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
for name in sys.argv[1:]:
    if name == "registry":
        importlib.import_module("kernelbench.ops").load_all()
    else:
        walk(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("kernelbench"))))
"""


def loaded(*names: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _under(modules: list[str], prefixes) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def _op_modules(modules: list[str]) -> list[str]:
    return [m for m in _under(modules, ["kernelbench.ops"]) if m not in OP_INFRASTRUCTURE]


@pytest.mark.parametrize("layer, forbidden", [
    (LIBRARY, ["kernelbench.ops", "kernelbench.harness", "kernelbench.distributed", *ABOVE_HARNESS]),
    # The registry with every op: the measuring machinery and everything above stay out (an op
    # that starts ranks imports the launcher of kernelbench.distributed and the Row type).
    (["registry"], ["kernelbench.harness.runner", "kernelbench.harness.timing", "kernelbench.distributed.worker",
                    *ABOVE_HARNESS]),
    (["kernelbench.harness", "kernelbench.distributed"], ABOVE_HARNESS),
    (["kernelbench.report"], ["kernelbench.session", "kernelbench.cli"]),
    (["kernelbench.session", "kernelbench.config"], ["kernelbench.cli"]),
], ids=["library", "ops", "harness", "report", "session"])
def test_a_layer_imports_without_the_layers_above(layer, forbidden):
    modules = loaded(*layer)
    assert not _under(modules, forbidden), _under(modules, forbidden)


def test_harness_distributed_and_session_know_no_op():
    """They drive ops through the Op interface and the registry, never one op module."""
    assert _op_modules(loaded("kernelbench.harness", "kernelbench.distributed", "kernelbench.session")) == []
