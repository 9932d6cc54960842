"""kernelbench.nn inside torch.compile (Inductor) on the GPU: no graph break for impl="auto" and
"triton" on a block (RMSNorm with residual, linear, rotary, RMSNorm), no recompilation over five
fwd+bwd steps on fresh same-shape inputs, compiled outputs and gradients equal to eager, and the
Llama model compiled whole (fullgraph) with kernelbench layers, also under bf16 autocast."""

import pytest
import torch

from kernelbench.models import CONFIGS, Llama
from kernelbench.nn import RMSNorm, apply_rotary

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM = 16, 64
HIDDEN = HEADS * HEAD_DIM


class Block(torch.nn.Module):
    def __init__(self, impl, dtype):
        super().__init__()
        self.impl = impl
        self.norm1 = RMSNorm(HIDDEN, impl=impl, device="cuda", dtype=dtype)
        self.proj = torch.nn.Linear(HIDDEN, 2 * HIDDEN, device="cuda", dtype=dtype)
        self.norm2 = RMSNorm(HIDDEN, impl=impl, device="cuda", dtype=dtype)

    def forward(self, x, residual, cos, sin):
        b, s, _ = x.shape
        y, h = self.norm1(x, residual)
        q, k = self.proj(y).view(b, s, 2 * HEADS, HEAD_DIM).transpose(1, 2).chunk(2, dim=1)
        q, k = apply_rotary(q, k, cos, sin, impl=self.impl)
        return self.norm2((q + k).transpose(1, 2).reshape(b, s, HIDDEN)) + h


def _inputs(seed, dtype, batch=4, seq=256):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, seq, HIDDEN, generator=gen, device="cuda").to(dtype).requires_grad_(True)
    r = torch.randn(batch, seq, HIDDEN, generator=gen, device="cuda").to(dtype).requires_grad_(True)
    angles = torch.rand(seq, HEAD_DIM, generator=gen, device="cuda") * 6
    return x, r, angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("impl", ["auto", "triton"])
def test_block_has_no_graph_break(impl):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(Block(impl, torch.bfloat16))(*_inputs(0, torch.bfloat16))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_five_compiled_steps_match_eager_without_recompiling(dtype, tol):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block("triton", dtype)
    compiled = torch.compile(block, fullgraph=True)
    counters.clear()
    for step in range(5):
        x, r, cos, sin = _inputs(step, dtype)
        out = compiled(x, r, cos, sin)
        out.float().square().mean().backward()
        got = [out.detach(), x.grad, r.grad] + [p.grad for p in block.parameters()]
        block.zero_grad(set_to_none=True)
        x2, r2 = x.detach().clone().requires_grad_(True), r.detach().clone().requires_grad_(True)
        ref = block(x2, r2, cos, sin)
        ref.float().square().mean().backward()
        want = [ref.detach(), x2.grad, r2.grad] + [p.grad for p in block.parameters()]
        block.zero_grad(set_to_none=True)
        for a, b in zip(got, want):
            err = ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
            assert err < tol, f"step {step}: relative error {err}"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


@pytest.mark.parametrize("autocast", [False, True])
def test_llama_compiles_whole_with_kernelbench_layers(autocast):
    torch._dynamo.reset()
    cfg = CONFIGS["llama-7m"]
    torch.manual_seed(0)
    ours = Llama(cfg, "kernelbench", impl="triton").cuda()
    if not autocast:
        ours = ours.bfloat16()
    tokens = torch.randint(0, cfg.vocab_size, (2, 129), device="cuda")

    def step(loss_fn):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        grads = [p.grad.clone() for p in ours.parameters()]
        ours.zero_grad(set_to_none=True)
        return loss.detach(), grads

    eager_loss, eager_grads = step(ours.loss)
    compiled_loss, compiled_grads = step(torch.compile(ours.loss, fullgraph=True))
    assert abs(compiled_loss.item() - eager_loss.item()) < 2e-2 * abs(eager_loss.item())
    for (name, _), a, b in zip(ours.named_parameters(), compiled_grads, eager_grads):
        err = ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
        assert err < 5e-2, f"{name}: relative error {err}"

