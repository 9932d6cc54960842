"""The layers on a GPU other than the current one (a model spread over GPUs in one process, e.g.
Hugging Face's device_map): each entry point launches on its input's GPU, forward and backward, and
equals torch's layers there; ShardedAdamW (one process) steps its parameters' GPU. Two GPUs; device 0
stays current throughout."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


def _targets(n: int, device) -> torch.Tensor:
    return torch.arange(n, device=device) % 1000


def _rms_norm(impl, x, w):
    from kernelbench.nn.rmsnorm import rms_norm

    return rms_norm(x, w, residual=x * 0.5, impl=impl)[0]


def _silu_mul(impl, gate, up):
    from kernelbench.nn.swiglu import silu_mul

    return silu_mul(gate, up, impl=impl)


def _cross_entropy(impl, logits):
    from kernelbench.nn.crossentropy import cross_entropy

    return cross_entropy(logits, _targets(logits.shape[0], logits.device), impl=impl)


def _rotary(impl, q, k):
    from kernelbench.nn.rotary import apply_rotary

    gen = torch.Generator(device=q.device).manual_seed(1)
    cos, sin = (torch.randn(64, 64, generator=gen, device=q.device) for _ in range(2))
    q_out, k_out = apply_rotary(q, k, cos, sin, impl=impl)
    return torch.cat([q_out.flatten(), 0.5 * k_out.flatten()])


def _linear_cross_entropy(impl, hidden, weight):
    from kernelbench.nn import linear_cross_entropy

    targets = _targets(hidden.shape[0], hidden.device)
    if impl == "triton":
        return linear_cross_entropy(hidden, weight, targets)
    return torch.nn.functional.cross_entropy(hidden @ weight.T, targets)


# layer -> (call(impl, *inputs), the inputs' shapes); every input gets a gradient.
LAYERS = {
    "rms_norm": (_rms_norm, [(64, 512), (512,)]),
    "silu_mul": (_silu_mul, [(64, 1024), (64, 1024)]),
    "cross_entropy": (_cross_entropy, [(64, 1000)]),
    "apply_rotary": (_rotary, [(2, 4, 64, 64), (2, 2, 64, 64)]),
    "linear_cross_entropy": (_linear_cross_entropy, [(64, 256), (1000, 256)]),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_on_the_second_gpu_launches_there(layer):
    call, shapes = LAYERS[layer]
    gen = torch.Generator(device="cuda:1").manual_seed(0)
    with torch.cuda.device(0):
        inputs = [(0.1 * torch.randn(s, generator=gen, device="cuda:1")).requires_grad_(True) for s in shapes]
        out = call("triton", *inputs)
        out.float().sum().backward()
        torch.cuda.synchronize(1)
        assert out.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
        ref_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        ref = call("torch", *ref_inputs)
        ref.float().sum().backward()
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-4, atol=1e-4)
    for got, want in zip((t.grad for t in inputs), (t.grad for t in ref_inputs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_sharded_adamw_steps_parameters_on_the_second_gpu():
    from kernelbench.optim import ShardedAdamW

    gen = torch.Generator(device="cuda:1").manual_seed(0)
    with torch.cuda.device(0):
        params = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda:1")) for s in ((256, 64), (64,))]
        ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = ShardedAdamW(params, lr=1e-2, weight_decay=0.1, max_grad_norm=1.0)
        ref = torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.1, foreach=False)
        for _ in range(3):
            grads = [torch.randn(p.shape, generator=gen, device="cuda:1") for p in params]
            for p, q, g in zip(params, ref_params, grads):
                p.grad, q.grad = g.clone(), g.clone()
            opt.step()
            torch.nn.utils.clip_grad_norm_(ref_params, 1.0)
            ref.step()
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
