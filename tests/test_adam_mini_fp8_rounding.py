"""fp8 Adam-mini state against fp32: the stored first moment is the fp32 one rounded to nearest.

Round to nearest even, not stochastic: each stored m is within half an e4m3 spacing of the m the
step computed (2^-4 relative for normal values, 2^-10 of the block's scale for subnormal ones),
and the signed errors average to about zero, so the stored state carries no systematic bias."""

import torch

from kernelbench.optim.adam_mini import AdamMini

BETA1 = 0.9


def test_fp8_m_is_the_fp32_m_rounded_to_nearest_without_bias():
    gen = torch.Generator().manual_seed(11)
    rows, cols = 32, 256  # 32 Adam-mini blocks (one per row) of 256 elements each
    param = torch.nn.Parameter(torch.randn(rows, cols, generator=gen) * 0.02)
    opt = AdamMini([("mlp.w", param)], lr=1e-3, betas=(BETA1, 0.999), weight_decay=0.0, state_dtype="fp8",
                   min_8bit_size=0)
    stored = torch.zeros(rows, cols)
    errors = []
    for _ in range(3):
        g = torch.randn(rows, cols, generator=gen) * torch.logspace(-3, 1, rows)[:, None]
        param.grad = g
        opt.step()
        exact = BETA1 * stored + (1 - BETA1) * g  # the step's unrounded m, from the stored one
        state = opt.state[param]
        scale = state["m_scale"].reshape(rows, 1)
        stored = state["m_fp8"].float().reshape(rows, cols) * scale
        err = stored - exact
        bound = 2.0**-4 * exact.abs() + 2.0**-10 * scale + 1e-6 * exact.abs().amax(dim=1, keepdim=True)
        assert (err.abs() <= bound).all(), (err.abs() / bound).max()
        errors.append(err / scale)  # in units of each block's scale, so blocks weigh alike
    signed = torch.cat(errors)
    assert signed.abs().mean() > 0  # fp8 does round
    assert signed.mean().abs() <= 0.02 * signed.abs().mean()  # no systematic bias
