"""Newton-Schulz and Muon on the GPU: bf16 accuracy of both paths at ANCHORS.md's shapes,
singular-value band, batched input, Muon step parity. Speed: python -m kernelbench.muon.tune."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (4096, 1024), (2048, 512)]


def rel_fro(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def hopper_ok():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("path", ["classic", "hopper", "auto"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_bf16_parity_with_fp32_reference(path, shape):
    from kernelbench.muon import newton_schulz, newton_schulz_ref

    if path == "hopper" and not hopper_ok():
        pytest.skip("the Hopper path needs sm_90")
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    G = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    out = newton_schulz(G, path=path)
    ref = newton_schulz_ref(G.float())
    err = rel_fro(out, ref)
    torch_err = rel_fro(newton_schulz_ref(G), ref)
    print(f"{shape} {newton_schulz.last_path}: rel fro {err:.2e} (torch bf16: {torch_err:.2e})")
    assert err <= 2e-2


@pytest.mark.parametrize("path", ["classic", "hopper"])
def test_ill_conditioned_singular_values(path):
    from kernelbench.muon import newton_schulz, newton_schulz_ref

    if path == "hopper" and not hopper_ok():
        pytest.skip("the Hopper path needs sm_90")
    m, n = 512, 1024
    gen = torch.Generator(device="cuda").manual_seed(1)
    U, _ = torch.linalg.qr(torch.randn(m, m, device="cuda", generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, m, device="cuda", generator=gen, dtype=torch.float64))
    G = (U @ torch.diag(torch.logspace(-4, 0, m, device="cuda", dtype=torch.float64)) @ V.mT).to(torch.bfloat16)
    ours = torch.linalg.svdvals(newton_schulz(G, path=path).double())
    band = torch.cat([torch.linalg.svdvals(newton_schulz_ref(G.double())),
                      torch.linalg.svdvals(newton_schulz_ref(G).double())])
    assert band.min() * 0.98 - 1e-3 <= ours.min() and ours.max() <= band.max() * 1.02


def test_batched_and_transposed_match_one_by_one():
    from kernelbench.muon import newton_schulz

    G = torch.randn(4, 1024, 256, device="cuda", dtype=torch.bfloat16)
    batched = newton_schulz(G)
    for i in range(4):
        assert rel_fro(batched[i], newton_schulz(G[i])) < 1e-3


def test_muon_step_parity_20_steps():
    from kernelbench.ops import get_op

    op = get_op("muon")
    workload = op.workload("small")
    ref = op.make_reference_case(workload, "cuda")
    cand = op.make_case(op.get_candidate("triton"), workload, "cuda")
    for step in range(20):
        for case in (ref, cand):
            case.set_step(step)
            case.run()
    expected, actual = ref.tensors(), cand.tensors()
    for name, value in expected.items():
        if value.is_floating_point() and value.dim() > 0:
            assert rel_fro(actual[name], value) <= 2.5e-2, name

