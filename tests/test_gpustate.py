"""GPU state per round and --lock-clocks, against a fake NVML and a fake nvidia-smi: what is read,
what counts as throttled, what is locked and put back, and what is said where nothing may change."""

import subprocess
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from kernelbench.harness import gpustate
from kernelbench.harness.gpustate import ApplicationClockLock, GpuProbe, GpuState, NvmlProbe, SmiProbe, open_probe
from kernelbench.harness.runner import PlanItem, run_benchmarks
from kernelbench.harness.timing import TimingConfig
from kernelbench.ops.base import REGISTRY, Workload
from kernelbench.ops.function_op import FunctionOp
from kernelbench.report.writer import ReportWriter

SM, MEM = 1, 2


class FakeNvmlError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The few pynvml calls kernelbench makes, on one GPU with application clocks SM 1410 /
    memory 2619 MHz and defaults SM 1980 / memory 2619."""

    NVMLError = FakeNvmlError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = SM, MEM, 0

    def __init__(self, set_error=None, restore_error=None, reasons=0, violation_step_ns=(0, 0), init_error=None):
        self.app = {SM: 1410, MEM: 2619}
        self.default = {SM: 1980, MEM: 2619}
        self.set_error, self.restore_error, self.init_error = set_error, restore_error, init_error
        self.reasons = reasons
        self.violation_step_ns = violation_step_ns
        self.violations = [0, 0]
        self.sets = []
        self.open = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != "GPU-1234":
            raise FakeNvmlError(6)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index):
        return "handle"

    def nvmlDeviceGetApplicationsClock(self, handle, kind):
        return self.app[kind]

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, kind):
        return self.default[kind]

    def nvmlDeviceSetApplicationsClocks(self, handle, mem, sm):
        error = self.set_error if not self.sets else self.restore_error
        if error is not None:
            raise FakeNvmlError(error)
        self.sets.append((mem, sm))
        self.app = {SM: sm, MEM: mem}

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return self.app[kind]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        return 412_500  # mW

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        self.violations[policy] += self.violation_step_ns[policy]
        return SimpleNamespace(referenceTime=0, violationTime=self.violations[policy])


# -- --lock-clocks ------------------------------------------------------------------------------
def test_lock_sets_the_default_application_clocks_and_puts_the_old_ones_back():
    nvml = FakeNvml()
    with ApplicationClockLock("1234", nvml=nvml) as lock:
        assert lock.locked and nvml.app == {SM: 1980, MEM: 2619}
        assert "locked at SM 1980 MHz, memory 2619 MHz (were SM 1410" in lock.message
    assert nvml.sets == [(2619, 1980), (2619, 1410)] and nvml.app == {SM: 1410, MEM: 2619}
    assert "put back to SM 1410 MHz" in lock.release_message and not lock.locked
    assert nvml.open == 0  # every nvmlInit matched by a shutdown


def test_lock_puts_the_clocks_back_when_the_run_raises():
    nvml = FakeNvml()
    with pytest.raises(RuntimeError), ApplicationClockLock(None, 0, nvml=nvml):
        raise RuntimeError("a candidate blew up")
    assert nvml.app[SM] == 1410 and len(nvml.sets) == 2


@pytest.mark.parametrize("code, said", [(4, "not permitted here (it needs root"), (3, "not supported by this GPU"),
                                         (999, "failed (NVML error 999)")])
def test_lock_not_permitted_changes_nothing_and_says_so(code, said):
    nvml = FakeNvml(set_error=code)
    with ApplicationClockLock("1234", nvml=nvml) as lock:
        assert not lock.locked and said in lock.message and "the clocks were left as they are" in lock.message
    assert nvml.sets == [] and nvml.app[SM] == 1410 and lock.release_message == "" and nvml.open == 0


def test_lock_without_nvml_or_driver_says_so(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpustate, "_import_nvml", missing)
    lock = ApplicationClockLock("1234")
    assert "needs NVML (pip install nvidia-ml-py)" in lock.acquire() and not lock.locked
    no_driver = ApplicationClockLock("1234", nvml=FakeNvml(init_error=9))
    assert "failed" in no_driver.acquire() and not no_driver.locked


def test_a_failed_restore_says_how_to_reset():
    nvml = FakeNvml(restore_error=4)
    lock = ApplicationClockLock("1234", nvml=nvml)
    lock.acquire()
    assert "nvidia-smi -rac" in lock.release()


# -- reading the state --------------------------------------------------------------------------
def test_nvml_probe_reads_clocks_power_and_reasons_and_flags_power_or_heat():
    nvml = FakeNvml(reasons=0x1 | 0x4)
    probe = open_probe("1234", nvml=nvml)
    assert isinstance(probe, NvmlProbe)
    state = probe.finish(probe.start())
    assert (state.sm_mhz, state.mem_mhz, state.temperature_c, state.power_w) == (1410, 2619, 61, 412.5)
    assert state.reasons == "idle+sw-power-cap" and state.throttled and state.throttled_by == ["sw-power-cap"]
    nvml.reasons = 0x1 | 0x10  # idle, sync boost: not power or heat
    assert not probe.finish(probe.start()).throttled
    probe.close()
    assert nvml.open == 0


def test_violation_counters_catch_throttling_that_ended_before_the_round_did():
    nvml = FakeNvml(reasons=0, violation_step_ns=(0, 40_000_000))  # 40 ms of thermal violation per read
    probe = open_probe("1234", nvml=nvml)
    state = probe.finish(probe.start())
    assert state.thermal_violation_ms == 40.0 and state.power_violation_ms == 0.0
    assert state.throttled and state.throttled_by == ["thermal-violation 40 ms"]


def test_smi_fallback_parses_and_learns_the_older_field_name():
    calls = []

    def smi(cmd, **kw):
        calls.append(cmd)
        if "clocks_event_reasons.active" in cmd[2]:
            return subprocess.CompletedProcess(cmd, 2, "", 'Field "clocks_event_reasons.active" is not valid')
        return subprocess.CompletedProcess(cmd, 0, "1755, 2619, 70, 699.10, 0x0000000000000040\n", "")

    probe = open_probe("1234", nvml=FakeNvml(init_error=12), smi_run=smi)
    assert isinstance(probe, SmiProbe) and probe.reason_field == "clocks_throttle_reasons.active"
    assert calls[0][1] == "--id=GPU-1234"
    state = probe.finish(probe.start())
    assert (state.sm_mhz, state.power_w, state.reasons, state.throttled) == (1755, 699.1, "hw-thermal", True)


def test_no_nvml_and_no_smi_reads_nothing_and_says_why(monkeypatch):
    monkeypatch.setattr(gpustate.shutil, "which", lambda name: None)
    probe = open_probe(None, nvml=FakeNvml(init_error=12))
    assert type(probe) is GpuProbe and probe.finish(probe.start()) is None
    assert "NVML" in probe.note and "no nvidia-smi" in probe.note


# -- through the runner -------------------------------------------------------------------------
class ScriptedProbe(GpuProbe):
    """Throttled by the power cap in every second round."""

    source = "scripted"

    def __init__(self):
        super().__init__()
        self.rounds = 0

    def finish(self, token):
        self.rounds += 1
        return GpuState("scripted", sm_mhz=1980.0, reasons="sw-power-cap" if self.rounds % 2 == 0 else "",
                        round_ms=10.0)


@pytest.fixture
def double_op():
    op = FunctionOp("scratch-gpustate", doc="x * 2", workloads=[Workload("w", "cpu", {"n": 64}, seed=1)],
                    make_inputs=lambda w, device, gen: {"x": torch.randn(w.spec["n"], generator=gen)},
                    reference=lambda x: x * 2, outputs=("y",))
    op.candidate("a")(lambda: lambda x: x + x)
    op.candidate("b")(lambda: lambda x: x * 2)
    yield op
    del REGISTRY[op.name]


def test_rows_timed_while_throttled_are_flagged_and_rounds_csv_keeps_the_state(tmp_path, double_op):
    writer = ReportWriter(tmp_path, {}, "run")
    plan = [PlanItem(double_op, list(double_op.candidates.values()), list(double_op.workloads.values()), ["fwd"])]
    run_benchmarks(plan, "cpu", writer, timing=TimingConfig(warmup_ms=1, rep_ms=3, min_reps=2), rounds=2,
                   gpu_probe=ScriptedProbe())
    writer.close("complete")
    rows = pd.read_csv(tmp_path / "results.csv")
    timed = rows[rows.metric == "time_median_ms"].set_index("candidate")
    # a, b, a, b: the second and fourth rounds are throttled, so b in both rounds.
    assert "throttled" not in str(timed.loc["a", "flags"]) and "throttled" in timed.loc["b", "flags"]
    assert "round 1: sw-power-cap; round 2: sw-power-cap" in timed.loc["b", "message"]
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert len(rounds) == 4 and set(rounds.gpu_source) == {"scripted"} and set(rounds.gpu_sm_mhz) == {1980.0}
    assert rounds.groupby("candidate").gpu_throttled.all().to_dict() == {"a": False, "b": True}
    assert (rounds.reps >= 2).all() and (rounds.median_ms > 0).all()
