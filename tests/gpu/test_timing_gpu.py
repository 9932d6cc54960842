"""GPU checks of the harness's CUDA timing: what a CUDA-graph replay contains."""

import pytest
import torch

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
