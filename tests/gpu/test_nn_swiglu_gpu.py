"""GPU checks of kernelbench.nn.silu_mul: bf16 accuracy against the fp32 reference at the Llama-1B
MLP shape (one rounding, so never worse than eager bf16's two), fp16 / fp32 and odd sizes, a
tensor past 2^31 elements (int64 offsets), and a Llama MLP under Inductor (fullgraph, no graph
break, no recompilation, outputs and gradients equal to eager)."""

import pytest
import torch
import torch.nn.functional as F

from kernelbench.nn import silu_mul
from kernelbench.nn.swiglu import host, silu_mul_ref_fp32

pytestmark = pytest.mark.gpu


def rel_fro(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def fp32_reference(gate, up, dy):
    g, u = gate.detach().float().requires_grad_(True), up.detach().float().requires_grad_(True)
    out = silu_mul_ref_fp32(g, u)
    out.backward(dy.float())
    return out.detach(), g.grad, u.grad


def draw(shape, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    gate = (2 * torch.randn(shape, generator=gen, device="cuda")).to(dtype).requires_grad_(True)
    up = torch.randn(shape, generator=gen, device="cuda").to(dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    return gate, up, dy


# (rtol, atol): the result is the fp32 value rounded once, so within one ulp of the storage dtype.
ONE_ROUNDING = {torch.bfloat16: (2**-8, 1e-6), torch.float16: (2**-11, 1e-6), torch.float32: (1e-5, 1e-6)}


@pytest.mark.parametrize("shape, dtype", [
    ((8192, 8192), torch.bfloat16),  # Llama-1B MLP, batch 4 x 2048 tokens
    ((4, 2048, 8192), torch.bfloat16),  # the same as the model's 3-D activations
    ((5, 123, 123), torch.bfloat16),  # the masked tail
    ((1000, 4100), torch.float16),
    ((1000, 4100), torch.float32),
])
def test_matches_fp32_reference(shape, dtype):
    gate, up, dy = draw(shape, dtype, seed=0)
    out = silu_mul(gate, up, impl="triton")
    out.backward(dy)
    rtol, atol = ONE_ROUNDING[dtype]
    for name, got, want in zip(("out", "dgate", "dup"), (out.detach(), gate.grad, up.grad),
                               fp32_reference(gate, up, dy)):
        assert got.dtype == dtype and got.shape == want.shape, name
        # fp32 math with ex2.approx / div.full: a little slack over exactly one rounding.
        torch.testing.assert_close(got.float(), want, rtol=1.5 * rtol, atol=atol, msg=name)


def test_bf16_error_no_worse_than_eager():
    gate, up, dy = draw((8192, 8192), torch.bfloat16, seed=1)
    out = silu_mul(gate, up, impl="triton")
    out.backward(dy)
    ours = (out.detach(), gate.grad.clone(), up.grad.clone())
    gate.grad = up.grad = None
    eager = F.silu(gate) * up
    eager.backward(dy)
    theirs = (eager.detach(), gate.grad, up.grad)
    for name, a, b, want in zip(("out", "dgate", "dup"), ours, theirs, fp32_reference(gate, up, dy)):
        assert rel_fro(a, want) <= rel_fro(b, want) * 1.01, (name, rel_fro(a, want), rel_fro(b, want))


def test_past_two_to_the_31_elements():
    """int64 offsets: the last rows of a 2^31 + 2^15 element tensor are computed, not wrapped."""
    rows, cols = 2**16 + 1, 2**15
    gate = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16).normal_(0, 2)
    up = torch.empty_like(gate).normal_()
    out = host.forward(gate, up)
    tail = slice(rows - 2, rows)
    torch.testing.assert_close(out[tail].float(), silu_mul_ref_fp32(gate[tail].float(), up[tail].float()),
                               rtol=2**-7, atol=1e-6)
    del out
    dy = torch.empty_like(gate).normal_()
    dgate, dup = host.backward(dy, gate, up)
    _, dg_ref, du_ref = fp32_reference(gate[tail], up[tail], dy[tail])
    torch.testing.assert_close(dgate[tail].float(), dg_ref, rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(dup[tail].float(), du_ref, rtol=2**-7, atol=1e-6)


class MLP(torch.nn.Module):
    def __init__(self, impl, hidden=1024, intermediate=2816):
        super().__init__()
        self.impl = impl
        kw = dict(bias=False, device="cuda", dtype=torch.bfloat16)
        self.gate_proj = torch.nn.Linear(hidden, intermediate, **kw)
        self.up_proj = torch.nn.Linear(hidden, intermediate, **kw)
        self.down_proj = torch.nn.Linear(intermediate, hidden, **kw)

    def forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x), impl=self.impl))


def _x(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(4, 256, 1024, generator=gen, device="cuda").bfloat16().requires_grad_(True)


@pytest.mark.parametrize("impl", ["auto", "triton"])
def test_mlp_has_no_graph_break(impl):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(MLP(impl))(_x(0))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_inductor_fwd_bwd_matches_eager_without_recompiling():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = MLP("triton")
    compiled = torch.compile(mlp, fullgraph=True)
    counters.clear()
    for step in range(3):
        x = _x(step)
        out = compiled(x)
        out.float().square().mean().backward()
        got = [out.detach(), x.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        x2 = x.detach().clone().requires_grad_(True)
        ref = mlp(x2)
        ref.float().square().mean().backward()
        want = [ref.detach(), x2.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        for a, b in zip(got, want):
            assert rel_fro(a, b) < 1e-2, f"step {step}: relative error {rel_fro(a, b)}"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_compiled_swiglu_backward_writes_dgate_over_dy_and_peaks_no_higher_than_torch():
    """Inductor hands the down projection's gradient to the in-place backward kernel itself (no
    clone), so the compiled MLP's fwd+bwd peak is at most torch's layers' compiled."""
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    peaks = {}
    for impl in ("torch", "triton"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        mlp = MLP(impl)
        compiled = torch.compile(mlp, fullgraph=True)

        def step(compiled=compiled):
            compiled(x).float().square().mean().backward()

        _, codes = run_and_get_code(step)  # compiles and runs once
        if impl == "triton":
            assert "_silu_mul_bwd_in_place_kernel" in codes[-1] and "clone" not in codes[-1], codes[-1]
        mlp.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peaks[impl] = torch.cuda.max_memory_allocated() - base
    assert peaks["triton"] <= peaks["torch"], peaks
