"""Newton-Schulz (kernelbench.newton_schulz) in the Triton interpreter: both paths' math, symmetric-tile
coverage, batched and transposed inputs, routing and bad input.

The interpreter's bf16 tl.dot is wrong, so the kernels convert operands to fp32 before tl.dot
there (UPCAST); values are still stored in bf16 between GEMMs, as on the GPU. The Hopper path's
TMA descriptors run in the interpreter (triton 3.9), so its kernels are tested here for their
tile logic and math; its speed and the sm_90 compilation are checked in tests/gpu/.
"""

from __future__ import annotations

import collections
import importlib
import itertools

import pytest
import torch
from triton.runtime.errors import OutOfResources

from kernelbench.newton_schulz import choose_path, choose_route, host, newton_schulz, newton_schulz_ref
from kernelbench.newton_schulz.host import NS_COEFFICIENTS, GemmConfig, configs_for, sym_tile_count, upper_tiles

# The routing module (MEASURED_ROUTES, the device name lookup).
ns_module = importlib.import_module("kernelbench.newton_schulz.routing")
classic, hopper = host.GEMMS["classic"], host.GEMMS["hopper"]

PATHS = ("classic", "hopper")


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as the kernels round it here: the interpreter truncates (seen with triton
    3.9: about half the values of a random tensor land one ulp toward zero of torch's rounding);
    a GPU rounds to nearest even, as torch does."""
    if host.interpreting():
        return (x.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    return x.to(torch.bfloat16)


def emulated(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The kernels' math in torch: bf16 values between GEMMs, fp32 products and epilogues."""
    a, b, c = NS_COEFFICIENTS
    X = G.mT if G.size(-2) > G.size(-1) else G
    norm = torch.linalg.vector_norm(X.float(), dim=(-2, -1), keepdim=True)
    X = to_bf16(X.float() * (1.0 / (norm + 1e-7)))
    for step in range(steps):
        A = to_bf16(X.float() @ X.float().mT)
        B = to_bf16(b * A.float() + c * (A.float() @ A.float()))
        X = a * X.float() + B.float() @ X.float()
        # The last update is written in the caller's dtype straight from fp32.
        X = X.to(G.dtype) if step == steps - 1 and G.dtype == torch.float32 else to_bf16(X)
    return X.mT if G.size(-2) > G.size(-1) else X


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    """allclose that says how many elements are off, where the worst one is, and NaN/Inf counts."""
    actual, expected = actual.double(), expected.double()
    bad_nonfinite = (~torch.isfinite(actual)).sum().item()
    diff = (actual - expected).abs()
    off = diff > atol + rtol * expected.abs()
    if bad_nonfinite or off.any():
        worst = diff.argmax()
        idx = tuple(int(i) for i in torch.unravel_index(worst, diff.shape))
        raise AssertionError(
            f"{what}: {off.sum().item()} of {off.numel()} elements off (atol {atol}, rtol {rtol}), "
            f"{bad_nonfinite} non-finite; worst at {idx}: {actual[idx].item()} vs {expected[idx].item()}"
        )


def seeded(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


# -- the whole iteration -----------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "shape,dtype",
    [((48, 48), torch.float32), ((40, 96), torch.bfloat16), ((96, 40), torch.float32),
     ((3, 32, 48), torch.bfloat16), ((2, 56, 24), torch.float32)],
)
def test_matches_reference(path, shape, dtype):
    G = seeded(shape, dtype, seed=sum(shape))
    out = newton_schulz(G, path=path)
    assert out.dtype == dtype and out.shape == G.shape
    assert newton_schulz.last_path == path
    # Same rounding as the kernels: only accumulation order differs.
    assert rel_fro(out, emulated(G)) < 5e-3
    # Against the exact iteration: bf16's own error at these sizes is 2-3e-2 (torch's bf16
    # iteration: up to 4e-2); 3e-2 leaves room and nothing more.
    assert rel_fro(out, newton_schulz_ref(G.double())) < 3e-2


@pytest.mark.parametrize("path", ("classic",))
@pytest.mark.parametrize("shape", [(37, 53), (53, 37)])
def test_odd_shapes_classic(path, shape):
    G = seeded(shape, seed=7)
    out = newton_schulz(G, path=path)
    assert rel_fro(out, emulated(G)) < 5e-3


def singular_values(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(x.double())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("conditioning", ["random", "ill"])
def test_singular_values_in_reference_band(path, conditioning):
    m, n = 48, 64
    if conditioning == "random":
        G = seeded((m, n), seed=11)
    else:  # singular values spread log-uniformly over 1e-4 .. 1
        gen = torch.Generator().manual_seed(12)
        U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
        V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=torch.float64))
        G = (U @ torch.diag(torch.logspace(-4, 0, m, dtype=torch.float64)) @ V.mT).float()
    ours = singular_values(newton_schulz(G, path=path))
    band = torch.cat([singular_values(newton_schulz_ref(G.double())),
                      singular_values(newton_schulz_ref(G.to(torch.bfloat16)))])
    lo, hi = band.min().item(), band.max().item()
    # bf16 moves each singular value by about 1%: allow that much beyond the band's edges.
    assert lo * 0.98 - 1e-3 <= ours.min().item() and ours.max().item() <= hi * 1.02, (
        f"singular values [{ours.min():.4f}, {ours.max():.4f}] outside the reference band [{lo:.4f}, {hi:.4f}]"
    )
    assert rel_fro(ours, singular_values(emulated(G))) < 2e-2


@pytest.mark.parametrize("path", PATHS)
def test_batched_equals_one_by_one(path):
    G = seeded((3, 24, 40), seed=5)
    batched = newton_schulz(G, path=path)
    for i in range(3):
        assert_close(batched[i], newton_schulz(G[i], path=path), 1e-6, 0, f"batch entry {i}")


@pytest.mark.parametrize("path", PATHS)
def test_transposed_input(path):
    G = seeded((64, 40), seed=6)
    tall = newton_schulz(G, path=path)
    wide = newton_schulz(G.mT.contiguous(), path=path)
    assert tall.shape == (64, 40)
    assert rel_fro(tall, wide.mT) < 1e-3


def test_steps_zero_is_the_normalised_input():
    G = seeded((16, 24), seed=8)
    out = newton_schulz(G, steps=0, path="classic")
    assert_close(out, to_bf16(G * (1.0 / (G.norm() + 1e-7))), 1e-6, 0, "steps=0")


# -- the kernels on their own, outputs poisoned first ------------------------------------------
GRAM_CONFIGS = [GemmConfig(16, 32, 16, 1, 4, 2), GemmConfig(32, 16, 16, 1, 4, 3), GemmConfig(16, 16, 32, 1, 4, 1)]


# TMA needs 16-byte rows, so the Hopper kernels get only shapes with sizes divisible by 8 (the
# Hopper path refuses others: test_bad_options).
GRAM_SHAPES = [("classic", 2, 40, 24), ("classic", 1, 48, 56), ("classic", 1, 33, 45),
               ("hopper", 2, 40, 24), ("hopper", 1, 48, 56)]


@pytest.mark.parametrize("cfg", GRAM_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}x{c.block_k}")
@pytest.mark.parametrize("path,batch,m,k", GRAM_SHAPES, ids=str)
def test_sym_gram_writes_every_element(path, cfg, batch, m, k):
    x = seeded((batch, m, k), torch.float16, seed=m * k)
    out = torch.full((batch, m, m), float("nan"), dtype=torch.float16)
    host.GEMMS[path].sym_gram(x, out, cfg)
    assert_close(out, x.float() @ x.float().mT, 2e-2, 2e-3, "X X^T")


@pytest.mark.parametrize("module", [classic, hopper], ids=["classic", "hopper"])
@pytest.mark.parametrize("cfg", GRAM_CONFIGS[:2], ids=lambda c: f"{c.block_m}x{c.block_n}")
def test_fused_polynomial(module, cfg):
    a = seeded((2, 40, 40), torch.float32, seed=3)
    a = ((a + a.mT) / 8).to(torch.float16)  # the Gram matrix it is applied to is symmetric
    out = torch.full_like(a, float("nan"))
    module.sym_gram(a, out, cfg, alpha=-4.775, beta=2.0315, fuse_poly=True)
    expected = -4.775 * a.float() + 2.0315 * (a.float() @ a.float())
    assert_close(out, expected, 2e-2, 2e-3, "b A + c A A")


@pytest.mark.parametrize("module", [classic, hopper], ids=["classic", "hopper"])
@pytest.mark.parametrize("m,n", [(40, 56), (24, 72)])
@pytest.mark.parametrize("out_dtype,transposed", [(torch.float16, False), (torch.float32, True)])
def test_update_kernel(module, m, n, out_dtype, transposed):
    cfg = GemmConfig(16, 32, 16, 1, 4, 2)
    b = seeded((2, m, m), torch.float16, seed=m)
    x = seeded((2, m, n), torch.float16, seed=n)
    store = torch.full((2, n, m) if transposed else (2, m, n), float("nan"), dtype=out_dtype)
    out = store.mT if transposed else store
    module.update(b, x, out, 3.4445, cfg)
    assert_close(out, 3.4445 * x.float() + b.float() @ x.float(), 2e-2, 2e-3, "a X + B X")


def test_upper_tiles_cover_each_element_once():
    # The store rule of both paths: each tile writes itself, and its transpose for the columns
    # at or past the end of its diagonal block. Count writes per element.
    for m, bm, bn in itertools.product([1, 17, 48, 50, 64], [16, 32], [16, 32, 64]):
        writes = torch.zeros(m, m, dtype=torch.int32)
        tiles = upper_tiles(m, bm, bn, group=3)
        assert len(tiles) == sym_tile_count(m, GemmConfig(bm, bn, 16, 1, 4))
        for r0, c0 in tiles:
            assert c0 >= r0, "a tile below the diagonal was launched"
            writes[r0:r0 + bm, c0:c0 + bn] += 1
            mirror_from = max(c0, r0 + bm)
            if mirror_from < c0 + bn:
                writes[mirror_from:c0 + bn, r0:r0 + bm] += 1
        assert torch.equal(writes, torch.ones_like(writes)), f"m={m} {bm}x{bn}: {writes.unique().tolist()}"


# -- shared memory of the Hopper kernels ----------------------------------------------------------
def llama_468m_muon_calls() -> list[tuple[int, int, int]]:
    """(batch, m, n), m <= n, of each Newton-Schulz call Muon.step makes on llama-468m."""
    from kernelbench.ops.optim_workloads import LLAMA_468M
    from kernelbench.optim.muon import muon_param_groups

    named = [(name, torch.empty(shape, device="meta")) for name, shape in LLAMA_468M.spec["shapes"]]
    counts = collections.Counter(tuple(p.shape) for p in muon_param_groups(named)[0]["params"])
    return [(count, min(shape), max(shape)) for shape, count in counts.items()]


def test_smem_model_matches_the_h200_measurement():
    # The crash of the first llama-468m Muon step on an H200: the fp32 update at 128x256x64 with
    # 3 stages asked for 278552 B (24 of them mbarriers), past the 232448 B limit.
    big = GemmConfig(128, 256, 64, num_stages=3, num_warps=8)
    assert host.smem_bytes("update", big, 3, out_itemsize=4) == 278552 - 24
    assert host.stages_that_fit("update", big, out_itemsize=4) == 2
    assert host.stages_that_fit("update", big, out_itemsize=2) == 3  # the bf16 one ran
    assert host.stages_that_fit("gram", big) == 3
    assert host.stages_that_fit("gram-poly", big) == 2


@pytest.mark.parametrize("out_itemsize", [2, 4], ids=["bf16-out", "fp32-out"])
@pytest.mark.parametrize("sms", [132])  # H100 SXM and H200
def test_optimizer_shapes_fit_shared_memory(sms, out_itemsize):
    calls = llama_468m_muon_calls()
    assert sorted(calls) == [(24, 1024, 4096), (48, 1024, 4096), (96, 1024, 1024)]
    reduced = 0
    for batch, m, n in calls:
        gram, upd = configs_for(m, n, batch, sms)
        for kind, cfg in (("gram", gram), ("gram-poly", gram), ("update", upd)):
            itemsize = out_itemsize if kind == "update" else 2
            stages = host.stages_that_fit(kind, cfg, itemsize, host.SM90_SMEM_LIMIT)
            need = host.smem_bytes(kind, cfg, stages, itemsize) + host.SMEM_RESERVE
            assert need <= host.SM90_SMEM_LIMIT, f"{(batch, m, n)} {kind} {cfg}: {need} B with {stages} stages"
            assert stages >= 2, f"{(batch, m, n)} {kind} {cfg}: the pipeline lost its overlap"
            reduced += stages < cfg.num_stages
    assert reduced, "no launch needed fewer stages: the case that crashed is no longer exercised"


class _FakeKernel:
    """Raises OutOfResources, as a Triton launch does, when given more than ``fits`` stages."""

    def __init__(self, fits: int) -> None:
        self.fits, self.tried = fits, []

    def __getitem__(self, grid):
        def run(*args, num_stages, **kwargs):
            self.tried.append(num_stages)
            if num_stages > self.fits:
                raise OutOfResources(300_000, 232_448, "shared memory")
        return run


def test_launch_retries_with_fewer_stages_and_remembers():
    kernel = _FakeKernel(fits=2)
    host.launch(kernel, (1,), 4, ("key",))
    assert kernel.tried == [4, 3, 2]
    host.launch(kernel, (1,), 4, ("key",))
    assert kernel.tried == [4, 3, 2, 2]  # the fitted count, straight away
    with pytest.raises(OutOfResources):
        host.launch(_FakeKernel(fits=0), (1,), 2, ("other",))


# -- routing and bad input ---------------------------------------------------------------------
def test_auto_routes_to_the_interpreted_kernels_on_cpu():
    assert choose_path((64, 64), "cpu") == "classic"
    G = seeded((32, 48), seed=9)
    newton_schulz(G, graph=True)  # CUDA graphs need CUDA: asked for on the CPU, none is used
    assert newton_schulz.last_path == "classic" and newton_schulz.last_graph is False


def test_measured_routes_then_the_default_rule(monkeypatch):
    # Routing on a CUDA device, without one: the device name and the Hopper check are stubbed.
    monkeypatch.setattr(ns_module, "_device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(host, "unavailable_reason", lambda device, *shapes: None)
    monkeypatch.setattr(ns_module, "MEASURED_ROUTES", {("H200", 1, 1024, 4096): ("torch", True),
                                                       ("H200", 8, 512, 512): ("classic", False)})
    assert choose_route((4096, 1024), "cuda") == ("torch", True)  # (batch, m, n) with m <= n
    assert choose_route((1024, 4096), "cuda") == ("torch", True)
    assert choose_route((8, 512, 512), "cuda") == ("classic", False)
    # Unlisted: Hopper, with a graph when the work (batch * m * m * n) is at most GRAPH_MAX_WORK.
    assert choose_route((512, 512), "cuda") == ("hopper", True)
    assert choose_route((2048, 2048), "cuda") == ("hopper", True)
    assert choose_route((4096, 4096), "cuda") == ("hopper", False)
    assert choose_route((64, 1024, 1024), "cuda") == ("hopper", False)
    monkeypatch.setattr(ns_module, "_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert choose_route((4096, 1024), "cuda") == ("hopper", True)


def test_default_rule_agrees_with_the_h200_table(monkeypatch):
    # An H100 has no measured entries: the default rule must pick what the H200 measured.
    monkeypatch.setattr(ns_module, "_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(host, "unavailable_reason", lambda device, *shapes: None)
    assert ns_module.MEASURED_ROUTES
    for (fragment, batch, m, n), route in ns_module.MEASURED_ROUTES.items():
        assert fragment == "H200"
        shape = (batch, m, n) if batch > 1 else (m, n)
        assert choose_route(shape, "cuda") == route, shape


@pytest.mark.parametrize(
    "G,match",
    [
        (torch.randn(8), "2-D matrix or a 3-D batch"),
        (torch.randn(2, 2, 8, 8), "2-D matrix or a 3-D batch"),
        (torch.randn(0, 8), "empty"),
        (torch.randn(8, 8).half(), "float32 or bfloat16"),
        (torch.randint(0, 3, (8, 8)), "float32 or bfloat16"),
    ],
    ids=["1-D", "4-D", "empty", "fp16", "int"],
)
def test_bad_input(G, match):
    with pytest.raises(ValueError, match=match):
        newton_schulz(G)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.parametrize("path", ("classic", "torch"))
def test_non_finite_input(bad, path):
    G = seeded((16, 24), seed=10)
    G[3, 5] = bad
    with pytest.raises(ValueError, match="inf or NaN"):
        newton_schulz(G, path=path)
    # Without the check (no host sync), the result is NaN, as torch's iteration gives.
    assert torch.isnan(newton_schulz(G, path=path, check_finite=False)).any()


def test_bad_options():
    G = seeded((16, 24), seed=4)
    with pytest.raises(ValueError, match="unknown path 'fast'"):
        newton_schulz(G, path="fast")
    with pytest.raises(ValueError, match="steps must be"):
        newton_schulz(G, steps=-1)
    with pytest.raises(ValueError, match="16 bytes"):
        newton_schulz(seeded((16, 30)), path="hopper")
