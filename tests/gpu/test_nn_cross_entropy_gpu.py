"""kernelbench.nn.cross_entropy on the GPU: bf16 logits at the Llama shapes against the fp32
reference (loss and gradient), fp16 / fp32 logits, no device-to-host sync in the forward or the
backward, and the loss behind a linear head compiled by Inductor (fullgraph, no graph break, no
recompilation) equal to eager."""

import pytest
import torch

from kernelbench.nn import cross_entropy
from kernelbench.nn.crossentropy import cross_entropy_ref_fp32

pytestmark = pytest.mark.gpu


def make(m, v, dtype, seed, ignored=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (2 * torch.randn(m, v, generator=gen, device="cuda")).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (m,), generator=gen, device="cuda")
    if ignored:  # padding: the last rows carry no label
        targets[m - ignored:] = -100
    return logits, targets


def against_reference(logits, targets, reduction):
    loss = cross_entropy(logits, targets, reduction=reduction, impl="triton")
    grad = torch.randn(loss.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    loss.backward(grad)
    ref_logits = logits.detach().float().requires_grad_(True)
    ref = cross_entropy_ref_fp32(ref_logits, targets, reduction=reduction)
    ref.backward(grad)
    return (loss.detach(), logits.grad), (ref.detach(), ref_logits.grad)


@pytest.mark.parametrize("m, v", [(8192, 32000), (4096, 128256), (64, 262144)],
                         ids=["llama-32k", "llama3-128k", "v262144"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bf16_matches_fp32_reference(m, v, reduction):
    logits, targets = make(m, v, torch.bfloat16, 0, ignored=m // 16)
    (loss, dx), (ref, ref_dx) = against_reference(logits, targets, reduction)
    assert loss.dtype == torch.float32 and dx.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref, rtol=2e-5, atol=1e-5)
    # One rounding of the fp32 gradient to bf16: element-wise relative, elements ~1 / (M * V).
    torch.testing.assert_close(dx.float(), ref_dx.bfloat16().float(), rtol=1e-2, atol=1e-12)
    assert torch.equal(dx[m - m // 16:], torch.zeros_like(dx[m - m // 16:]))


@pytest.mark.parametrize("dtype, rtol", [(torch.float16, 2e-3), (torch.float32, 1e-5)])
def test_fp16_and_fp32(dtype, rtol):
    logits, targets = make(1024, 32000, dtype, 2, ignored=7)
    (loss, dx), (ref, ref_dx) = against_reference(logits, targets, "sum")
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    # fp16 flushes gradients below its smallest subnormal: compared by the norm.
    err = (dx.double() - ref_dx.double()).norm() / ref_dx.double().norm()
    assert err <= rtol, f"relative Frobenius error {err:.3g} > {rtol}"


def test_no_device_to_host_sync():
    logits, targets = make(512, 32000, torch.bfloat16, 3, ignored=5)

    def steps():
        for reduction in ("mean", "sum", "none"):
            loss = cross_entropy(logits, targets, reduction=reduction, impl="triton")
            loss.backward(torch.ones_like(loss))

    steps()  # compile and cache every launch first
    logits.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call now raises
    try:
        steps()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(logits.grad).all()


class Head(torch.nn.Module):
    """The end of a language model: final hidden states, the vocabulary projection, the loss."""

    def __init__(self, hidden, vocab, impl):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
        self.impl = impl

    def forward(self, h, targets):
        return cross_entropy(self.proj(h), targets, impl=self.impl)


def _batch(seed, hidden=512, vocab=32000):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(4, 256, hidden, generator=gen, device="cuda").bfloat16()
    targets = torch.randint(0, vocab, (4, 256), generator=gen, device="cuda")
    targets[:, -1] = -100
    return h, targets


@pytest.mark.parametrize("impl", ["auto", "triton"])
def test_head_has_no_graph_break(impl):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(Head(512, 32000, impl))(*_batch(0))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_inductor_fullgraph_matches_eager_without_recompiling():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    head = Head(512, 32000, "triton")
    compiled = torch.compile(head, fullgraph=True)
    counters.clear()
    for step in range(3):
        h, targets = _batch(step)
        h = h.requires_grad_(True)
        loss = compiled(h, targets)
        loss.backward()
        got = [loss.detach(), h.grad, head.proj.weight.grad]
        head.zero_grad(set_to_none=True)
        h2 = h.detach().clone().requires_grad_(True)
        ref = head(h2, targets)
        ref.backward()
        want = [ref.detach(), h2.grad, head.proj.weight.grad]
        head.zero_grad(set_to_none=True)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
