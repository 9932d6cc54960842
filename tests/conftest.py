"""Test setup: without a GPU, Triton kernels run in the Triton interpreter.

TRITON_INTERPRET must be set before any module defining a @triton.jit kernel is imported, so it
is set here, at collection time, before the tests import kernelbench's kernels.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run on the GPU machine (scripts/gpu_run.sh gputests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_runtest_logreport(report):
    """KERNELBENCH_PRINT_FAILURES=1 (the GPU runs): a failure's report printed when it happens, so a
    session cut by its time limit still shows why each test failed."""
    if report.failed and os.environ.get("KERNELBENCH_PRINT_FAILURES"):
        print(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext[-4000:]}\n", flush=True)


def processes_mentioning(text: str) -> list[int]:
    """Every process but this one whose command line contains ``text`` (from /proc)."""
    from pathlib import Path

    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


@pytest.fixture(name="processes_mentioning")
def processes_mentioning_fixture():
    return processes_mentioning


@pytest.fixture
def registry_sandbox():
    """Whatever a test registers (plugins, scratch candidates) is gone after it, and the sources
    of what was there are restored: the registry is process-wide."""
    import sys

    from kernelbench.ops import load_all, plugins
    from kernelbench.ops.base import REGISTRY

    load_all()
    ops = dict(REGISTRY)
    candidates = {name: dict(op.candidates) for name, op in ops.items()}
    sources = {name: (op.source, {c: cand.source for c, cand in op.candidates.items()}) for name, op in ops.items()}
    tried = dict(plugins.PLUGINS)
    modules = set(sys.modules)
    yield REGISTRY
    REGISTRY.clear()
    REGISTRY.update(ops)
    for name, op in ops.items():
        op.candidates.clear()
        op.candidates.update(candidates[name])
        op.source = sources[name][0]
        for cand_name, source in sources[name][1].items():
            op.candidates[cand_name].source = source
    plugins.PLUGINS.clear()
    plugins.PLUGINS.update(tried)
    for name in set(sys.modules) - modules:
        if name.startswith("kernelbench_plugin_"):
            del sys.modules[name]


@pytest.fixture
def aot_graphs():
    """(backend, graphs): a torch.compile backend that runs AOTAutograd's partitioner and records
    the forward, then the backward graph's text, in the order compiled."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs: list[str] = []

    def record(g, _):
        graphs.append(str(g.graph))
        return make_boxed_func(g.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    torch._dynamo.reset()
    return backend, graphs
