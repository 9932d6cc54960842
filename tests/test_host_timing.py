"""The host-time mode: workloads marked host_timing get a per-call host time beside the device
(here: CPU clock) time, and the loop times only the call, not the untimed preparation."""

import time

import torch

from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import TimingConfig, time_host
from kernelbench.ops import Workload, get_op


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_time_host_excludes_prepare():
    calls = []
    sample = time_host(lambda: time.sleep(0.002), lambda: (calls.append(1), time.sleep(0.004)),
                       TimingConfig(warmup_ms=1, rep_ms=20, min_reps=5))
    assert 2.0 <= sorted(sample.times)[len(sample.times) // 2] < 4.0
    assert len(calls) >= len(sample.times)


def test_host_rows_beside_device_time():
    op = get_op("rmsnorm")
    host_workload = Workload("host-8x64", "cpu", {"shape": (8, 64), "dtype": torch.float32, "host_timing": True})
    plain = Workload("8x64", "cpu", {"shape": (8, 64), "dtype": torch.float32})
    sink = Rows()
    plan = [PlanItem(op, [op.get_candidate("torch-rms-norm"), op.get_candidate("triton")],
                     [host_workload, plain], ["fwd", "fwd+bwd"])]
    run_benchmarks(plan, "cpu", sink, timing=TimingConfig(warmup_ms=1, rep_ms=5, min_reps=5), rounds=1)
    host = {(r["workload"], r["mode"], r["candidate"]): r for r in sink.rows if r["metric"] == "host_per_call_ms"}
    assert set(host) == {("host-8x64", "fwd", "torch-rms-norm"), ("host-8x64", "fwd+bwd", "torch-rms-norm")}
    for row in host.values():
        assert row["status"] == "ok" and row["value"] > 0


def test_host_workloads_are_declared():
    assert get_op("rmsnorm").workload("host-8x4096").spec["host_timing"]
    spec = get_op("rotary").workload("host-decode-8x32x8x1x128-bf16").spec
    assert spec["host_timing"] and spec["seq"] == 1


def test_rep_timer_times_each_call_on_the_cpu():
    from kernelbench._timer import RepTimer

    timer = RepTimer("cpu")
    for _ in range(3):
        timer(lambda: time.sleep(0.002))
    times = timer.times_ms()
    assert len(times) == 3 and all(t >= 2.0 for t in times)
