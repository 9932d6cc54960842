"""Muon's memory on a small Llama: what stays allocated after the first steps, against the reference."""

import gc

import pytest
import torch

from kernelbench.models import CONFIGS, Llama
from kernelbench.newton_schulz import clear_graph_cache
from kernelbench.optim.muon import Muon, MuonReference, muon_param_groups
from kernelbench.train import optimizer_state_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cuda_tensors() -> dict[int, torch.Tensor]:
    found = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            found[id(obj)] = obj
    return found


def _requested() -> int:
    # What tensors asked the allocator for, before its rounding: a large-pool block is not split
    # when 1 MiB or less would remain, so memory_allocated() may count up to 1 MiB more a tensor.
    return torch.cuda.memory_stats()["requested_bytes.all.current"]


def _held_after_steps(cls, steps: int = 3, **hyper):
    """(bytes requested and still held after ``steps`` steps of a fresh optimizer, the optimizer,
    Muon's parameters, the model)."""
    clear_graph_cache()
    gc.collect()  # an earlier run's garbage freed now, not inside this one's window
    with torch.device("cuda"):
        model = Llama(CONFIGS["llama-7m"])
    named = list(model.named_parameters())
    torch.cuda.synchronize()
    before = _requested()
    opt = cls(muon_param_groups(named), **hyper)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(steps):
        for _, p in named:
            p.grad = torch.randn(p.shape, device="cuda", generator=gen)
        opt.step()
        for _, p in named:
            p.grad = None
    torch.cuda.synchronize()
    n_muon = sum(p.numel() for p in opt.param_groups[0]["params"])
    return _requested() - before, opt, n_muon, model


@pytest.mark.parametrize("ns_graph", [False, True])
def test_muon_reports_what_it_holds(ns_graph):
    known = set(_cuda_tensors())
    held, opt, _, model = _held_after_steps(Muon, ns_graph=ns_graph)
    reported = optimizer_state_bytes(opt)
    # Every tensor the steps left alive is the model's, in the optimizer's state, one of the
    # graphs' static buffers (workspace_bytes()) or one of the launch tables (integers, a few KB).
    params = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    state = {t.untyped_storage().data_ptr() for s in [*opt.state.values(), *(opt._adamw.state.values() if opt._adamw
             else [])] for t in s.values() if isinstance(t, torch.Tensor)}
    other = {t.untyped_storage().data_ptr(): t for i, t in _cuda_tensors().items() if i not in known
             and t.untyped_storage().data_ptr() not in params | state}.values()
    tables = sum(t.untyped_storage().nbytes() for t in other if not t.is_floating_point())
    static = sum(t.untyped_storage().nbytes() for t in other if t.is_floating_point())
    assert tables <= 64 * 1024 and abs(static - opt.workspace_bytes()) <= 64 * 1024, (tables, static)
    assert abs(held - reported) <= 64 * 1024, (held, reported)


def test_muon_state_within_5_percent_of_the_reference():
    muon, _, _, _ = _held_after_steps(Muon)
    ref, _, _, _ = _held_after_steps(MuonReference)
    assert muon <= 1.05 * ref, (muon, ref)


def test_muon_with_graphs_holds_at_most_their_static_buffers_more():
    """ns_graph=True: each graph's fp32 input and output (8 B per Muon parameter) stay allocated."""
    muon, opt, n_muon, _ = _held_after_steps(Muon, ns_graph=True)
    workspace = opt.workspace_bytes()  # read before the next run clears the graph cache
    del opt
    ref, _, _, _ = _held_after_steps(MuonReference)
    assert workspace > 0
    assert muon <= ref + 8 * n_muon + 64 * 1024, (muon, ref, n_muon)
