"""No layer hands a kernel the pointer of a tensor subclass (DTensor, a wrapper or quantized tensor):
impl="triton" is a clear error naming the type before any launch, impl="auto" takes torch's path
(CPU, Triton interpreter; launches counted at the interpreter's entry). The device guard every entry
point wears (a GPU other than the current one: tests/gpu/test_nn_other_device_gpu.py) takes its
first tensor by position or by keyword."""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks


class _Wrapped(torch.Tensor):
    """A tensor subclass whose data_ptr() the kernels must not trust."""


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(4, 16, generator=gen), "w": torch.randn(16, generator=gen),
        "gate": torch.randn(4, 32, generator=gen), "up": torch.randn(4, 32, generator=gen),
        "logits": torch.randn(4, 10, generator=gen), "targets": torch.randint(0, 10, (4,), generator=gen),
        "hidden": torch.randn(4, 16, generator=gen), "head": torch.randn(10, 16, generator=gen),
        "q": torch.randn(1, 2, 4, 8, generator=gen), "k": torch.randn(1, 2, 4, 8, generator=gen),
        "cos": torch.randn(4, 8, generator=gen), "sin": torch.randn(4, 8, generator=gen),
    }


def _layers(wrap):
    """name -> (call with impl, the torch reference); ``wrap`` makes the first tensor argument foreign."""
    from kernelbench.nn.crossentropy import cross_entropy
    from kernelbench.nn.rmsnorm import rms_norm
    from kernelbench.nn.rotary import apply_rotary
    from kernelbench.nn.swiglu import silu_mul

    t = _inputs()
    return {
        "rms_norm": (lambda impl: rms_norm(wrap(t["x"]), t["w"], impl=impl),
                     lambda: rms_norm(t["x"], t["w"], impl="torch")),
        "silu_mul": (lambda impl: silu_mul(wrap(t["gate"]), t["up"], impl=impl),
                     lambda: silu_mul(t["gate"], t["up"], impl="torch")),
        "cross_entropy": (lambda impl: cross_entropy(wrap(t["logits"]), t["targets"], impl=impl),
                          lambda: cross_entropy(t["logits"], t["targets"], impl="torch")),
        "apply_rotary": (lambda impl: apply_rotary(wrap(t["q"]), t["k"], t["cos"], t["sin"], impl=impl)[0],
                         lambda: apply_rotary(t["q"], t["k"], t["cos"], t["sin"], impl="torch")[0]),
    }


@pytest.fixture
def launches(monkeypatch) -> list[str]:
    from triton.runtime.interpreter import InterpretedFunction

    seen: list[str] = []
    run = InterpretedFunction.run

    def counting(self, *args, **kwargs):
        seen.append(getattr(self.fn, "__name__", "kernel"))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", counting)
    return seen


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


@pytest.mark.parametrize("layer", ["rms_norm", "silu_mul", "cross_entropy", "apply_rotary"])
def test_a_subclass_under_triton_is_an_error_naming_it_before_any_launch(layer, launches):
    call, _ = _layers(lambda t: t.as_subclass(_Wrapped))[layer]
    with pytest.raises(ValueError, match=rf"{layer}\(impl='triton'\): got a _Wrapped \(a tensor subclass"):
        call("triton")
    assert launches == []
    call_plain, _ = _layers(lambda t: t)[layer]
    call_plain("triton")  # the same call on plain tensors launches: the count above means something
    assert launches


@pytest.mark.parametrize("layer", ["rms_norm", "silu_mul", "cross_entropy", "apply_rotary"])
def test_a_subclass_under_auto_takes_torchs_path(layer, launches):
    call, reference = _layers(lambda t: t.as_subclass(_Wrapped))[layer]
    out = call("auto")
    assert launches == []
    torch.testing.assert_close(_plain(out), reference())


def test_rotary_in_place_and_linear_cross_entropy_with_a_subclass(launches):
    from kernelbench.nn import linear_cross_entropy
    from kernelbench.nn.linear_crossentropy import linear_cross_entropy_ref
    from kernelbench.nn.rotary import apply_rotary_

    t = _inputs()
    with pytest.raises(ValueError, match="apply_rotary_: got a _Wrapped"):
        apply_rotary_(t["q"].as_subclass(_Wrapped), t["k"], t["cos"], t["sin"])
    loss = linear_cross_entropy(t["hidden"], t["head"].as_subclass(_Wrapped), t["targets"])
    assert launches == []  # the fused op has no torch twin to name: it computes the reference
    torch.testing.assert_close(_plain(loss), linear_cross_entropy_ref(t["hidden"], t["head"], t["targets"]))


def test_a_parameter_is_plain(launches):
    from kernelbench.nn.rmsnorm import RMSNorm

    norm = RMSNorm(16, impl="triton")  # its weight an nn.Parameter: taken by the kernels
    torch.nn.init.normal_(norm.weight)
    x = _inputs()["x"]
    expected = torch.nn.functional.rms_norm(x, (16,), norm.weight.detach(), torch.finfo(x.dtype).eps)
    torch.testing.assert_close(norm(x), expected)
    assert launches


def _dtensor_rank(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from kernelbench.nn import linear_cross_entropy
    from kernelbench.nn.rmsnorm import rms_norm
    from kernelbench.nn.swiglu import silu_mul

    mesh = init_device_mesh("cpu", (world,))
    t = _inputs()
    report: dict = {}
    x, w = distribute_tensor(t["x"], mesh, [Shard(0)]), distribute_tensor(t["w"], mesh, [Replicate()])
    eps = torch.finfo(torch.float32).eps
    report["rms_norm_auto"] = (rms_norm(x, w, impl="auto").full_tensor()
                               - torch.nn.functional.rms_norm(t["x"], (16,), t["w"], eps)).abs().max().item()
    try:
        rms_norm(x, w, impl="triton")
        report["rms_norm_triton"] = "no error"
    except ValueError as exc:
        report["rms_norm_triton"] = str(exc)
    gate, up = (distribute_tensor(t[n], mesh, [Shard(0)]) for n in ("gate", "up"))
    report["silu_mul_auto"] = (silu_mul(gate, up).full_tensor()
                               - torch.nn.functional.silu(t["gate"]) * t["up"]).abs().max().item()
    hidden, head = distribute_tensor(t["hidden"], mesh, [Shard(0)]), distribute_tensor(t["head"], mesh, [Replicate()])
    targets = distribute_tensor(t["targets"], mesh, [Shard(0)])
    loss = linear_cross_entropy(hidden, head, targets)
    report["lce"] = type(loss).__name__
    return report


def test_dtensor_inputs_take_torchs_path_or_name_the_type():
    for report in run_ranks(_dtensor_rank, 2, timeout_s=120):
        assert report["rms_norm_auto"] < 1e-5 and report["silu_mul_auto"] < 1e-6, report
        assert "got a DTensor" in report["rms_norm_triton"] and ".to_local()" in report["rms_norm_triton"]
        assert report["lce"] == "DTensor", report


def test_the_device_guard_takes_the_first_tensor_by_keyword_too():
    from kernelbench.nn import linear_cross_entropy
    from kernelbench.nn.crossentropy import cross_entropy
    from kernelbench.nn.rmsnorm import rms_norm
    from kernelbench.nn.rotary import apply_rotary
    from kernelbench.nn.swiglu import silu_mul

    t = _inputs()
    torch.testing.assert_close(rms_norm(x=t["x"], weight=t["w"], impl="triton"), rms_norm(t["x"], t["w"], impl="torch"))
    torch.testing.assert_close(silu_mul(gate=t["gate"], up=t["up"], impl="triton"),
                               silu_mul(t["gate"], t["up"], impl="torch"))
    torch.testing.assert_close(cross_entropy(logits=t["logits"], targets=t["targets"], impl="triton"),
                               cross_entropy(t["logits"], t["targets"], impl="torch"))
    torch.testing.assert_close(apply_rotary(q=t["q"], k=t["k"], cos=t["cos"], sin=t["sin"], impl="triton")[0],
                               apply_rotary(t["q"], t["k"], t["cos"], t["sin"], impl="torch")[0])
    torch.testing.assert_close(linear_cross_entropy(hidden=t["hidden"], weight=t["head"], targets=t["targets"]),
                               linear_cross_entropy(t["hidden"], t["head"], t["targets"]))
    for fn in (rms_norm, silu_mul, cross_entropy, apply_rotary, linear_cross_entropy):
        assert fn.__wrapped__.__name__ == fn.__name__  # the guard keeps the name and docstring users read
