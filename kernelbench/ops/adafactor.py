"""Adafactor step on fp32 params: kernelbench's Triton Adafactor8bit (8-bit and fp32 state), the
pure-PyTorch fp32 reference, and the adafactor8bit 0.4.6 package (its CUDA kernels) as the anchor.

The algorithm is kernelbench/optim/adafactor/reference.py's (relative step, parameter scale, beta2_t =
1 - t^-0.8, factored second moment for >= 2-dim params, update clipping at RMS 1, decoupled
weight decay, no first moment). adafactor8bit differs in details (its momentum and weight-decay
conventions; its state codes), so it is timed beside ours and not compared for parity.

Bytes model: 12 bytes per parameter, what any Adafactor step must move (read p and g, write p;
the factored statistics are O(rows + cols)). Our kernels move 24 (g is read three times and p
twice, see kernelbench/optim/adafactor/kernels.py), so their GB/s figure reads as half of their traffic.
"""

from __future__ import annotations

from .base import Requires, Tolerance, Workload
from .optim_workloads import MODEL_370M, MODEL_TINY, TINY, SINGLE_4096x1024
from .optimizer_op import OptimizerOp

# A CPU workload whose large tensors are above min_8bit_size (4096), so that the 8-bit state is
# exercised in the interpreter: a factored (96, 80), a full 4100-vector, odd small ones.
SMALL_8BIT = Workload(
    "small-8bit", "cpu",
    {"shapes": [("w0", (96, 80)), ("v0", (4100,)), ("w1", (3, 33, 50)), ("b1", (50,)), ("s", (1,))]},
    seed=4,
)

adafactor = OptimizerOp(
    "adafactor",
    doc="Adafactor step (factored second moment, relative step, clipping), fp32 params",
    workloads=[TINY, MODEL_TINY, SMALL_8BIT, SINGLE_4096x1024, MODEL_370M],
    reference="torch-ref",
    speed_anchor="adafactor8bit",
    hyperparams={"lr": 1e-2, "beta1": None, "beta2": None, "decay_rate": -0.8, "eps": (1e-30, 1e-3),
                 "clip_threshold": 1.0, "weight_decay": 0.01, "relative_step": True, "scale_parameter": True},
    bytes_per_param=lambda candidate: 12,
    tag_values={"state": ("fp32", "8bit")},
)

# Measured in the interpreter over 100 steps of the harness's gradient stream (see
# tests/test_optim_adafactor.py and the README): the 8-bit state's rounding (stochastic, log2
# codes, at most 2^(+-span/255) per element) moves each parameter's trajectory by about 1e-3 of
# its cumulative change, which shows as ~1e-4 of the parameter's own norm; elementwise rtol 1e-5
# does not hold for any 8-bit state.
_EIGHT_BIT_TOLERANCE = {
    "fp32": Tolerance(
        atol=0.0, rtol=0.0, fro=2e-3,
        reason="8-bit second-moment state with stochastic rounding: params within 2e-3 relative "
               "Frobenius of the fp32 reference over 100 steps (measured below 1e-3)"),
}


@adafactor.candidate("torch-ref", baseline=True, tags={"state": "fp32"})
def torch_ref(named_params, **hp):
    """AdafactorRef: the pure-PyTorch fp32 reference, one kernel sequence per tensor."""
    from kernelbench.optim.adafactor.reference import AdafactorRef

    return AdafactorRef([p for _, p in named_params], **hp)


@adafactor.candidate("triton-8bit", requires=Requires(triton=True), tags={"state": "8bit"},
                     tolerance=_EIGHT_BIT_TOLERANCE)
def triton_8bit(named_params, **hp):
    """Adafactor8bit: fused Triton kernels, 8-bit log2-space state for tensors >= 4096 elements."""
    from kernelbench.optim.adafactor import Adafactor8bit

    return Adafactor8bit(named_params, quantize=True, **hp)


@adafactor.candidate("triton-fp32", requires=Requires(triton=True), tags={"state": "fp32"})
def triton_fp32(named_params, **hp):
    """Adafactor8bit(quantize=False): the same kernels with fp32 state."""
    from kernelbench.optim.adafactor import Adafactor8bit

    return Adafactor8bit(named_params, quantize=False, **hp)


@adafactor.candidate("adafactor8bit", requires=Requires(cuda=True, packages=("adafactor8bit",)),
                     baseline=True, parity=False, tags={"state": "8bit"})
def adafactor8bit_package(named_params, *, lr, beta1, beta2, decay_rate, eps, clip_threshold,
                          weight_decay, relative_step, scale_parameter):
    """adafactor8bit 0.4.6 (its JIT-built CUDA kernels, al8 state): the anchor.

    Its step() reads p.grad and leaves it in place (it never sets p.grad to None or frees a
    gradient; read in its optimizer.py, step / _init_group / _update_param_8bit), so the
    harness's repeated timed steps on one set of gradients are real steps. Its state lives in
    optimizer.state (uint8 codes, fp32 scales; the step counter is a host int), so the sum of
    those tensors is its state memory (an allocator delta would also count other candidates'
    params and grads freed in between)."""
    from adafactor8bit import Adafactor8Bit

    # scale_weight_decay=False: decay by the step size rho, as ours does (its default multiplies
    # by alpha = rho * RMS(p)); quantize with its default blocks and min_8bit_size = 4096.
    return Adafactor8Bit(
        [p for _, p in named_params], lr=lr, beta1=beta1, beta2=beta2, beta2_decay=decay_rate,
        eps=eps, weight_decay=weight_decay, d=clip_threshold, relative_step=relative_step,
        scale_parameter=scale_parameter, scale_weight_decay=False, quantize=True,
        min_8bit_size=4096, use_cuda_kernel=True,
    )
