"""Muon (kernelbench.optim.muon) against MuonReference in the Triton interpreter.

The reference runs the same algorithm one parameter at a time with torch's bf16 matmuls; Muon
batches same-shape weights through kernelbench's kernels. Both iterate in bf16 and round
differently, so parameters are compared by relative Frobenius error (bf16 tolerance), while the
momentum buffers (no Newton-Schulz in them) must agree to fp32 rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch

from kernelbench.ops import get_op
from kernelbench.optim.muon import Muon, MuonReference, muon_param_groups, update_scale


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def make_params(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [("embed", (40, 16)), ("a.w", (24, 16)), ("b.w", (24, 16)), ("c.w", (16, 40)),
              ("norm", (16,)), ("head", (40, 16))]
    return [(n, torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02)) for n, s in shapes]


def grads_for(params, step: int):
    gen = torch.Generator().manual_seed(1000 + step)
    for _, p in params:
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("nesterov", [True, False])
def test_parity_with_reference_over_20_steps(nesterov):
    hp = dict(lr=0.02, momentum=0.95, nesterov=nesterov, weight_decay=0.01, adamw_lr=3e-4, adamw_weight_decay=0.01)
    ours_params, ref_params = make_params(), make_params()
    ours = Muon(muon_param_groups(ours_params), **hp)
    ref = MuonReference(muon_param_groups(ref_params), **hp)
    for step in range(20):
        grads_for(ours_params, step)
        grads_for(ref_params, step)
        ours.step()
        ref.step()
    assert ours.adamw_backend in ("TritonAdamW", "torch.optim.AdamW")
    for (name, p), (_, q) in zip(ours_params, ref_params):
        if p.dim() == 2 and name not in ("embed", "head"):
            err = rel_fro(p, q)
            assert err < 2.5e-2, f"{name}: relative Frobenius error {err:.2e} after 20 steps"
            buf, ref_buf = ours.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"]
            torch.testing.assert_close(buf, ref_buf, rtol=1e-6, atol=1e-7)
        else:  # AdamW side: TritonAdamW follows torch AdamW(foreach=False) to fp32 rounding
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=f"{name} (AdamW path)")
            torch.testing.assert_close(ours.state[p]["exp_avg"], ref.state[q]["exp_avg"], rtol=1e-5, atol=1e-8)


def test_single_step_math():
    """One step from zero momentum, by hand: buf = (1-m) g; nesterov u = lerp(g, buf, m)."""
    from kernelbench.newton_schulz import newton_schulz

    gen = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(torch.randn(48, 16, generator=gen) * 0.02)
    w0 = w.detach().clone()
    g = torch.randn(48, 16, generator=gen)
    w.grad = g.clone()
    opt = Muon([w], lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)
    opt.step()
    buf = 0.1 * g
    u = g + 0.9 * (buf - g)
    expected = w0 * (1 - 0.05 * 0.1) - 0.05 * update_scale(w.shape) * newton_schulz(u, path="classic")
    assert update_scale(w.shape) == pytest.approx(3 ** 0.5)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-5, atol=1e-6)


def test_same_shape_weights_share_one_momentum_stack():
    params = make_params()
    opt = Muon(muon_param_groups(params))
    grads_for(params, 0)
    opt.step()
    a, b = opt.state[params[1][1]]["momentum_buffer"], opt.state[params[2][1]]["momentum_buffer"]
    assert a._base is not None and a._base is b._base, "(24, 16) weights should be slices of one stack"


def test_state_dict_round_trip():
    params, params2 = make_params(), make_params()
    opt = Muon(muon_param_groups(params))
    for step in range(2):
        grads_for(params, step)
        opt.step()
    opt2 = Muon(muon_param_groups(params2))
    with torch.no_grad():
        for (_, p), (_, q) in zip(params, params2):
            q.copy_(p)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.save / torch.load would
    grads_for(params, 2)
    grads_for(params2, 2)
    opt.step()
    opt2.step()
    for (name, p), (_, q) in zip(params, params2):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"{name} after resume")


def test_groups_and_bad_hyperparameters():
    params = make_params()
    groups = muon_param_groups(params)
    assert [p.shape for p in groups[0]["params"]] == [(24, 16), (24, 16), (16, 40)]
    assert {tuple(p.shape) for p in groups[1]["params"]} == {(40, 16), (16,)}
    # torch fills defaults into the group dicts it is given: fresh groups for each attempt.
    with pytest.raises(ValueError, match="momentum"):
        Muon(muon_param_groups(params), momentum=1.5)
    with pytest.raises(ValueError, match="ns_steps"):
        Muon(muon_param_groups(params), ns_steps=0)
    with pytest.raises(TypeError, match="unknown hyperparameters"):
        Muon(muon_param_groups(params), betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="ns_graph must be True or False; got 'yes'"):
        Muon(muon_param_groups(params), ns_graph="yes")


def test_registered_candidate_matches_reference_on_cpu_workload():
    """The op's parity path: candidate 'triton' against 'torch-reference' on `small`, 3 steps."""
    op = get_op("muon")
    workload = op.workload("small")
    tol = op.tolerance_for(op.get_candidate("triton"), torch.float32)
    ref = op.make_reference_case(workload, "cpu")
    cand = op.make_case(op.get_candidate("triton"), workload, "cpu")
    for step in range(3):
        for case in (ref, cand):
            case.set_step(step)
            case.prepare()
            case.run()
    expected, actual = ref.tensors(), cand.tensors()
    assert set(expected) == set(actual)
    for name, value in expected.items():
        if value.is_floating_point() and value.dim() > 0:
            assert rel_fro(actual[name], value) <= tol.fro, name


def test_workspace_bytes_count_the_graph_buffers_of_its_own_shapes(monkeypatch):
    """Muon counts, beside its state, the static buffers of the cached Newton-Schulz graphs of the
    (batch, rows, cols) calls it made: none on the CPU, and only its own shapes."""
    from kernelbench.newton_schulz import routing
    from kernelbench.train import optimizer_state_bytes

    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(8, 16, generator=gen)) for _ in range(2)]
    opt = Muon([{"params": params, "use_muon": True}], ns_path="torch", ns_graph=True)
    for p in params:
        p.grad = torch.randn(8, 16, generator=gen)
    opt.step()
    assert opt.workspace_bytes() == 0 and optimizer_state_bytes(opt) == 2 * 8 * 16 * 4

    class FakeCall:
        static_bytes = 1000

    key = ("torch", 5, 1e-7, (2, 8, 16), torch.float32, torch.device("cpu"), 0)
    monkeypatch.setitem(routing._GRAPHS, key, FakeCall())
    monkeypatch.setitem(routing._GRAPHS, key[:3] + ((3, 8, 16),) + key[4:], FakeCall())  # another shape
    assert opt.workspace_bytes() == 1000 and optimizer_state_bytes(opt) == 2 * 8 * 16 * 4 + 1000


@pytest.mark.parametrize("ns_graph, passed", [(False, False), (True, None)])
def test_newton_schulz_graphs_only_when_asked(monkeypatch, ns_graph, passed):
    """By default no call may replay a CUDA graph (whose static input and output would stay
    allocated between steps); ns_graph=True leaves the choice to the route."""
    import kernelbench.optim.muon as muon_module

    seen = []
    real = muon_module.newton_schulz

    def recording(G, steps, **kwargs):
        seen.append(kwargs.get("graph", "not given"))
        return real(G, steps, **kwargs)

    monkeypatch.setattr(muon_module, "newton_schulz", recording)
    params = make_params()
    opt = Muon(muon_param_groups(params), ns_graph=ns_graph)
    grads_for(params, 0)
    opt.step()
    assert seen and all(g is passed for g in seen), seen
    if not ns_graph:
        assert opt.workspace_bytes() == 0


def test_a_state_dict_without_ns_graph_loads_with_the_default():
    params = make_params()
    opt = Muon(muon_param_groups(params))
    grads_for(params, 0)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    for group in saved["param_groups"]:
        del group["ns_graph"]  # as written before the option existed
    params2 = make_params()
    opt2 = Muon(muon_param_groups(params2))
    opt2.load_state_dict(saved)
    assert all(group["ns_graph"] is False for group in opt2.param_groups)
    grads_for(params2, 1)
    opt2.step()  # the loaded groups step
