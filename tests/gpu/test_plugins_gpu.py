"""The example plugin (examples/my_rmsnorm, on PYTHONPATH or installed) on a GPU, through
kernelbench.testing: its RMSNorm against kernelbench's rmsnorm reference at the sizes the GPU
workloads use and in a model; its add-silu op; kernelbench's own Triton RMSNorm through the same
helpers."""

import pytest

from kernelbench.ops import plugins
from kernelbench.testing import assert_parity, assert_trains_like

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def example_plugin():
    plugin = plugins.load("my_rmsnorm.plugin")
    assert plugin.error is None, plugin.error


@pytest.mark.parametrize("candidate", ["my-triton", "triton"])
def test_rmsnorm_parity_at_gpu_sizes(candidate):
    assert_parity("rmsnorm", candidate, steps=3, device="cuda",
                  workloads=["32768x4096-bf16", "4096x760:bf16", "256x16384:fp16", "64x256:fp32"])


def test_add_silu_parity_at_gpu_sizes():
    assert_parity("add-silu", "triton", workloads=["16384x4096-bf16", "1000x333:fp32"], steps=3, device="cuda")


@pytest.mark.parametrize("candidate", ["my-triton", "triton"])
def test_rmsnorm_trains_like_torchs_in_llama_7m(candidate):
    result = assert_trains_like("rmsnorm", candidate, steps=100, ref_seeds=2, device="cuda")
    final = result.outcomes[-1].verdict.final
    print(f"{candidate}: final loss {final:.4f}, band {result.band.low:.4f}..{result.band.high:.4f}")
