"""Dtypes in the op registry are named by strings, so it loads without torch; torch dtypes given
by an op (or a test) mean the same thing."""

import pytest
import torch

from kernelbench.ops import get_op
from kernelbench.ops.base import DEFAULT_TOLERANCES, Tolerance, by_dtype, dtype_name, torch_dtype


@pytest.mark.parametrize("torch_type, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16"),
                                              (torch.float16, "fp16"), (torch.float64, "fp64")])
def test_names_and_torch_dtypes_round_trip(torch_type, name):
    assert dtype_name(torch_type) == name == dtype_name(name) == dtype_name(str(torch_type).removeprefix("torch."))
    assert torch_dtype(name) is torch_type and torch_dtype(torch_type) is torch_type


def test_unknown_dtype_names_what_is_accepted():
    with pytest.raises(ValueError, match="accepted: fp64, fp32, fp16, bf16"):
        torch_dtype("fp7")


def test_tolerance_tables_keyed_either_way_agree():
    tol = Tolerance(1e-3, 1e-3)
    assert by_dtype({torch.bfloat16: tol}) == by_dtype({"bf16": tol}) == {"bf16": tol}
    rmsnorm = get_op("rmsnorm")
    assert rmsnorm.tolerance_for(None, torch.bfloat16, "grad_weight") == rmsnorm.tolerance_for(
        None, "bf16", "grad_weight"
    )
    assert rmsnorm.tolerance_for(None, torch.float32, "y") == DEFAULT_TOLERANCES["fp32"]
    fp8 = get_op("adam-mini").get_candidate("triton-fp8")
    assert get_op("adam-mini").tolerance_for(fp8, torch.float32).fro is not None  # the candidate's own bound
