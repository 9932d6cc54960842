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


@pytest.mark.parametrize("candidate", ["hf-compile", "kernelbench-eager", "kernelbench-compile", "liger-eager",
                                       "liger-compile"])
def test_hf_step_candidates_match_the_unpatched_model(candidate):
    assert_parity("hf-step", candidate, workloads=PARITY_WORKLOADS, steps=2, device="cuda")


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
