"""kernelbench's layers inside an FSDP2-sharded Llama on two GPUs (NCCL): the loss and every
gradient equal the unsharded model's, with and without resharding after forward."""

from __future__ import annotations

import pytest
import torch
from test_nn_fsdp import layers_under_fsdp

from kernelbench.distributed.spawn import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


@pytest.mark.parametrize("reshard", [True, False])
def test_kernelbench_layers_under_fsdp2_on_two_gpus(reshard):
    for report in run_ranks(layers_under_fsdp, 2, backend="nccl", args=(reshard,), timeout_s=240):
        assert abs(report["loss"] - report["ref_loss"]) <= 1e-5 * abs(report["ref_loss"]), report
        assert report["worst_grad_rel"] < 1e-4 and report["params"] > 0, report
