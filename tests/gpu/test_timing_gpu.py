"""GPU checks of the harness's CUDA timing: what a CUDA-graph replay contains, and the host time
per call that flags a row host-bound."""

import time

import pytest
import torch

from kernelbench.harness.runner import HOST_BOUND_SHARE
from kernelbench.harness.timing import TimingConfig, time_cuda

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("flush_l2", [False, True])
def test_cuda_graph_backward_writes_grad_instead_of_accumulating(flush_l2):
    """A forward+backward graph is captured from the state prepare() leaves (grad None), as every
    eager rep starts: each replay then writes x.grad, so after any number of replays it holds one
    call's gradient. Captured after the warm-up without that, it would add to it every replay."""
    x = torch.ones(1024, device="cuda", requires_grad=True)

    def prepare():
        x.grad = None

    def fn():
        (x * 3.0).sum().backward()

    sample = time_cuda(fn, prepare, TimingConfig(warmup_ms=1, rep_ms=2, cuda_graph=True, flush_l2=flush_l2))
    assert sample.mode.startswith("cuda-graph")
    assert len(sample.times) >= 1
    torch.cuda.synchronize()
    assert torch.equal(x.grad, torch.full_like(x, 3.0)), f"x.grad after the replays: {x.grad[:4].tolist()}"


def test_host_time_of_a_device_bound_call_of_many_launches_is_not_its_device_time():
    """300 launches of a GPU spin per call: back to back the launch queue fills and the host
    waits there for the GPU, which must not read as host time (nor flag the row host-bound)."""

    def fn():
        for _ in range(300):
            torch.cuda._sleep(50_000)

    sample = time_cuda(fn, config=TimingConfig(warmup_ms=20, rep_ms=300, flush_l2=False))
    device_ms = sorted(sample.times)[len(sample.times) // 2]
    assert sample.host_ms < 0.5 * device_ms, (sample.host_ms, device_ms)


def test_host_time_of_a_host_bound_call_is_counted():
    """2 ms of host work before one short kernel: the GPU waits for the host every call."""
    x = torch.ones(1024, device="cuda")

    def fn():
        time.sleep(0.002)
        x.mul_(1.0)

    sample = time_cuda(fn, config=TimingConfig(warmup_ms=10, rep_ms=100, flush_l2=False))
    device_ms = sorted(sample.times)[len(sample.times) // 2]
    assert sample.host_ms >= 1.9 and sample.host_ms >= HOST_BOUND_SHARE * device_ms, (sample.host_ms, device_ms)
