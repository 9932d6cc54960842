"""kernelbench.testing: the parity check and the training band as pytest assertions, on the CPU
(Triton in the interpreter); tests/gpu/test_testing_gpu.py runs them on a GPU."""

from pathlib import Path

import pytest

from kernelbench.models import CONFIGS
from kernelbench.ops import get_op, plugins
from kernelbench.testing import assert_parity, assert_trains_like
from kernelbench.train import TrainSettings, resolve, with_changes

BROKEN = Path(__file__).parent / "plugins" / "broken_rmsnorm.py"


def test_assert_parity_passes_a_good_candidate_on_named_and_shaped_workloads():
    rows = assert_parity("rmsnorm", "triton", workloads=["1x760-fp32", "3x200:bf16"], steps=2)
    checks = [(r["workload"], r["mode"], r["status"]) for r in rows if r["metric"] == "parity"]
    assert sorted(checks) == sorted((w, m, "pass") for w in ("1x760-fp32", "3x200:bf16") for m in ("fwd", "fwd+bwd"))


def test_assert_parity_failure_lists_the_check_and_its_worst_tensors(registry_sandbox):
    assert plugins.load(str(BROKEN)).error is None
    factory = get_op("rmsnorm").get_candidate("broken-mutates-input").build
    with pytest.raises(AssertionError) as info:
        assert_parity(get_op("rmsnorm"), factory, workloads="64x256:fp32", modes=["fwd"])
    text = str(info.value)
    assert text.startswith("parity of rmsnorm/broken-mutates-input on cpu (2 step(s)) failed:")
    assert "64x256:fp32 fwd: fail: step 0: modified its input 'x'" in text
    with pytest.raises(AssertionError, match=r"(?s)grad_weight: fail; max abs .* rel Frobenius .* elements outside"):
        assert_parity("rmsnorm", "torch-rms-norm", workloads=["64x256:bf16"], modes=["fwd+bwd"], atol=0, rtol=1e-9)


def test_assert_parity_skips_what_cannot_run_here_and_refuses_the_reference():
    with pytest.raises(pytest.skip.Exception, match="rmsnorm/liger cannot run on cpu here"):
        assert_parity("rmsnorm", "liger")
    with pytest.raises(ValueError, match="not checked for parity"):
        assert_parity("adamw", "torch-forloop")
    with pytest.raises(ValueError, match="no mode 'bwd'"):
        assert_parity("rmsnorm", "triton", modes=["bwd"])


def test_assert_trains_like_passes_another_data_order_and_fails_a_10x_learning_rate():
    """The band's sensitivity through the helper: the reference under another data order trains
    like itself; with a 10x learning rate it does not."""
    settings = TrainSettings.defaults("cpu", steps=12)
    reference = resolve("adamw", CONFIGS[settings.model], names=["torch-forloop"])[0]
    result = assert_trains_like("adamw", with_changes(reference, "order-7", order_seed=7), steps=12)
    assert [o.status for o in result.outcomes] == ["pass", "pass"]
    with pytest.raises(AssertionError, match=r"adamw/lr-10x \(llama-tiny, 12 steps, cpu\) did not train like the "
                                             r"reference: final .* band"):
        assert_trains_like("adamw", with_changes(reference, "lr-10x", lr_factor=10), steps=12)


def test_assert_trains_like_puts_a_layer_candidate_in_the_model():
    """kernelbench's Triton RMSNorm (interpreted) as every norm of torch's layers trains like them."""
    result = assert_trains_like("rmsnorm", "triton", steps=6, ref_seeds=2)
    assert [o.name for o in result.outcomes] == ["torch", "triton"]
    triton = result.outcomes[1]
    assert triton.status == "pass" and abs(triton.verdict.final - result.band.seed_finals[0]) < 1e-4
