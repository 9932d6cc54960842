"""patch_hf_model and hf-step on CUDA: bf16 twins of real checkpoints against the unpatched model
in fp32 (the -parity workloads: few tokens), every candidate including liger's, and liger's
per-instance patch leaving the other models of the process alone.

    pytest -m gpu tests/gpu/test_hf_patch_gpu.py -v     # one GPU, a few minutes
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.testing import assert_parity

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers", reason="transformers (an optional peer) is not installed")

PARITY_WORKLOADS = ["hf-smollm-135m-layer4-parity", "hf-qwen2.5-0.5b-layer4-parity", "hf-llama-3.2-1b-layer4-parity"]
# liger's patch under torch.compile stops in Dynamo (an AssertionError in its RMSNorm) on the Qwen2.5
# and Llama-3.2 twins with transformers 5.x (results/2026-11-27-4xh200-hf-parity): SmolLM's only.
CASES = [(c, w) for c in ("hf-compile", "kernelbench-eager", "kernelbench-compile", "liger-eager")
         for w in PARITY_WORKLOADS] + [("liger-compile", PARITY_WORKLOADS[0])]
# A patched model's worst tensor against fp32 may be this much worse than the unpatched model's own
# in bf16 (measured: 0.998-1.044, results/2026-11-27-4xh200-hf-parity).
OWN_BF16_ERROR_FACTOR = 1.1
_ROWS: dict[tuple[str, str], list[dict]] = {}


def _parity_rows(candidate: str, workload: str) -> list[dict]:
    if (candidate, workload) not in _ROWS:
        _ROWS[candidate, workload] = assert_parity("hf-step", candidate, workloads=[workload], steps=2, device="cuda")
    return _ROWS[candidate, workload]


def _worst_rel_fro(rows: list[dict]) -> tuple[float, str]:
    worst = max((r for r in rows if r["metric"] == "parity_rel_fro" and r["value"] is not None),
                key=lambda r: r["value"])
    return float(worst["value"]), worst["tensor"]


@pytest.mark.parametrize(("candidate", "workload"), CASES)
def test_hf_step_candidates_match_the_unpatched_model(candidate, workload):
    _parity_rows(candidate, workload)


@pytest.mark.parametrize("workload", PARITY_WORKLOADS)
@pytest.mark.parametrize("candidate", ["kernelbench-eager", "kernelbench-compile"])
def test_patched_model_is_as_close_to_fp32_as_the_unpatched_model_in_bf16(candidate, workload):
    ours, ours_tensor = _worst_rel_fro(_parity_rows(candidate, workload))
    theirs, theirs_tensor = _worst_rel_fro(_parity_rows("hf-compile", workload))
    assert ours <= OWN_BF16_ERROR_FACTOR * theirs, (
        f"{candidate} on {workload}: worst relative Frobenius error {ours:.4f} ({ours_tensor}) against the fp32 "
        f"model, above {OWN_BF16_ERROR_FACTOR} x the unpatched bf16 model's {theirs:.4f} ({theirs_tensor})")


def test_liger_patch_leaves_other_instances_alone():
    pytest.importorskip("liger_kernel", reason="liger-kernel (an optional peer) is not installed")
    from transformers.models.llama import modeling_llama

    from kernelbench.ops.hf_step import _liger_patch, hf_model

    rotary, norm_forward = modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm.forward
    patched, other = hf_model("llama-tiny", 0, "cuda", "bf16"), hf_model("llama-tiny", 0, "cuda", "bf16")
    _liger_patch(patched)
    assert modeling_llama.apply_rotary_pos_emb is rotary
    assert modeling_llama.LlamaRMSNorm.forward is norm_forward
    assert not any("forward" in vars(m) for m in other.modules())
    tokens = torch.randint(0, 128, (2, 16), device="cuda")
    torch.testing.assert_close(patched(input_ids=tokens).logits.float(), other(input_ids=tokens).logits.float(),
                               atol=5e-2, rtol=5e-2)
