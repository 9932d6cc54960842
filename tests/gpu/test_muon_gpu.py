"""Newton-Schulz and Muon on the GPU: bf16 accuracy of both paths at the muon-ns op's shapes,
singular-value band, batched input, CUDA-graph replay, Muon step parity.
Speed: `kernelbench run muon-ns`; re-measuring the routes: python scripts/tune_muon_routes.py."""

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
    from kernelbench.newton_schulz import newton_schulz, newton_schulz_ref

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
    from kernelbench.newton_schulz import newton_schulz, newton_schulz_ref

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
    from kernelbench.newton_schulz import newton_schulz

    G = torch.randn(4, 1024, 256, device="cuda", dtype=torch.bfloat16)
    batched = newton_schulz(G)
    for i in range(4):
        assert rel_fro(batched[i], newton_schulz(G[i])) < 1e-3


@pytest.mark.parametrize("path", ["classic", "hopper"])
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 4096), (8, 4096, 1024), (8, 1024, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp32_input_fits_shared_memory(path, shape):
    """Muon passes fp32 momentum: the last update then stores fp32 tiles, whose epilogue needs
    twice the shared memory of bf16 (the 128x256 Hopper update ran out of it on the H200:
    278552 B needed, 232448 B there). Stages are cut to fit (hopper.stages_that_fit)."""
    from kernelbench.newton_schulz import newton_schulz, newton_schulz_ref

    if path == "hopper" and not hopper_ok():
        pytest.skip("the Hopper path needs sm_90")
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    G = torch.randn(shape, device="cuda", generator=gen)
    out = newton_schulz(G, path=path, graph=False)
    assert out.dtype == torch.float32 and newton_schulz.last_path == path
    assert rel_fro(out, newton_schulz_ref(G)) <= 2e-2


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



@pytest.mark.parametrize("path", ["classic", "hopper", "torch"])
@pytest.mark.parametrize("shape", [(1024, 1024), (4096, 1024), (3, 256, 512)], ids=lambda s: "x".join(map(str, s)))
def test_graph_replay_equals_direct_call(path, shape):
    """Same kernels, so the same bits; each replay reads its own input and returns its own tensor."""
    from kernelbench.newton_schulz import newton_schulz

    if path == "hopper" and not hopper_ok():
        pytest.skip("the Hopper path needs sm_90")
    inputs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    direct = [newton_schulz(G, path=path, graph=False) for G in inputs]
    graphed = [newton_schulz(G, path=path, graph=True) for G in inputs]  # capture, then 2 replays
    assert newton_schulz.last_graph
    for i, (d, g) in enumerate(zip(direct, graphed)):
        assert torch.equal(d, g), f"input {i}: max diff {(d.float() - g.float()).abs().max().item()}"
    G = inputs[0].clone()
    G[0, 0] = float("nan")
    with pytest.raises(ValueError, match="inf or NaN"):
        newton_schulz(G, path=path, graph=True)


def test_no_graph_of_its_own_inside_a_callers_capture():
    from kernelbench.newton_schulz import newton_schulz

    G = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    expected = newton_schulz(G, path="classic", graph=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        newton_schulz(G, path="classic", graph=False, check_finite=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = newton_schulz(G, path="classic", graph=True, check_finite=False)
    assert not newton_schulz.last_graph
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
