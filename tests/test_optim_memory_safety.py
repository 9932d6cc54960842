"""No kernel receives the address of a tensor nobody checked: tensor subclasses, meta tensors,
views whose storage is too small and unsupported DTensor layouts are clear errors naming the
parameter, raised before any launch (CPU, Triton interpreter)."""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.spawn import run_ranks


class _Subclass(torch.Tensor):
    """A tensor subclass whose data_ptr() the kernels must not trust."""


def _adamw(params):
    from kernelbench.optim import TritonAdamW

    return TritonAdamW(params, lr=1e-3)


def _adam_mini(params):
    from kernelbench.optim import AdamMini

    return AdamMini([(f"layers.{i}.mlp.weight", p) for i, p in enumerate(params)], lr=1e-3, dim=8, n_heads=2,
                    verbose=False)


def _muon(params):
    from kernelbench.optim import Muon

    return Muon([{"params": params, "use_muon": True}], lr=0.02)


def _adafactor(params):
    from kernelbench.optim import Adafactor8bit

    return Adafactor8bit(params, lr=1e-2)


OPTIMIZERS = {"TritonAdamW": _adamw, "AdamMini": _adam_mini, "Muon": _muon, "Adafactor8bit": _adafactor}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_tensor_subclass_parameter_is_refused_before_any_launch(name):
    p = torch.nn.Parameter(torch.randn(8, 8).as_subclass(_Subclass))
    p.grad = torch.randn(8, 8).as_subclass(_Subclass)
    before = p.detach().clone().as_subclass(torch.Tensor)
    opt = OPTIMIZERS[name]([p])
    with pytest.raises((TypeError, ValueError), match="subclass|_Subclass"):
        opt.step()
    assert torch.equal(p.detach().as_subclass(torch.Tensor), before)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_meta_parameters_are_refused(name):
    p = torch.nn.Parameter(torch.empty(8, 8, device="meta"))
    p.grad = torch.empty(8, 8, device="meta")
    opt = OPTIMIZERS[name]([p])
    with pytest.raises((ValueError, RuntimeError), match="meta"):
        opt.step()


@pytest.mark.parametrize("name", ["TritonAdamW", "AdamMini"])
def test_a_view_whose_storage_was_freed_is_refused(name):
    # FSDP2 frees unsharded parameters by resizing their storage to zero: a view left pointing into
    # one must not reach a kernel.
    base = torch.randn(128)
    p = torch.nn.Parameter(base[64:].view(8, 8))
    p.grad = torch.randn(8, 8)
    opt = OPTIMIZERS[name]([p])
    base.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="storage of 0 bytes"):
        opt.step()


def test_adamw_step_flat_refuses_a_subclass():
    from kernelbench.optim.adamw import adamw_step_flat

    tensors = [torch.zeros(16) for _ in range(4)]
    tensors[1] = tensors[1].as_subclass(_Subclass)
    with pytest.raises(TypeError, match="_Subclass"):
        adamw_step_flat(*tensors, torch.zeros(()), lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


def test_newton_schulz_refuses_a_subclass():
    from kernelbench.newton_schulz import newton_schulz

    with pytest.raises(TypeError, match="plain tensor"):
        newton_schulz(torch.randn(8, 8).as_subclass(_Subclass), 5, path="torch")


def _unsupported_layouts(rank: int, world: int) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    messages = []
    for name, make in sorted(OPTIMIZERS.items()):
        full = torch.randn(8, 8)
        p = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(1)]))  # tensor parallel, not FSDP
        p.grad = distribute_tensor(torch.randn(8, 8), mesh, [Shard(1)])
        try:
            make([p]).step()
            messages.append(f"{name}: no error")
        except (ValueError, TypeError) as e:
            messages.append(f"{name}: {e}")
        q = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
        q.grad = distribute_tensor(torch.randn(8, 8), mesh, [Replicate()])  # a gradient of another layout
        try:
            make([q]).step()
            messages.append(f"{name}: no error")
        except (ValueError, TypeError) as e:
            messages.append(f"{name}: {e}")
    return messages


def test_unsupported_dtensor_layouts_are_clear_errors():
    messages = run_ranks(_unsupported_layouts, 2, timeout_s=120)[0]
    for message in messages:
        assert "no error" not in message, message
    shard1 = messages[0::2]
    grads = messages[1::2]
    assert all("Shard(0)" in m and "placements" in m for m in shard1), shard1
    assert all("gradient" in m for m in grads), grads
