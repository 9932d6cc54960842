"""GPU checks of kernelbench.nn's RMSNorm and rotary: bf16 accuracy against an fp32 reference at
real sizes, the compiled kernels' two-pass paths, the in-place custom op under torch.compile, and
autoselect measuring on CUDA."""

import contextlib

import pytest
import torch

from kernelbench.nn.rmsnorm import BwdConfig, FwdConfig, fast_path, host, rms_norm, rmsnorm_ref_fp32
from kernelbench.nn.rotary import apply_rotary, apply_rotary_, rotary_ref

pytestmark = pytest.mark.gpu


def rel_fro(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def max_abs(got, want):
    return (got.float() - want.float()).abs().max().item()


@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 760), (512, 16384), (256, 65536), (8192, 256)])
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_bf16_against_fp32(shape, residual):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, generator=gen, device="cuda").bfloat16().requires_grad_(True)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen, device="cuda")).bfloat16().requires_grad_(True)
    r = torch.randn(shape, generator=gen, device="cuda").bfloat16().requires_grad_(True) if residual else None
    out = rms_norm(x, w, 1e-6, residual=r, impl="triton")
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn(o.shape, generator=gen, device="cuda").bfloat16() for o in outs]
    torch.autograd.backward(outs, grads)

    leaves = [t for t in (x, w, r) if t is not None]
    ref_leaves = [t.detach().float().requires_grad_(True) for t in leaves]
    ref = rmsnorm_ref_fp32(ref_leaves[0], ref_leaves[1], 1e-6, ref_leaves[2] if residual else None)
    refs = ref if isinstance(ref, tuple) else (ref,)
    torch.autograd.backward(refs, [g.float() for g in grads])
    y_err = max_abs(outs[0], refs[0])
    assert y_err <= 2e-2 * refs[0].abs().max().item(), f"y max abs err {y_err}"
    assert rel_fro(x.grad, ref_leaves[0].grad) < 5e-3
    assert rel_fro(w.grad, ref_leaves[1].grad) < 5e-3  # fp32 accumulation: far below bf16's 4e-3 ulp
    if residual:
        assert torch.equal(outs[1], (x.detach().float() + r.detach().float()).bfloat16())
        assert torch.equal(r.grad, x.grad)


@pytest.mark.parametrize("style, layout, rot, offset", [
    ("half", "bhsd", 128, 0), ("interleaved", "bshd", 128, 0), ("half", "bshd", 64, 17),
])
def test_rotary_bf16_against_fp32(style, layout, rot, offset):
    gen = torch.Generator(device="cuda").manual_seed(1)
    b, hq, hk, s, d = 2, 32, 8, 512, 128
    shape = (lambda h: (b, h, s, d)) if layout == "bhsd" else (lambda h: (b, s, h, d))
    q = torch.randn(shape(hq), generator=gen, device="cuda").bfloat16().requires_grad_(True)
    k = torch.randn(shape(hk), generator=gen, device="cuda").bfloat16().requires_grad_(True)
    angles = torch.rand((s + offset, rot), generator=gen, device="cuda") * 6
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    qo, ko = apply_rotary(q, k, cos, sin, style=style, layout=layout, position_offset=offset, impl="triton")
    dq, dk = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (dq, dk))
    qf, kf = q.detach().float().requires_grad_(True), k.detach().float().requires_grad_(True)
    rq, rk = rotary_ref(qf, kf, cos.float(), sin.float(), style=style, layout=layout, position_offset=offset)
    torch.autograd.backward((rq, rk), (dq.float(), dk.float()))
    for got, want in [(qo, rq), (ko, rk), (q.grad, qf.grad), (k.grad, kf.grad)]:
        assert max_abs(got, want) <= 2e-2 * want.abs().max().item()


def test_in_place_rotary_under_torch_compile():
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(2, 8, 64, 64, generator=gen, device="cuda").bfloat16()
    k = torch.randn(2, 2, 64, 64, generator=gen, device="cuda").bfloat16()
    angles = torch.rand((64, 64), generator=gen, device="cuda")
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()

    def step(q, k):
        apply_rotary_(q, k, cos, sin)
        return q * 2, k + 1  # reads after the mutation must see it

    want = step(q.clone(), k.clone())
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q.clone(), k.clone())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_autoselect_measures_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    from kernelbench.nn import autoselect_report
    from kernelbench.nn.autoselect import clear_memory_cache

    clear_memory_cache()
    report = autoselect_report("rmsnorm", (16, 2048, 4096), torch.bfloat16)
    assert report["source"] == "measured" and report["choice"] in ("triton", "torch")
    assert all(ms > 0 for ms in report["times_ms"].values())
    print(report)
    assert autoselect_report("rmsnorm", (16, 2048, 4096), torch.bfloat16)["source"] == "memory"
    rot = autoselect_report("rotary", (8, 32, 8, 2048, 128, 128), torch.bfloat16, variant="half-bhsd")
    print(rot)
    assert rot["choice"] == "triton", rot  # eager rotary is ~10x off the copy bandwidth
    clear_memory_cache()


@pytest.mark.parametrize("shape", [(8, 512, 768), (4, 2048, 8192)], ids=["launch-bound", "bandwidth-bound"])
def test_silu_mul_auto_takes_the_measured_choice(tmp_path, monkeypatch, shape):
    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    from kernelbench.nn import autoselect_report, silu_mul
    from kernelbench.nn.autoselect import clear_memory_cache

    clear_memory_cache()
    report = autoselect_report("swiglu", shape, torch.bfloat16)
    print(report)
    assert report["source"] == "measured" and all(ms > 0 for ms in report["times_ms"].values())
    gate, up = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    got = silu_mul(gate, up)
    want = silu_mul(gate.detach(), up.detach(), impl=report["choice"])
    assert torch.equal(got, want)
    if shape[-1] * shape[0] * shape[1] >= 2**26:  # 128 MB a tensor: one fused pass beats three
        assert report["choice"] == "triton", report
    clear_memory_cache()


@pytest.mark.parametrize("fwd_cfg, bwd_cfg", [
    (None, None),
    (FwdConfig(2, 4096, True, 16), BwdConfig("rows", 2, 4096, 16, programs_per_sm=2)),
    (FwdConfig(1, 1024, False, 4), BwdConfig("two-pass", 1, 2048, 8)),
], ids=["default", "rows2", "two-pass"])
def test_rmsnorm_launch_configs_on_gpu(fwd_cfg, bwd_cfg):
    """Launch configs other than the defaults compute the same as the fp32 reference (compiled)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4099, 4096, generator=gen, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=gen, device="cuda")).bfloat16()
    dy = torch.randn(4099, 4096, generator=gen, device="cuda").bfloat16()
    y, _, rstd = host.forward(x, w, None, 1e-6, config=fwd_cfg)
    dx, dw = host.backward(x, w, rstd, dy, None, config=bwd_cfg)
    xf, wf = x.float().requires_grad_(True), w.float().requires_grad_(True)
    ref = rmsnorm_ref_fp32(xf, wf, 1e-6)
    ref.backward(dy.float())
    assert max_abs(y, ref) <= 2e-2 * ref.abs().max().item()
    assert rel_fro(dx, xf.grad) < 5e-3 and rel_fro(dw, wf.grad) < 5e-3


def test_backward_grid_reads_occupancy():
    """The persistent backward's programs per SM come from the compiled kernel (1 to 8 at 8 warps)."""
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    host.backward(x, torch.ones(4096, device="cuda").bfloat16(), torch.ones(8192, device="cuda"), x, None)
    values = list(host._resident_cache.values())
    print("resident programs per SM:", host._resident_cache)
    assert values and all(1 <= v <= 8 for v in values)


@pytest.mark.parametrize("shape, cfg", [
    ((1024, 16384), BwdConfig("wide", 1, 16384, 16)),
    ((1024, 16384), None),  # the default for 8192 < N <= 16384: wide, 32 warps
    ((777, 12000), None),
    ((513, 32768), None),  # two passes, dw from the column kernel
    ((601, 65536), BwdConfig("two-pass", 1, 8192, 16, programs_per_sm=1)),
    ((300, 30000), BwdConfig("two-pass", 1, 16384, 32)),  # N not 2^k
])
def test_rmsnorm_wide_backward_on_gpu(shape, cfg):
    """The wide rows' backward configs against the fp32 reference."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(shape[1], generator=gen, device="cuda")).bfloat16()
    dy = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    _, _, rstd = host.forward(x, w, None, 1e-6)
    dx, dw = host.backward(x, w, rstd, dy, None, config=cfg)
    xf, wf = x.float().requires_grad_(True), w.float().requires_grad_(True)
    rmsnorm_ref_fp32(xf, wf, 1e-6).backward(dy.float())
    assert rel_fro(dx, xf.grad) < 5e-3 and rel_fro(dw, wf.grad) < 5e-3


@pytest.mark.parametrize("shape, residual", [((8, 4096), False), ((8, 4096), True), ((3, 5, 760), True),
                                             ((4096, 4096), False)])
def test_rmsnorm_direct_launches_match_the_first_call(shape, residual):
    """A plan's first call goes through Triton and binds its direct launch (pointers as ints);
    later calls, on other tensors of the same shape, take that launch and must give bitwise the
    same outputs and gradients as the first path. Launch-bound shapes take their _SmallCall there
    (the launches' fixed arguments bound once), and the direct launches call Triton's C launcher.
    A pointer off a 16-byte boundary takes the general path and is still right."""
    host._fwd_plans.clear()
    host._bwd_plans.clear()
    fast_path.clear()
    small = []  # per call: whether it took a _SmallCall

    def run(x, w, r, dys):
        # detach, not clone: a clone would be aligned again
        x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        r = r.detach().requires_grad_(True) if r is not None else None
        out = rms_norm(x, w, 1e-6, residual=r, impl="triton")
        outs = out if isinstance(out, tuple) else (out,)
        small.append(outs[0].grad_fn.small is not None)
        torch.autograd.backward(outs, dys[:len(outs)])
        return [t.detach().clone() for t in (*outs, x.grad, w.grad, *((r.grad,) if r is not None else ()))]

    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen, device="cuda")).bfloat16()
    r = torch.randn(shape, generator=gen, device="cuda").bfloat16() if residual else None
    dys = [torch.randn(shape, generator=gen, device="cuda").bfloat16() for _ in range(2)]
    first = run(x, w, r, dys)
    assert all(bound.direct for bound in fast_path._fwd_bound.values())
    assert all(bound.direct for bound in fast_path._bwd_bound.values())
    for _ in range(3):
        again = run(x, w, r, dys)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    assert small == [False] + [host.recomputes_rstd(x.numel() // shape[-1], shape[-1])] * 3
    assert all(bound.direct.calls_c_launcher for bound in fast_path._fwd_bound.values())
    assert all(bound.direct.calls_c_launcher for bound in fast_path._bwd_bound.values())
    # x two elements (4 bytes) past an aligned start: the general path, the same values.
    flat = torch.empty(x.numel() + 2, device="cuda", dtype=x.dtype)
    shifted = flat[2:].view(shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0
    for a, b in zip(first, run(shifted, w, r, dys)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_small_call_with_saved_tensor_hooks(residual):
    """Saved-tensor hooks may hand the backward other tensors than were saved (offloading,
    checkpointing): here a column-major copy. The launch-bound path then takes the general
    backward, and the gradients are bitwise those without hooks."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x0 = torch.randn(8, 1024, generator=gen, device="cuda").bfloat16()
    w0 = (1 + 0.1 * torch.randn(1024, generator=gen, device="cuda")).bfloat16()
    r0 = torch.randn(8, 1024, generator=gen, device="cuda").bfloat16() if residual else None
    dy = torch.randn(8, 1024, generator=gen, device="cuda").bfloat16()

    def grads(hooks):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        r = r0.clone().requires_grad_(True) if residual else None
        with hooks:
            out = rms_norm(x, w, 1e-6, residual=r, impl="triton")
        y = out[0] if residual else out
        y.backward(dy)
        return y.grad_fn.small is not None, [t.grad for t in (x, w, r) if t is not None]

    def column_major(t):
        return t.t().contiguous().t() if t.dim() == 2 else t

    grads(contextlib.nullcontext())  # binds the plans and the small call
    small_plain, plain = grads(contextlib.nullcontext())
    assert small_plain and host.recomputes_rstd(8, 1024)
    small_hooked, hooked = grads(torch.autograd.graph.saved_tensors_hooks(lambda t: t, column_major))
    assert small_hooked
    for a, b in zip(plain, hooked):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape, residual", [((8, 4096), True), ((4096, 4096), False), ((3, 5, 760), True)])
def test_rmsnorm_fast_path_off_gives_the_same_bits(shape, residual, monkeypatch):
    """With kernelbench.fast_launch switched off (Triton's own launches, Function.apply, the plain
    host.forward / host.backward) the outputs and gradients are those of the fast path."""
    from kernelbench import fast_launch

    gen = torch.Generator(device="cuda").manual_seed(6)
    x0 = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    w0 = (1 + 0.1 * torch.randn(shape[-1], generator=gen, device="cuda")).bfloat16()
    r0 = torch.randn(shape, generator=gen, device="cuda").bfloat16() if residual else None
    dy = torch.randn(shape, generator=gen, device="cuda").bfloat16()

    def run():
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        r = r0.clone().requires_grad_(True) if residual else None
        out = rms_norm(x, w, 1e-6, residual=r, impl="triton")
        y = out[0] if residual else out
        y.backward(dy)
        return [y.detach()] + [t.grad for t in (x, w, r) if t is not None]

    monkeypatch.setattr(fast_launch, "_on", fast_launch._on)
    assert fast_launch.enabled()
    fast = [run() for _ in range(3)][-1]  # the third call: bound plans, small calls where they apply
    fast_launch.set_enabled(False)
    for a, b in zip(fast, run()):
        assert torch.equal(a, b)
