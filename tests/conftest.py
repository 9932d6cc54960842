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
