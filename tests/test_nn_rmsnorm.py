"""kernelbench.nn.rmsnorm: Triton RMSNorm (interpreter on CPU) against the fp64 reference."""

import pytest
import torch

from kernelbench import fast_launch
from kernelbench.nn.rmsnorm import (
    MAX_N,
    BwdConfig,
    FwdConfig,
    RMSNorm,
    bwd_config,
    fast_path,
    fwd_config,
    host,
    kernels,
    rms_norm,
    rmsnorm_ref_fp32,
)

# (atol, rtol) for outputs and dx; dweight (a sum over rows) is compared by relative norm.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
DW_FRO = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def assert_close(name, got, want, atol, rtol):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    nan_mismatch = (got.isnan() != want.isnan()).sum().item()
    bad = (got - want).abs() > atol + rtol * want.abs()
    if nan_mismatch or bad.any():
        first = tuple(bad.nonzero()[0].tolist()) if bad.any() else None
        raise AssertionError(
            f"{name}: {bad.sum().item()} of {bad.numel()} elements outside atol={atol} rtol={rtol}, "
            f"max abs diff {(got - want).abs().max().item():.3g}, first at {first}, NaN mismatches {nan_mismatch}"
        )


def assert_fro(name, got, want, fro):
    err = (got.double() - want.double()).norm() / want.double().norm()
    assert err <= fro, f"{name}: relative Frobenius error {err:.3g} > {fro}"


def run_both(x, weight, residual, eps=1e-6):
    """(outputs, grads) of the Triton path and of the fp64 reference, same upstream gradients."""
    gen = torch.Generator().manual_seed(123)
    leaves = [t for t in (x, weight, residual) if t is not None]
    out = rms_norm(x, weight, eps, residual=residual, impl="triton")
    outs = out if isinstance(out, tuple) else (out,)
    grads_out = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads_out)
    got = [o.detach() for o in outs] + [t.grad for t in leaves]

    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    it = iter(ref_leaves)
    rx = next(it)
    rw = next(it) if weight is not None else None
    rr = next(it) if residual is not None else None
    ref = rmsnorm_ref_fp32(rx, rw, eps, rr)
    refs = ref if isinstance(ref, tuple) else (ref,)
    torch.autograd.backward(refs, [g.double() for g in grads_out])
    want = [o.detach() for o in refs] + [t.grad for t in ref_leaves]
    return got, want


def fresh_plans(monkeypatch):
    """Empty plan caches for this test (other tests leave plans, some with direct launches bound)."""
    caches = {host: ("_fwd_plans", "_bwd_plans"), fast_path: ("_fwd_bound", "_bwd_bound", "_small_calls")}
    for module, names in caches.items():
        for name in names:
            monkeypatch.setattr(module, name, fast_launch.PlanCache())


def check(got, want, dtype, has_weight, has_residual):
    atol, rtol = TOL[dtype]
    names = ["y"] + (["h"] if has_residual else []) + ["dx"] + (["dweight"] if has_weight else [])
    names += ["dresidual"] if has_residual else []
    for name, g, w in zip(names, got, want):
        if name == "dweight":
            assert_fro(name, g, w, DW_FRO[dtype])
        else:
            assert_close(name, g, w, atol, rtol)


SHAPES = [
    ((1, 760), torch.float32),  # M = 1, N not a power of two
    ((5, 123, 123), torch.bfloat16),  # odd everything, 3-D
    ((37, 64), torch.float16),  # several rows per program, a partial last block
    ((3, 2500), torch.bfloat16),  # two-pass forward (2048-wide chunks, the second partial)
    ((3, 9000), torch.bfloat16),  # the wide backward, the default for 8192 < N <= 16384
    ((2, 17000), torch.float32),  # two-pass forward and backward (N > 16384), the dw column kernel
]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape, dtype", SHAPES, ids=[f"{'x'.join(map(str, s))}-{str(d)[6:]}" for s, d in SHAPES])
def test_matches_reference(shape, dtype, residual):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype).requires_grad_(True)
    res = torch.randn(shape, generator=gen).to(dtype).requires_grad_(True) if residual else None
    got, want = run_both(x, weight, res)
    check(got, want, dtype, True, residual)


def test_no_weight_and_fp32_weight_with_bf16_input():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, 300, generator=gen).to(torch.bfloat16).requires_grad_(True)
    got, want = run_both(x, None, None)
    check(got, want, torch.bfloat16, False, False)
    x.grad = None
    weight = (1 + 0.1 * torch.randn(300, generator=gen)).requires_grad_(True)  # fp32 master weight
    got, want = run_both(x, weight, None)
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    check(got, want, torch.bfloat16, True, False)


@pytest.mark.parametrize("kind", ["row-strided", "column-strided", "transposed"])
def test_non_contiguous_inputs(kind):
    gen = torch.Generator().manual_seed(3)
    if kind == "row-strided":  # rows of a wider buffer: read in place through the row stride
        x = torch.randn(6, 200, generator=gen)[:, :130]
    elif kind == "column-strided":
        x = torch.randn(6, 260, generator=gen)[:, ::2]
    else:
        x = torch.randn(130, 6, generator=gen).t()
    x = x.requires_grad_(True)
    weight = (1 + 0.1 * torch.randn(130, generator=gen)).requires_grad_(True)
    res = torch.randn(6, 300, generator=gen)[:, 7:137].requires_grad_(True)
    got, want = run_both(x, weight, res)
    check(got, want, torch.float32, True, True)


def test_gradcheck_fp64():
    gen = torch.Generator().manual_seed(11)
    for shape in [(3, 37), (2, 9000)]:  # single-pass and wide backward (two passes: the next test)
        x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
        w = torch.randn(shape[-1], generator=gen, dtype=torch.float64, requires_grad=True)
        r = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
        fn = lambda x, w, r: rms_norm(x, w, 1e-6, residual=r, impl="triton")
        assert torch.autograd.gradcheck(fn, (x, w, r), fast_mode=True)


def test_module_matches_torch_rmsnorm():
    gen = torch.Generator().manual_seed(5)
    ours = RMSNorm((4, 24), eps=None, impl="triton")
    theirs = torch.nn.RMSNorm((4, 24))
    with torch.no_grad():
        ours.weight.copy_(1 + 0.1 * torch.randn(4, 24, generator=gen))
    theirs.load_state_dict(ours.state_dict())  # same parameter names and shapes
    x = torch.randn(3, 5, 4, 24, generator=gen)
    assert_close("module y", ours(x), theirs(x), 1e-5, 1e-5)
    plain = RMSNorm(24, elementwise_affine=False, impl="triton")
    assert plain.weight is None
    assert_close("no affine", plain(x), torch.nn.RMSNorm(24, elementwise_affine=False)(x), 1e-5, 1e-5)
    y, h = RMSNorm(24, impl="triton")(x, residual=x)
    assert_close("module residual", h, 2 * x, 0, 0)


def test_auto_on_cpu_uses_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    x = torch.randn(4, 33)
    w = torch.randn(33)
    assert_close("auto", rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (33,), w, 1e-6), 0, 0)


@pytest.mark.parametrize("call, match", [
    (lambda: rms_norm(torch.randn(2, 8), torch.ones(7), impl="triton"), r"weight has shape \(7,\), expected \(8,\)"),
    (lambda: RMSNorm(16)(torch.randn(2, 8)), r"does not end in normalized_shape \(16,\)"),
    (lambda: rms_norm(torch.ones(2, 8, dtype=torch.int32), impl="triton"), "unsupported dtype torch.int32"),
    (lambda: rms_norm(torch.randn(2, 8), residual=torch.randn(2, 9), impl="triton"), "residual has shape"),
    (lambda: rms_norm(torch.randn(2, 8), impl="cuda"), "impl must be one of"),
    (lambda: rms_norm(torch.randn(1, MAX_N + 2), impl="triton"), f"> {MAX_N}"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# Launch configurations other than the defaults: every one must compute the same thing.
TUNINGS = [
    (FwdConfig(4, 256, True, 4), BwdConfig("rows", 4, 256, 4)),  # several rows per block
    (FwdConfig(1, 256, True, 4), BwdConfig("rows", 2, 256, 2, programs_per_sm=1)),  # programs loop
    (FwdConfig(1, 256, True, 4, early_weight=True), BwdConfig("rows", 1, 256, 4)),  # weight loaded with x
    (FwdConfig(1, 64, False, 2), BwdConfig("two-pass", 1, 64, 2)),  # two passes, a row per program
    (FwdConfig(1, 32, False, 4), BwdConfig("two-pass", 1, 32, 4, programs_per_sm=2)),
]


@pytest.mark.parametrize("fwd_cfg, bwd_cfg", TUNINGS,
                         ids=["rows4", "persistent-bwd", "early-weight", "two-pass", "two-pass-32"])
def test_launch_configs_match_reference(fwd_cfg, bwd_cfg):
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(43, 200, generator=gen).to(torch.bfloat16)  # 43 rows: partial last blocks
    w = (1 + 0.1 * torch.randn(200, generator=gen)).to(torch.bfloat16)
    dy = torch.randn(43, 200, generator=gen).to(torch.bfloat16)
    y, _, rstd = host.forward(x, w, None, 1e-6, config=fwd_cfg)
    dx, dw = host.backward(x, w, rstd, dy, None, config=bwd_cfg)
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ref = rmsnorm_ref_fp32(xr, wr, 1e-6)
    ref.backward(dy.double())
    check([y, dx, dw], [ref.detach(), xr.grad, wr.grad], torch.bfloat16, True, False)


def test_default_configs():
    """The default launch per row width: which kernel, block shapes and warps."""
    assert fwd_config(200) == FwdConfig(16, 256, True, 8)
    assert fwd_config(2048) == FwdConfig(2, 2048, True, 8)
    assert fwd_config(3000) == FwdConfig(1, 2048, False, 8)  # padded to 4096: two passes
    assert fwd_config(8192) == FwdConfig(1, 4096, False, 16)
    assert fwd_config(12000) == FwdConfig(1, 16384, True, 16, early_weight=True)
    assert fwd_config(65536) == FwdConfig(1, 8192, False, 32)
    assert bwd_config(4096) == BwdConfig("rows", 1, 4096, 8)
    assert bwd_config(12000) == BwdConfig("wide", 1, 16384, 32)
    assert bwd_config(32768) == BwdConfig("two-pass", 1, 8192, 32, programs_per_sm=2)


# The wide backward (x, dy and dw of a whole row in registers, _rmsnorm_bwd_wide_kernel) forced at
# small N. programs_per_sm=1 makes 4 row programs in the interpreter, so each loops over several
# rows (dw accumulated across them).
WIDE = [  # (M, N, dtype, num_warps)
    (11, 24, torch.float32, 4),
    (9, 760, torch.bfloat16, 4),
    (13, 761, torch.float16, 4),  # odd N: the row partly masked
    (5, 333, torch.float32, 2),
]


def check_backward(m, n, dtype, has_weight, has_dres, config):
    """_rmsnorm_bwd with the launch ``config`` against the fp64 reference."""
    gen = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, n, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype) if has_weight else None
    dy = torch.randn(m, n, generator=gen).to(dtype)
    dres = torch.randn(m, n, generator=gen).to(dtype) if has_dres else None
    _, _, rstd = host.forward(x, w, None, 1e-6)
    dx, dw = host.backward(x, w, rstd, dy, dres, config=config)
    xr = x.double().requires_grad_(True)
    wr = w.double().requires_grad_(True) if has_weight else None
    rmsnorm_ref_fp32(xr, wr, 1e-6).backward(dy.double())
    want_dx = xr.grad + (dres.double() if has_dres else 0)
    assert_close("dx", dx, want_dx, *TOL[dtype])
    if has_weight:
        assert dw.dtype == dtype
        assert_fro("dweight", dw, wr.grad, DW_FRO[dtype])
    else:
        assert dw is None


WEIGHT_DRES = [(True, False), (True, True), (False, True)]
WEIGHT_DRES_IDS = ["weight", "weight-dres", "no-weight-dres"]


def _pow2(n):
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("has_weight, has_dres", WEIGHT_DRES, ids=WEIGHT_DRES_IDS)
@pytest.mark.parametrize("m, n, dtype, warps", WIDE, ids=[f"{m}x{n}-{str(d)[6:]}" for m, n, d, _ in WIDE])
def test_wide_backward_matches_reference(m, n, dtype, warps, has_weight, has_dres):
    check_backward(m, n, dtype, has_weight, has_dres, BwdConfig("wide", 1, _pow2(n), warps, programs_per_sm=1))


# The two-pass row kernel forced at small N with small chunks, dw from the dw column kernel.
# programs_per_sm=1 / 2 makes 4 / 8 programs in the interpreter, so each loops over several rows.
TWO_PASS = [  # (M, N, dtype, chunk, programs per SM)
    (11, 24, torch.float32, 8, 1),
    (13, 760, torch.bfloat16, 128, 2),
    (9, 761, torch.float32, 256, 1),
    (19, 761, torch.bfloat16, 64, 2),
]


@pytest.mark.parametrize("has_weight, has_dres", WEIGHT_DRES, ids=WEIGHT_DRES_IDS)
@pytest.mark.parametrize("m, n, dtype, chunk, pps", TWO_PASS,
                         ids=[f"{m}x{n}-{str(d)[6:]}-chunk{c}" for m, n, d, c, _ in TWO_PASS])
def test_two_pass_backward_matches_reference(m, n, dtype, chunk, pps, has_weight, has_dres):
    check_backward(m, n, dtype, has_weight, has_dres, BwdConfig("two-pass", 1, chunk, 4, programs_per_sm=pps))


@pytest.mark.parametrize("make, match", [
    (lambda: FwdConfig(1, 100, False, 4), "block_n must be a power of two, got 100"),
    (lambda: FwdConfig(2, 64, False, 4), "one row per block, got block_m=2"),
    (lambda: BwdConfig("two-pass", 2, 64, 4), "one row per block, got block_m=2"),
    (lambda: BwdConfig("split", 1, 64, 4), "kernel must be one of rows, wide, two-pass"),
])
def test_bad_launch_config(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_config_narrower_than_rows():
    x = torch.randn(3, 200)
    with pytest.raises(ValueError, match="needs block_n >= N, got 128 < 200"):
        host.backward(x, torch.ones(200), torch.ones(3), x, None, config=BwdConfig("wide", 1, 128, 4))


def test_wide_backward_default_switch(monkeypatch):
    """Rows in (8192, 16384] take the wide kernel by default through the public autograd path."""
    fresh_plans(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 9000, generator=gen).to(torch.bfloat16).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(9000, generator=gen)).to(torch.bfloat16).requires_grad_(True)
    r = torch.randn(3, 9000, generator=gen).to(torch.bfloat16).requires_grad_(True)
    got, want = run_both(x, w, r)
    check(got, want, torch.bfloat16, True, True)
    (plan,) = host._bwd_plans.values()
    assert plan.main.kernel is kernels._rmsnorm_bwd_wide_kernel
    assert (plan.main.meta["BLOCK_N"], plan.main.meta["num_warps"]) == (16384, 32)


@pytest.mark.parametrize("config", [
    BwdConfig("wide", 1, 64, 4, programs_per_sm=1),
    BwdConfig("two-pass", 1, 8, 4, programs_per_sm=1),
], ids=["wide", "two-pass"])
def test_gradcheck_fp64_backward_configs(config):
    class Norm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y, _, rstd = host.forward(x, w, None, 1e-6)
            ctx.save_for_backward(x, w, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, w, rstd = ctx.saved_tensors
            return host.backward(x, w, rstd, dy.contiguous(), None, config=config)

    gen = torch.Generator().manual_seed(12)
    x = torch.randn(5, 37, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(37, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Norm.apply, (x, w), fast_mode=True)


@pytest.mark.parametrize("m, n", [(8, 512), (3, 4096), (40, 1024)], ids=["8x512", "3x4096", "40x1024"])
@pytest.mark.parametrize("has_weight, has_dres", WEIGHT_DRES, ids=WEIGHT_DRES_IDS)
def test_launch_bound_backward_is_one_program(m, n, has_weight, has_dres, monkeypatch):
    """Backwards of at most 32768 elements: one program that writes dw itself, no partials;
    larger ones keep the persistent grid and the dw reduction."""
    fresh_plans(monkeypatch)
    check_backward(m, n, torch.float32, has_weight, has_dres, None)
    plans = [plan for key, plan in host._bwd_plans.items() if key[:2] == (m, n)]
    assert plans
    for plan in plans:
        one_program = m * n <= host._ONE_PROGRAM_BWD_MAX_ELEMENTS
        assert (plan.main.grid == (1,)) == one_program
        assert (plan.sum_rows is None) == (one_program or not has_weight)


@pytest.mark.parametrize("shape, recomputed", [((8, 512), True), ((3, 5, 760), True), ((64, 1024), False),
                                               ((2, 9000), False)], ids=["8x512", "3x5x760", "64x1024", "2x9000"])
@pytest.mark.parametrize("residual", [False, True])
def test_eager_backward_recomputes_rstd_where_it_runs_as_one_program(shape, recomputed, residual):
    """Launch-bound eager calls save no rstd (the backward recomputes it from the saved rows);
    larger ones keep it. Either way the gradients match the fp64 reference."""
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(shape, generator=gen).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).requires_grad_(True)
    r = torch.randn(shape, generator=gen).requires_grad_(True) if residual else None
    assert host.recomputes_rstd(x.numel() // shape[-1], shape[-1]) == recomputed
    got, want = run_both(x, w, r)
    check(got, want, torch.float32, True, residual)
    out = rms_norm(x, w, 1e-6, residual=r, impl="triton")
    y = out[0] if residual else out
    assert (y.grad_fn.saved_tensors[2] is None) == recomputed


@pytest.mark.parametrize("has_weight, has_dres", WEIGHT_DRES, ids=WEIGHT_DRES_IDS)
def test_recomputed_rstd_backward_equals_the_saved_one(has_weight, has_dres):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 300, generator=gen)
    w = torch.randn(300, generator=gen) if has_weight else None
    dy = torch.randn(6, 300, generator=gen)
    dres = torch.randn(6, 300, generator=gen) if has_dres else None
    _, _, rstd = host.forward(x, w, None, 1e-5)
    saved = host.backward(x, w, rstd, dy, dres)
    recomputed = host.backward(x, w, None, dy, dres, eps=1e-5)
    for a, b in zip(saved, recomputed):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="only the rows kernel recomputes rstd"):
        host.backward(x, w, None, dy, dres, eps=1e-5, config=BwdConfig("wide", 1, 512, 4))


@pytest.mark.parametrize("shape, has_weight, has_residual", [
    ((8, 256), True, False), ((2, 3, 128), True, True), ((4, 64), False, True), ((5, 96), False, False)])
def test_small_call_passes_the_general_paths_launch_arguments(monkeypatch, shape, has_weight, has_residual):
    """A launch-bound eager call of a signature seen before takes its _SmallCall, which launches
    with the arguments fixed once. Those must be the arguments the general path gives its direct
    launches. Direct launches exist only on a GPU, so here they are recorded instead of run,
    each pointer named by the tensor it points to (tests/gpu/test_nn_gpu.py runs them)."""
    fresh_plans(monkeypatch)
    monkeypatch.setattr(fast_launch, "_on", True)
    monkeypatch.setattr(fast_path, "_direct_launch_device", lambda x: -1)
    monkeypatch.setattr(fast_path, "current_device", lambda: -1)
    recorded = []

    def record(device, *args):
        recorded.append(args)
        return True

    def first_or_fallback(self, aligned, args):  # launch through Triton, then bind the recorder
        self.launcher(*args)
        if aligned:
            self.direct = record

    monkeypatch.setattr(fast_path._Bound, "first_or_fallback", first_or_fallback)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(shape, generator=gen).requires_grad_(True)
    w = torch.randn(shape[-1], generator=gen).requires_grad_(True) if has_weight else None
    r = torch.randn(shape, generator=gen).requires_grad_(True) if has_residual else None
    dy = torch.randn(shape, generator=gen)
    dh = torch.randn(shape, generator=gen) if has_residual else None
    inputs = {"x": x, "w": w, "r": r, "dy": dy, "dh": dh, "rstd": host.scratch_rstd(x.numel() // shape[-1], x)}

    def call():
        """The launch arguments of one eager forward + backward, pointers named, and its node."""
        recorded.clear()
        out = rms_norm(x, w, 1e-5, residual=r, impl="triton")
        y, h = out if has_residual else (out, None)
        leaves = [t for t in (x, w, r) if t is not None]
        grads = torch.autograd.grad([y, h] if has_residual else [y], leaves, [dy, dh] if has_residual else [dy])
        named = {**inputs, "y": y, "h": h, "dx": grads[0], "dw": grads[1] if has_weight else None}
        names = {t.data_ptr(): name for name, t in named.items() if t is not None}
        return [[names.get(a, a) if isinstance(a, int) and a > 2**20 else a for a in args]
                for args in recorded], y.grad_fn

    call()  # the general path through Triton: binds both plans' launches and the _SmallCall
    with monkeypatch.context() as general_only:
        general_only.setattr(fast_path, "small_call", lambda *args: None)
        general, node = call()  # the general path's direct launches
    assert node.small is None and len(general) == 2
    small, node = call()
    assert node.small is not None and node.small.bwd is record
    assert small == general
    # A gradient laid out otherwise takes the general path, on rows of x's width.
    strided_dy = torch.randn((*shape[:-1], 2 * shape[-1]), generator=gen)[..., ::2]
    assert node.small.backward(x.detach(), w, strided_dy, dh, 1e-5) is None
    out = rms_norm(x, w, 1e-5, residual=r, impl="triton")
    recorded.clear()
    torch.autograd.backward(out, (strided_dy, dh) if has_residual else strided_dy)
    (bwd_args,) = recorded
    normed = out[1] if has_residual else x
    assert bwd_args[0] == normed.data_ptr() and bwd_args[1] == shape[-1]  # x (or x + residual), as rows


def test_compiled_backward_makes_no_zeros_for_an_unread_residual_sum(aot_graphs):
    """The last norm of a model returns h = x + residual that nothing reads: its gradient is None
    in the backward graph, not a zeros [tokens, hidden] buffer, and dx is eager's."""
    backend, graphs = aot_graphs

    def last_norm(x, weight, residual):
        y, _ = rms_norm(x, weight, 1e-6, residual=residual, impl="triton")
        return y

    gen = torch.Generator().manual_seed(11)
    x, weight, residual = (torch.randn(shape, generator=gen) for shape in ((2, 3, 16), (16,), (2, 3, 16)))
    grads = []
    for fn in (torch.compile(last_norm, backend=backend, fullgraph=True), last_norm):
        leaves = [t.clone().requires_grad_(True) for t in (x, weight, residual)]
        fn(*leaves).square().sum().backward()
        grads.append([t.grad for t in leaves])
    assert len(graphs) == 2
    backward_graph = graphs[1]
    assert "kernelbench.rms_norm_bwd" in backward_graph
    assert "aten.full" not in backward_graph and "aten.zeros" not in backward_graph
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
