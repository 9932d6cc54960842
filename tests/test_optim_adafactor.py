"""Adafactor8bit (Triton, interpreter on the CPU) against AdafactorRef, its 8-bit error bounds,
checkpoints and bad input. Shapes are small and odd; GPU-only checks are in tests/gpu/."""

import copy
import io
import math

import pytest
import torch

from kernelbench.optim.adafactor import COL_BLOCK, FLAT_BLOCK, ROW_BLOCK, Adafactor8bit, dequantize_state
from kernelbench.optim.adafactor.reference import AdafactorRef

# (64, 48): factored, one row block; (130, 70): three row blocks, C not a multiple of 16;
# (3, 5, 7): a batch of matrices; (50,), (1,): full second moment.
SHAPES = [(130, 70), (3, 5, 7), (50,), (1,), (64, 48)]
CONFIGS = {
    "default": {},
    "beta1-wd": {"beta1": 0.9, "weight_decay": 0.1},
    "fixed-beta2": {"beta2": 0.99, "relative_step": False, "lr": 1e-3, "scale_parameter": False,
                    "clip_threshold": 0.5},
}


def make_params(shapes, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(device)) for s in shapes]


def set_grads(params, step, seed=1000):
    gen = torch.Generator().manual_seed(seed + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.device)


def assert_close(name, actual, expected, rtol, atol):
    """allclose that says how many elements mismatch, where the worst one is, and NaN/Inf."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.double(), expected.double()
    bad_nan = torch.isnan(a) != torch.isnan(e)
    bad_inf = torch.isinf(a) != torch.isinf(e)
    assert not bad_nan.any() and not bad_inf.any(), f"{name}: NaN/Inf pattern differs"
    err = (a - e).abs()
    outside = err > atol + rtol * e.abs()
    if outside.any():
        worst = int(torch.argmax(err / (atol + rtol * e.abs())))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape))
        raise AssertionError(
            f"{name}: {int(outside.sum())}/{a.numel()} elements outside atol {atol:g} + rtol {rtol:g}; "
            f"worst at {idx}: {a.flatten()[worst]:.9g} vs {e.flatten()[worst]:.9g}")


def run(opt_cls, params, steps, first=0, **kw):
    opt = opt_cls(params, **kw)
    for step in range(first, first + steps):
        set_grads(params, step)
        opt.step()
    return opt


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fp32_state_matches_reference(config):
    kw = CONFIGS[config]
    ref_params, tri_params = make_params(SHAPES), make_params(SHAPES)
    ref = run(AdafactorRef, ref_params, 4, **kw)
    tri = run(Adafactor8bit, tri_params, 4, quantize=False, **kw)
    for i, (r, t) in enumerate(zip(ref_params, tri_params)):
        assert_close(f"param {i} {tuple(r.shape)}", t.detach(), r.detach(), rtol=1e-5, atol=1e-7)
        assert set(tri.state[t]) == set(ref.state[r])
        for key, value in ref.state[r].items():
            # atol 1e-6 of the tensor's largest value: m = beta1 m + (1 - beta1) u cancels to ~0 in places
            assert_close(f"state {key} of param {i}", tri.state[t][key], value, rtol=1e-5,
                         atol=1e-6 * float(value.abs().max()))


def _log2_bound(ranges):
    # one code step of each block's range, in log2 (the stochastic rounding error is below it)
    return (ranges[:, 1] - ranges[:, 0]) / 255.0


@pytest.mark.parametrize("beta2", [None, 0.9])
def test_8bit_codes_within_documented_bound(beta2):
    """After two steps from the same inputs, the decoded 8-bit state against the fp32 kernels'
    state: second moments within one code step in log2 (relative, whatever the magnitude; the
    second step decodes and re-encodes), the first moment within its code step of the absmax."""
    shapes = [(130, 70), (3, 5, 7), (300,)]
    p8, p32 = make_params(shapes), make_params(shapes)
    kw = {"beta1": 0.9, "beta2": beta2}
    q = run(Adafactor8bit, p8, 1, min_8bit_size=0, **kw)
    f = run(Adafactor8bit, p32, 1, quantize=False, **kw)
    # one more step on both from the *fp32* trajectory's state would differ; compare after step 1
    for a, b in zip(p8, p32):
        decoded, exact = dequantize_state(a, q.state[a]), f.state[b]
        if a.ndim >= 2:
            R, C = a.shape[-2], a.shape[-1]
            B = a.numel() // (R * C)
            row_step = _log2_bound(q.state[a]["row_range"]).view(B, -1)[:, torch.arange(R) // ROW_BLOCK]
            col_step = _log2_bound(q.state[a]["col_range"]).view(B, -1)[:, torch.arange(C) // COL_BLOCK]
            checks = [("row", row_step.reshape(exact["row"].shape)), ("col", col_step.reshape(exact["col"].shape))]
        else:
            checks = [("v", _log2_bound(q.state[a]["v_range"])[torch.arange(a.numel()) // FLAT_BLOCK])]
        for key, step in checks:
            err = (decoded[key].log2() - exact[key].log2()).abs()
            assert (err <= step + 1e-5).all(), f"{key} of {tuple(a.shape)}: log2 error {err.max():.3g} > step"
            assert step.max() <= 40.0 / 255.0 + 1e-6  # the span cap
        m, m_exact = decoded["m"], exact["m"]
        absmax = q.state[a]["m_scale"].max()
        assert (m - m_exact).abs().max() <= 2.0 / 127.0 * absmax + 1e-12
        big = m_exact.abs() > 0.02 * absmax
        assert torch.equal(torch.sign(m[big]), torch.sign(m_exact[big]))


def _relative_change_error(params, ref_params, initial):
    num = sum(float((p - r).detach().norm() ** 2) for p, r in zip(params, ref_params))
    den = sum(float((r - p0).detach().norm() ** 2) for r, p0 in zip(ref_params, initial))
    return math.sqrt(num / den)


@pytest.mark.parametrize("kw, steps, bound", [
    ({}, 50, 5e-3),                  # measured 2.4e-3 (no first moment: the timed configuration)
    ({"beta1": 0.9}, 20, 3e-2),      # measured 1.5e-2 (8-bit first moment on top)
])
def test_8bit_tracks_reference(kw, steps, bound):
    """Relative error of the cumulative parameter change, 8-bit vs the fp32 reference, on a
    factored (40, 120) and a full (4100,) tensor, both above min_8bit_size."""
    shapes = [(40, 120), (4100,)]
    initial = [p.detach().clone() for p in make_params(shapes)]
    p8, pr = make_params(shapes), make_params(shapes)
    run(Adafactor8bit, p8, steps, **kw)
    run(AdafactorRef, pr, steps, **kw)
    err = _relative_change_error(p8, pr, initial)
    print(f"8-bit vs reference, {steps} steps {kw}: relative error of the cumulative change {err:.3g}")
    assert err < bound, f"8-bit cumulative-change error {err:.3g} above {bound:g}"
    assert err > 0  # the 8-bit state is in use (not silently fp32)


@pytest.mark.parametrize("quantize", [True, False])
def test_state_dict_round_trip_resumes_bitwise(quantize):
    shapes = [(70, 65), (4100,), (33,)]
    kw = {"beta1": 0.9, "weight_decay": 0.01, "quantize": quantize, "min_8bit_size": 1024}
    pa = make_params(shapes)
    a = run(Adafactor8bit, pa, 3, **kw)
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in pa], "opt": a.state_dict()}, buf)
    for step in (3, 4):
        set_grads(pa, step)
        a.step()
    buf.seek(0)
    saved = torch.load(buf)
    pb = [torch.nn.Parameter(t) for t in saved["params"]]
    b = Adafactor8bit(pb, **kw)
    b.load_state_dict(saved["opt"])
    for step in (3, 4):
        set_grads(pb, step)
        b.step()
    for x, y in zip(pa, pb):
        assert torch.equal(x, y)
        assert set(a.state[x]) == set(b.state[y])
        for key in a.state[x]:
            assert a.state[x][key].dtype == b.state[y][key].dtype, key
            assert torch.equal(a.state[x][key], b.state[y][key]), key


def test_groups_and_params_without_grad():
    """Two groups with their own settings; a parameter without a gradient is left alone (no
    state, no step), and a later step that gives it one starts its state then."""
    p1, p2, p3 = make_params([(20, 30), (40,), (5, 6)])
    q1, q2, q3 = make_params([(20, 30), (40,), (5, 6)])
    opt = Adafactor8bit([{"params": [p1, p2]}, {"params": [p3], "beta1": 0.5, "weight_decay": 0.2}])
    ref = AdafactorRef([{"params": [q1, q2]}, {"params": [q3], "beta1": 0.5, "weight_decay": 0.2}])
    for step in range(3):
        set_grads([p1, p2, p3], step)
        set_grads([q1, q2, q3], step)
        if step == 0:
            p2.grad = q2.grad = None
        opt.step()
        ref.step()
        if step == 0:
            assert p2 not in opt.state or not opt.state[p2]
            assert torch.equal(p2, make_params([(20, 30), (40,)])[1])
    for p, q in zip((p1, p2, p3), (q1, q2, q3)):
        assert_close(f"param {tuple(p.shape)}", p.detach(), q.detach(), rtol=1e-5, atol=1e-7)
        assert float(opt.state[p]["step"]) == float(ref.state[q]["step"])


def test_named_params_name_the_culprit_in_errors():
    w, b = make_params([(8, 9), (9,)])
    opt = Adafactor8bit([("layer.weight", w), ("layer.bias", b)])
    w.grad = torch.randn(8, 9)
    b.grad = torch.randn(9).to_sparse()
    with pytest.raises(RuntimeError, match=r"layer\.bias.*sparse"):
        opt.step()


def test_bad_input_errors():
    w, v = make_params([(8, 9), (9,)])
    opt = Adafactor8bit([w, v])
    set_grads([w, v], 0)
    v.grad.data = torch.randn(3, 3)
    with pytest.raises(RuntimeError, match=r"parameter 1 \(9\).*shape \(3, 3\)"):
        opt.step()
    d = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    d.grad = torch.ones_like(d)
    with pytest.raises(RuntimeError, match=r"parameter 0 \(4x4\) has dtype torch.float64; supported: torch.float32"):
        Adafactor8bit([d]).step()
    # parameters of one group on two devices
    m = torch.nn.Parameter(torch.zeros(4, device="meta"))
    m.grad = torch.zeros(4, device="meta")
    opt2 = Adafactor8bit([w, m])
    set_grads([w], 0)
    with pytest.raises(RuntimeError, match=r"parameter 1 \(4\) is on meta.*cpu"):
        opt2.step()
    # bf16 parameters are refused (the kernels take fp32)
    h = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))
    h.grad = torch.zeros_like(h)
    with pytest.raises(RuntimeError, match="bfloat16"):
        Adafactor8bit([h]).step()


@pytest.mark.parametrize("kw, match", [
    ({"lr": 0.0}, "lr=0.0"),
    ({"beta1": 1.0}, "beta1=1.0"),
    ({"beta2": -0.1}, "beta2=-0.1"),
    ({"decay_rate": 0.5}, "decay_rate=0.5"),
    ({"eps": (1e-30,)}, "eps="),
    ({"clip_threshold": 0.0}, "clip_threshold=0.0"),
    ({"weight_decay": -1.0}, "weight_decay=-1.0"),
    ({"min_8bit_size": 2.5}, "min_8bit_size=2.5"),
])
def test_bad_hyperparameters(kw, match):
    with pytest.raises(ValueError, match=match):
        Adafactor8bit(make_params([(4, 4)]), **kw)


def test_state_that_does_not_fit_the_settings_is_refused():
    """torch's load_state_dict restores the saved group settings; a setting changed afterwards
    that needs another state layout is an error naming the parameter, not a silent reset."""
    p = make_params([(70, 65)])
    a = run(Adafactor8bit, p, 1, min_8bit_size=0)
    b = Adafactor8bit(p, quantize=False)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.param_groups[0]["quantize"] is True
    b.param_groups[0]["quantize"] = False
    set_grads(p, 1)
    with pytest.raises(RuntimeError, match=r"parameter 0 \(70x65\).*quantize=False"):
        b.step()


def test_kernels_read_only_constexpr_globals():
    """Compiled Triton (the GPU) raises NameError for a global read inside @triton.jit unless it
    is a tl.constexpr, another jit function or a module; the interpreter accepts anything, so
    check every global the module's kernels and device helpers read, by their bytecode."""
    import dis
    import types

    import triton.language as tl

    from kernelbench.optim.adafactor import kernels as module

    jitted = {name: obj for name, obj in vars(module).items() if hasattr(obj, "fn") and callable(obj.fn)}
    assert "_factored_stats_kernel" in jitted and "_seed" in jitted
    bad = []
    for name, obj in jitted.items():
        for ins in dis.get_instructions(obj.fn):
            if ins.opname != "LOAD_GLOBAL" or ins.argval not in obj.fn.__globals__:
                continue  # builtins (float, range) are handled by Triton's code generator
            value = obj.fn.__globals__[ins.argval]
            if not (isinstance(value, (tl.constexpr, types.ModuleType)) or ins.argval in jitted):
                bad.append(f"{name} reads {ins.argval} = {value!r}")
    assert not bad, "globals that compiled Triton rejects: " + "; ".join(bad)


def test_launch_config_changes_speed_not_results():
    """A non-default launch (more programs for 1-dim tensors, other reduction blocks) covers the
    same elements: fp32 state agrees with the default launch to rounding, the state layout is the
    same, and anything but a LaunchConfig is refused."""
    from kernelbench.optim.adafactor.host import FactoredConfig, FinishConfig, FullConfig, LaunchConfig

    small = LaunchConfig(factored=FactoredConfig(part_rows=2, reduce_block=2),
                         full=FullConfig(blocks_per_program=1), finish=FinishConfig(reduce_block=2))
    shapes = [(130, 70), (600,)]  # 3 row blocks; 3 flat blocks, so 3 programs at one block each
    a, b = make_params(shapes), make_params(shapes)
    opt_a = run(Adafactor8bit, a, 2, quantize=False)
    opt_b = run(Adafactor8bit, b, 2, quantize=False, launch_config=small)
    for i, (pa, pb) in enumerate(zip(a, b)):
        assert_close(f"param {i}", pb.detach(), pa.detach(), rtol=1e-5, atol=1e-7)
        assert set(opt_a.state[pa]) == set(opt_b.state[pb])
    with pytest.raises(TypeError, match="launch_config"):
        Adafactor8bit(make_params([(4,)]), launch_config={"num_warps": 4})


class _Tagged(torch.Tensor):
    """A tensor subclass the kernels know nothing of (its data_ptr may not be its data)."""


def test_tensor_subclasses_are_refused_before_any_launch():
    w, b = make_params([(8, 9), (9,)])
    sub = torch.nn.Parameter(torch.zeros(8, 9).as_subclass(_Tagged))
    sub.grad = torch.ones(8, 9)
    with pytest.raises(TypeError, match=r"parameter 'layer.sub' \(8x9\) is a .*_Tagged; the kernels take plain"):
        Adafactor8bit([("layer.w", w), ("layer.sub", sub)]).step()
    b.grad = torch.ones(9).as_subclass(_Tagged)
    with pytest.raises(TypeError, match=r"the gradient of parameter 0 \(9\) is a .*_Tagged"):
        Adafactor8bit([b]).step()
    assert torch.equal(w, make_params([(8, 9)])[0]), "a parameter was stepped before the error"


def test_meta_parameters_are_refused():
    m = torch.nn.Parameter(torch.zeros(4, 4, device="meta"))
    m.grad = torch.zeros(4, 4, device="meta")
    with pytest.raises(ValueError, match=r"parameter 0 \(4x4\) is a meta tensor"):
        Adafactor8bit([m]).step()


def test_storage_smaller_than_the_tensor_is_refused():
    """A gradient whose storage was shrunk under it (as FSDP1 frees parameters): the kernel would
    read past the allocation."""
    w = make_params([(8, 9)])[0]
    w.grad = torch.randn(8, 9)
    w.grad.untyped_storage().resize_(16)
    with pytest.raises(ValueError, match=r"the gradient of parameter 0 \(8x9\) is a view reaching byte 288 of a "
                                         r"storage of 16 bytes"):
        Adafactor8bit([w], min_8bit_size=0).step()


def _shrunk(t):
    t.untyped_storage().resize_(1)
    return t


@pytest.mark.parametrize("key, tamper, error, match", [
    ("row_q", _shrunk, ValueError, r"state 'row_q' of parameter 0 \(70x65\) is a view reaching byte 70 of a storage "
     r"of 1 bytes"),
    ("col_range", lambda t: t.to("meta"), ValueError, r"state 'col_range' of parameter 0 \(70x65\) is a meta tensor"),
    ("m_q", lambda t: t.float(), RuntimeError, r"state 'm_q' of parameter 0 \(70x65\) is torch.float32 of shape "
     r"\(70, 65\); the kernels need contiguous torch.uint8 of shape \(70, 65\)"),
    ("m_scale", lambda t: t[:35], RuntimeError, r"state 'm_scale' of parameter 0 \(70x65\) is torch.float32 of shape "
     r"\(35, 1\); the kernels need contiguous torch.float32 of shape \(70, 1\)"),
    ("row_range", lambda t: t.t(), RuntimeError, r"state 'row_range' of parameter 0 \(70x65\) is torch.float32 of "
     r"shape \(2, 2\), not contiguous"),
    ("row_q", lambda t: t.as_subclass(_Tagged), TypeError, r"state 'row_q' of parameter 0 \(70x65\) is a .*_Tagged"),
])
def test_state_tensors_are_checked_before_any_launch(key, tamper, error, match):
    """Every state tensor whose address enters a launch table is checked when the table is built
    (type, device, storage extent, dtype, shape, contiguity)."""
    p = make_params([(70, 65)])
    opt = run(Adafactor8bit, p, 1, beta1=0.9, min_8bit_size=0)
    before = p[0].detach().clone()
    opt.state[p[0]][key] = tamper(opt.state[p[0]][key])
    set_grads(p, 1)  # a new gradient tensor: the launch tables are rebuilt, and the state checked
    with pytest.raises(error, match=match):
        opt.step()
    assert torch.equal(p[0].detach(), before)


def test_state_dict_of_another_shape_never_reaches_a_kernel():
    """torch's load_state_dict does not compare shapes; a state dict saved for a (70, 65)
    parameter loaded for a (65, 70) one would make the kernels write past the row codes."""
    a = run(Adafactor8bit, make_params([(70, 65)]), 1, min_8bit_size=0)
    q = make_params([(65, 70)])
    b = Adafactor8bit(q, min_8bit_size=0)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    set_grads(q, 0)
    with pytest.raises(RuntimeError, match=r"state 'row_q' of parameter 0 \(65x70\) is torch.uint8 of shape \(70,\); "
                                           r"the kernels need contiguous torch.uint8 of shape \(65,\)"):
        b.step()
