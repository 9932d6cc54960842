"""The plugin's kernels checked by kernelbench's harness: parity against kernelbench's rmsnorm
reference and this package's add-silu reference, and training a small model with the RMSNorm."""

from kernelbench.testing import assert_parity, assert_trains_like


def test_my_rmsnorm_matches_the_reference():
    # kernelbench's CPU workloads (an odd width, a 3-d bf16 input) and two more shapes
    assert_parity("rmsnorm", "my-triton")
    assert_parity("rmsnorm", "my-triton", workloads=["1x3000:fp32", "100x96:bf16"])


def test_add_silu_matches_the_reference():
    assert_parity("add-silu", "triton")


def test_my_rmsnorm_trains_like_torchs():
    assert_trains_like("rmsnorm", "my-triton", steps=6, ref_seeds=2, batch=2, seq=16)
