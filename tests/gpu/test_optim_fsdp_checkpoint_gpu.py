"""DCP checkpoints of every optimizer under FSDP2 on the GPUs of one host (NCCL): saved on 2 ranks,
loaded on 4 and on 1 (resharded), then trained on as the unsharded model trained all the way."""

from __future__ import annotations

import pytest
import torch

from kernelbench.distributed.fsdp import CheckpointRequest, checkpoint_resume_rank, checkpoint_save_rank
from kernelbench.distributed.fsdp_bench import PARITY_CONFIG, _bound
from kernelbench.distributed.spawn import run_ranks

pytestmark = pytest.mark.gpu

# The sharded-against-unsharded tolerances of tests/gpu/test_optim_fsdp_gpu.py (the reasons are there).
RTOL = {"triton-adamw": 0.0, "adam-mini-fp32": 1e-5, "adam-mini-bf16": 1e-5, "adam-mini-fp8": 1e-5,
        "adafactor-8bit": 1e-2, "adafactor-fp32": 1e-5, "muon": 1e-2}
# Adam's per-element state depends on the gradients only: equal bit for bit however the model is cut,
# fp8 momentum with its scales included (Adafactor's momentum follows the factored update instead).
EXACT_STATE = (".m", ".m_fp8", ".m_scale", ".v", ".step", ".exp_avg", ".exp_avg_sq")


def _worlds():
    return [w for w in (4, 1) if w <= torch.cuda.device_count()]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="saves on two GPUs")
@pytest.mark.parametrize("name", sorted(RTOL))
def test_checkpoint_saved_on_two_gpus_resumes_on_four_and_one(name, tmp_path):
    request = CheckpointRequest(_bound(name, PARITY_CONFIG), PARITY_CONFIG, str(tmp_path / "ckpt"),
                                steps_before=2, steps_after=2)
    run_ranks(checkpoint_save_rank, 2, backend="nccl", args=(request,), timeout_s=300)
    for world in _worlds():
        rows = run_ranks(checkpoint_resume_rank, world, backend="nccl", args=(request,), timeout_s=300)[0]
        worst = max(rows, key=lambda r: r["rel_frob"])
        assert rows and not any(r.get("nan_mismatch") or r.get("missing") for r in rows), (world, worst)
        exact = [r for r in rows if r["tensor"].endswith(EXACT_STATE) and not name.startswith("adafactor")]
        assert all(r["bitwise"] for r in exact), (world, [r for r in exact if not r["bitwise"]][:3])
        if RTOL[name] == 0.0:
            assert all(r["bitwise"] for r in rows), (world, worst)
        assert worst["rel_frob"] <= RTOL[name], (world, worst)
