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


def _host_plan():
    op = get_op("rmsnorm")
    host_workload = Workload("host-8x64", "cpu", {"shape": (8, 64), "dtype": torch.float32, "host_timing": True})
    return [PlanItem(op, [op.get_candidate("torch-rms-norm"), op.get_candidate("torch-eager")],
                     [host_workload], ["fwd"])]


def test_host_time_is_interleaved_over_the_rounds(monkeypatch):
    """A B A B A B, as the device time: the host's drift hits both candidates alike."""
    from kernelbench.harness import runner

    order = []

    def recording_time_host(fn, prepare, config):
        order.append(fn.__self__.fn)  # the case's candidate function
        return time_host(fn, prepare, config)

    monkeypatch.setattr(runner, "time_host", recording_time_host)
    sink = Rows()
    run_benchmarks(_host_plan(), "cpu", sink, timing=TimingConfig(warmup_ms=1, rep_ms=6, min_reps=6), rounds=3)
    assert len(order) == 6 and order[0::2] == [order[0]] * 3 and order[1::2] == [order[1]] * 3
    assert order[0] is not order[1]
    host = [r for r in sink.rows if r["metric"] == "host_per_call_ms"]
    assert len(host) == 2 and all(r["status"] == "ok" and "interleaved rounds" in r["message"] for r in host)


def test_a_failing_host_timing_keeps_the_device_rows(monkeypatch):
    from kernelbench.harness import runner

    def failing_time_host(fn, prepare, config):
        raise RuntimeError("host clock unavailable")

    monkeypatch.setattr(runner, "time_host", failing_time_host)
    sink = Rows()
    run_benchmarks(_host_plan(), "cpu", sink, timing=TimingConfig(warmup_ms=1, rep_ms=4, min_reps=4), rounds=2)
    device = [r for r in sink.rows if r["metric"] == "time_median_ms"]
    host = [r for r in sink.rows if r["metric"] == "host_per_call_ms"]
    assert len(device) == 2 and all(r["status"] == "ok" for r in device)
    assert len(host) == 2 and all(r["status"] == "error" and "host clock unavailable" in r["message"] for r in host)
