"""kernelbench.nn.rotary: Triton rotary (interpreter on CPU) against fp64 references."""

import pytest
import torch

from kernelbench.nn.rotary import RotaryConfig, apply_rotary, apply_rotary_, rotary_config, rotary_ref
from kernelbench.ops.rotary import rotary_ref as hf_rotary_ref

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def assert_close(name, got, want, atol, rtol):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    bad = (got - want).abs() > atol + rtol * want.abs()
    if bad.any():
        raise AssertionError(
            f"{name}: {bad.sum().item()} of {bad.numel()} elements outside atol={atol} rtol={rtol}, max abs diff "
            f"{(got - want).abs().max().item():.3g}, first at {tuple(bad.nonzero()[0].tolist())}"
        )


def tables(positions, rot, style, base=10000.0):
    """cos / sin (positions, rot) in the 'full' layout of each style's reference code."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    full = torch.cat((angles, angles), -1) if style == "half" else angles.repeat_interleave(2, -1)
    return full.cos(), full.sin()


def make(b, hq, hk, s, d, layout, dtype, gen, strided=False):
    def one(h):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        if strided:  # every other element of the head dim: no unit stride anywhere
            return torch.randn(*shape[:-1], 2 * d, generator=gen)[..., ::2].to(dtype)
        return torch.randn(shape, generator=gen).to(dtype)

    return one(hq), one(hk)


CASES = [  # b, hq, hk, s, d, rot, offset, strided
    (2, 4, 2, 16, 32, 32, 0, False),
    (1, 3, 1, 7, 40, 24, 5, False),  # partial rotary, odd heads, offset
    (2, 5, 3, 9, 64, 32, "tensor", True),  # per-batch offsets, strided inputs
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("case", CASES, ids=["full", "partial-offset", "strided-batch-offsets"])
def test_matches_reference(case, style, layout, dtype):
    b, hq, hk, s, d, rot, offset, strided = case
    gen = torch.Generator().manual_seed(hq * 100 + s)
    q, k = make(b, hq, hk, s, d, layout, dtype, gen, strided)
    q.requires_grad_(True)
    k.requires_grad_(True)
    if offset == "tensor":
        offset = torch.tensor([3, 0][:b])
    max_offset = int(offset.max()) if isinstance(offset, torch.Tensor) else offset
    cos, sin = tables(s + max_offset, rot, style)
    cos, sin = cos.to(dtype), sin.to(dtype)
    qo, ko = apply_rotary(q, k, cos, sin, style=style, layout=layout, position_offset=offset, impl="triton")
    assert qo.shape == q.shape and ko.shape == k.shape
    dq_out, dk_out = torch.randn(qo.shape, generator=gen).to(dtype), torch.randn(ko.shape, generator=gen).to(dtype)
    torch.autograd.backward((qo, ko), (dq_out, dk_out))

    q64, k64 = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    rq, rk = rotary_ref(q64, k64, cos.double(), sin.double(), style=style, layout=layout, position_offset=offset)
    torch.autograd.backward((rq, rk), (dq_out.double(), dk_out.double()))
    atol, rtol = TOL[dtype]
    for name, got, want in [("q_out", qo, rq), ("k_out", ko, rk), ("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad)]:
        assert_close(name, got, want, atol, rtol)
    if rot < d:  # the pass-through dims are copied exactly
        assert torch.equal(qo[..., rot:], q.detach()[..., rot:])


def test_reference_matches_hf_and_gptj():
    gen = torch.Generator().manual_seed(0)
    q, k = make(2, 3, 1, 6, 16, "bhsd", torch.float64, gen)
    cos, sin = tables(6, 16, "half")
    for ours, hf in zip(rotary_ref(q, k, cos, sin), hf_rotary_ref(q, k, cos, sin)):
        assert_close("rotate_half vs HF", ours, hf, 1e-12, 0)
    # GPT-J: consecutive pairs (x0, x1) rotate as the complex number x0 + i x1 times e^{i theta}.
    cos_i, sin_i = tables(6, 16, "interleaved")
    theta = torch.atan2(sin_i[:, ::2], cos_i[:, ::2])
    as_complex = torch.view_as_complex(q.unflatten(-1, (-1, 2)).contiguous())
    expected = torch.view_as_real(as_complex * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
    assert_close("interleaved vs complex", rotary_ref(q, k, cos_i, sin_i, style="interleaved")[0], expected, 1e-12, 0)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("rot", [32, 24], ids=["full", "partial"])
def test_reference_slices_an_int_offset_as_it_gathers_a_tensor_one(layout, rot):
    """rotary_ref slices the tables for an int offset and gathers them by position for a tensor
    of offsets: the same rotation where both say the same offset."""
    gen = torch.Generator().manual_seed(4)
    q, k = make(2, 4, 2, 9, 32, layout, torch.float64, gen)
    cos, sin = tables(14, rot, "half")
    by_slice = rotary_ref(q, k, cos, sin, layout=layout, position_offset=3)
    by_gather = rotary_ref(q, k, cos, sin, layout=layout, position_offset=torch.tensor([3, 3]))
    for got, want in zip(by_slice, by_gather):
        assert torch.equal(got, want)


def test_gradcheck_fp64():
    gen = torch.Generator().manual_seed(1)
    for style in ("half", "interleaved"):
        q, k = make(1, 2, 1, 5, 12, "bshd", torch.float64, gen)
        q.requires_grad_(True)
        k.requires_grad_(True)
        cos, sin = tables(7, 8, style)
        fn = lambda q, k, cos=cos, sin=sin, style=style: apply_rotary(
            q, k, cos, sin, style=style, layout="bshd", position_offset=2, impl="triton")
        assert torch.autograd.gradcheck(fn, (q, k), fast_mode=True)


def test_in_place_custom_op():
    gen = torch.Generator().manual_seed(2)
    q, k = make(2, 4, 2, 8, 48, "bshd", torch.float32, gen)
    cos, sin = tables(10, 32, "interleaved")
    cos, sin = cos.float(), sin.float()
    want_q, want_k = rotary_ref(q, k, cos, sin, style="interleaved", layout="bshd", position_offset=1)
    q_ptr = q.data_ptr()
    out_q, out_k = apply_rotary_(q, k, cos, sin, style="interleaved", layout="bshd", position_offset=1)
    assert out_q.data_ptr() == q_ptr
    assert_close("in-place q", q, want_q, 1e-5, 1e-5)
    assert_close("in-place k", k, want_k, 1e-5, 1e-5)
    schema = torch.ops.kernelbench.rotary_.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"q", "k"}


def test_auto_on_cpu_uses_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    gen = torch.Generator().manual_seed(4)
    q, k = make(1, 2, 1, 4, 8, "bhsd", torch.float32, gen)
    cos, sin = tables(4, 8, "half")
    got = apply_rotary(q, k, cos.float(), sin.float())
    want = rotary_ref(q, k, cos.float(), sin.float())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _bad(**over):
    gen = torch.Generator().manual_seed(9)
    q, k = make(2, 4, 2, 6, 16, "bhsd", torch.float32, gen)
    cos, sin = tables(6, 16, "half")
    args = {"q": q, "k": k, "cos": cos.float(), "sin": sin.float(), "impl": "triton", **over}
    return lambda: apply_rotary(args.pop("q"), args.pop("k"), args.pop("cos"), args.pop("sin"), **args)


@pytest.mark.parametrize("call, match", [
    (_bad(cos=torch.ones(6, 20), sin=torch.ones(6, 20)), "rotary dimension 20 .* larger than the head dimension 16"),
    (_bad(position_offset=1), r"cos / sin have 6 positions, shorter than the 7 needed"),
    (_bad(position_offset=torch.tensor([0, 2])), "shorter than the 8 needed"),
    (_bad(cos=torch.ones(6, 7), sin=torch.ones(6, 7)), "must be even"),
    (_bad(k=torch.randn(2, 2, 5, 16)), "must share batch, sequence and head dimension"),
    (_bad(q=torch.ones(2, 4, 6, 16, dtype=torch.int64)), "unsupported dtype"),
    (_bad(style="neox"), "style must be one of"),
    (_bad(layout="sbhd"), "layout must be one of"),
    (_bad(sin=torch.ones(5, 16)), "cos and sin must both be"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize("config", [
    RotaryConfig(block_h=1, block_s=4, num_warps=2),
    RotaryConfig(block_h=4, block_s=2, num_warps=4),
], ids=["one-head", "four-heads"])
def test_launch_configs_match_reference(config):
    """Tiles other than the default, with partial head and sequence blocks."""
    from kernelbench.nn.rotary.host import launch

    gen = torch.Generator().manual_seed(8)
    q, k = make(2, 6, 3, 7, 32, "bhsd", torch.bfloat16, gen)
    cos, sin = tables(7, 32, "half")
    cos, sin = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    launch(q, k, qo, ko, cos, sin, None, 0, interleaved=False, backward=False, copy_pass=True, config=config)
    rq, rk = rotary_ref(q.double(), k.double(), cos.double(), sin.double())
    assert_close("q_out", qo, rq, *TOL[torch.bfloat16])
    assert_close("k_out", ko, rk, *TOL[torch.bfloat16])


def test_default_config():
    """2 heads x 8 positions at 128 dims, one head per program for odd head counts."""
    assert rotary_config(32, 8, 2048, 64) == RotaryConfig(2, 8, 4)
    assert rotary_config(3, 1, 2048, 64) == RotaryConfig(1, 16, 4)
    assert rotary_config(4, 2, 3, 8) == RotaryConfig(2, 4, 4)
