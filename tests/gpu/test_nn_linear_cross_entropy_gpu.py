"""kernelbench.nn.linear_cross_entropy on the GPU: bf16 at the vocabularies of Llama-3 and Qwen2.5
against the fp32 plain loss (loss and both gradients), several chunk counts, fp16 / fp32 inputs,
a peak memory below the plain loss's, no device-to-host sync, and torch.compile (Inductor,
fullgraph, no recompilation) equal to eager."""

import pytest
import torch

from kernelbench.nn import LinearCrossEntropyLoss, linear_cross_entropy
from kernelbench.nn.linear_crossentropy import linear_cross_entropy_ref

pytestmark = pytest.mark.gpu


def make(n, h, v, dtype, seed, ignored=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, device="cuda").to(dtype).requires_grad_(True)
    weight = (2 / h ** 0.5 * torch.randn(v, h, generator=gen, device="cuda")).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=gen, device="cuda")
    if ignored:  # padding: the last rows carry no label
        targets[n - ignored:] = -100
    return hidden, weight, targets


def rel_fro(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def against_reference(hidden, weight, targets, reduction="mean", chunk_rows=None):
    grad = torch.tensor(1.7, device="cuda")
    loss = linear_cross_entropy(hidden, weight, targets, reduction=reduction, chunk_rows=chunk_rows)
    loss.backward(grad)
    ref_h = hidden.detach().float().requires_grad_(True)
    ref_w = weight.detach().float().requires_grad_(True)
    ref = linear_cross_entropy_ref(ref_h, ref_w, targets, -100, reduction)
    ref.backward(grad)
    return (loss.detach(), hidden.grad, weight.grad), (ref.detach(), ref_h.grad, ref_w.grad)


@pytest.mark.parametrize("n, h, v", [(4096, 2048, 128256), (4096, 896, 151936)], ids=["llama3-1b", "qwen2.5-0.5b"])
@pytest.mark.parametrize("chunk_rows", [None, 1000], ids=["rule", "ragged-1000"])
def test_bf16_matches_fp32_reference(n, h, v, chunk_rows):
    hidden, weight, targets = make(n, h, v, torch.bfloat16, 0, ignored=n // 16)
    (loss, dh, dw), (ref, ref_dh, ref_dw) = against_reference(hidden, weight, targets, chunk_rows=chunk_rows)
    assert loss.dtype == torch.float32 and dh.dtype == dw.dtype == torch.bfloat16
    # The logits are rounded to bf16 before the fp32 loss, as in the plain bf16 loss.
    torch.testing.assert_close(loss, ref, rtol=2e-4, atol=0)
    assert rel_fro(dh, ref_dh) <= 1.5e-2 and rel_fro(dw, ref_dw) <= 1.5e-2
    assert torch.equal(dh[n - n // 16:], torch.zeros_like(dh[n - n // 16:]))


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 3e-3), (torch.float32, 1e-5)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fp16_fp32_and_sum(dtype, tol, reduction, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 GEMMs in fp32
    hidden, weight, targets = make(3000, 512, 32000, dtype, 1, ignored=17)
    (loss, dh, dw), (ref, ref_dh, ref_dw) = against_reference(hidden, weight, targets, reduction, chunk_rows=1024)
    torch.testing.assert_close(loss, ref, rtol=2e-4, atol=0)
    assert rel_fro(dh, ref_dh) <= tol and rel_fro(dw, ref_dw) <= tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("upstream", [1.0, 1.7, 2.0 ** -14])
def test_backward_in_place_equals_out_of_place_bit_for_bit(dtype, upstream):
    """The scaling a backward that runs once does in place (nothing where the upstream gradient is
    1) rounds as torch's ``dw * grad.to(dw.dtype)`` does, on the GPU's own casts."""
    from kernelbench.nn.linear_crossentropy import host

    gen = torch.Generator(device="cuda").manual_seed(4)
    dh = torch.randn(4096, 896, generator=gen, device="cuda").to(dtype)
    dw = torch.randn(151936 + 3, 64, generator=gen, device="cuda").to(dtype)  # not a whole block
    grad = torch.tensor(upstream, device="cuda")
    want = host.backward(grad, dh, dw)
    got = host.backward_in_place(grad, dh.clone(), dw.clone())
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def _peak_bytes(fn):
    """Peak memory of one forward+backward above what was allocated before it (inputs and the
    gradients' buffers of an earlier step already freed)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def test_peak_memory_below_the_plain_loss():
    hidden, weight, targets = make(8192, 2048, 128256, torch.bfloat16, 2)

    def step(loss_fn):
        def run():
            loss_fn(hidden, weight, targets).backward()
            hidden.grad = weight.grad = None
        return run

    fused = _peak_bytes(step(lambda h, w, t: linear_cross_entropy(h, w, t)))
    plain = _peak_bytes(step(lambda h, w, t: linear_cross_entropy_ref(h, w, t)))
    logits_fp32 = 8192 * 128256 * 4
    # The plain loss holds at least the fp32 logits; the fused one a chunk's bf16 logits and the grads.
    assert plain > logits_fp32
    assert fused < plain / 2, f"fused peak {fused / 2**30:.2f} GiB, plain {plain / 2**30:.2f} GiB"


def test_no_device_to_host_sync():
    hidden, weight, targets = make(2048, 512, 32000, torch.bfloat16, 3, ignored=5)

    def steps():
        for reduction in ("mean", "sum"):
            linear_cross_entropy(hidden, weight, targets, reduction=reduction, chunk_rows=700).backward()

    steps()  # compile and cache every launch first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call now raises
    try:
        steps()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


class Head(torch.nn.Module):
    """The end of a language model: the vocabulary projection's weight and the fused loss."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
        self.loss = LinearCrossEntropyLoss(chunk_rows=700)

    def forward(self, h, targets):
        return self.loss(h, self.proj.weight, targets)


def test_inductor_fullgraph_matches_eager_without_recompiling():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    head = Head(512, 32000)
    compiled = torch.compile(head, fullgraph=True)
    counters.clear()
    for step in range(3):
        gen = torch.Generator(device="cuda").manual_seed(step)
        h = torch.randn(4, 512, 512, generator=gen, device="cuda").bfloat16()
        targets = torch.randint(0, 32000, (4, 512), generator=gen, device="cuda")
        targets[:, -1] = -100
        results = []
        for f in (compiled, head):
            x = h.clone().requires_grad_(True)
            loss = f(x, targets)
            loss.backward()
            results.append([loss.detach(), x.grad, head.proj.weight.grad])
            head.zero_grad(set_to_none=True)
        # Same op body, same kernels: only the upstream gradient's scaling may be fused differently.
        torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
        for a, b in zip(results[0][1:], results[1][1:]):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
