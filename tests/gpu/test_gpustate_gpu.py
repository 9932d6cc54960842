"""The GPU's state read on a real GPU: NVML (or nvidia-smi) answers for the device torch uses, a
run records it per round, and the test-only slowdown adds what it says on the device. Nothing here
changes the clocks (--lock-clocks is checked against a fake NVML in tests/test_gpustate.py)."""

import pandas as pd
import pytest
import torch

from kernelbench.harness import slowdown
from kernelbench.harness.gpustate import NvmlProbe, SmiProbe
from kernelbench.harness.runner import PlanItem, cuda_probe, run_benchmarks
from kernelbench.harness.timing import TimingConfig, time_cuda
from kernelbench.ops import get_op
from kernelbench.report.writer import ReportWriter

pytestmark = pytest.mark.gpu


def test_the_probe_reads_the_gpu_torch_uses():
    probe = cuda_probe()
    assert isinstance(probe, (NvmlProbe, SmiProbe)), probe.note
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    token = probe.start()
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    state = probe.finish(token)
    probe.close()
    assert state.sm_mhz and 200 < state.sm_mhz < 4000, state
    assert state.mem_mhz and state.mem_mhz > 200, state
    assert state.temperature_c is not None and 5 < state.temperature_c < 110, state
    assert state.power_w is not None and state.power_w > 10, state
    assert state.round_ms > 0
    if isinstance(probe, NvmlProbe):
        assert state.power_violation_ms is None or state.power_violation_ms >= 0


def test_a_run_records_the_state_of_every_round(tmp_path):
    op = get_op("rmsnorm")
    writer = ReportWriter(tmp_path, {}, "run")
    plan = [PlanItem(op, [op.get_candidate("triton"), op.get_candidate("torch-rms-norm")],
                     [op.workload("sweep-n4096-bf16")], ["fwd"])]
    run_benchmarks(plan, "cuda", writer, timing=TimingConfig(warmup_ms=5, rep_ms=30), rounds=3)
    writer.close("complete")
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert len(rounds) == 6 and set(rounds.gpu_source) <= {"nvml", "nvidia-smi"}
    assert (rounds.gpu_sm_mhz > 200).all() and (rounds.gpu_power_w > 10).all()
    samples = pd.read_csv(tmp_path / "samples.csv.gz")
    assert len(samples) == rounds.reps.sum()


def test_the_slowdown_hook_adds_its_fraction_on_the_device():
    x = torch.randn(8192, 8192, device="cuda")
    y = torch.empty_like(x)

    def run():
        torch.mul(x, 2.0, out=y)

    config = TimingConfig(warmup_ms=10, rep_ms=100)
    slowed, delay_ms = slowdown.slowed(run, lambda: None, 0.25, "cuda")
    plain = sorted(time_cuda(run, config=config).times)
    after = sorted(time_cuda(slowed, config=config).times)
    ratio = after[len(after) // 2] / plain[len(plain) // 2]
    assert delay_ms > 0 and ratio == pytest.approx(1.25, abs=0.05), (delay_ms, ratio)
