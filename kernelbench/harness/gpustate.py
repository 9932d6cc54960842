"""The GPU's state while it is timed, read per round: SM and memory clocks, temperature, power
draw and the clock-event (throttle) reasons, through NVML (``nvidia-ml-py``, imported as
``pynvml``) when it is installed, else through ``nvidia-smi``; nothing when neither answers.

Reading changes nothing. Only :class:`ApplicationClockLock` (``--lock-clocks``) writes: it sets
the application clocks to the GPU's default application clocks where the driver permits it, and
puts back the ones it found when the run ends; where it is not permitted it says so and leaves
the clocks alone. Nothing here imports torch.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# NVML's clock-event reason bits (nvmlClocksEventReason*). The first group holds the clocks down
# because of power or heat: a row timed under them is flagged ``throttled``.
POWER_OR_HEAT_REASONS = {0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal",
                         0x80: "hw-power-brake"}
OTHER_REASONS = {0x1: "idle", 0x2: "applications-clocks", 0x10: "sync-boost", 0x100: "display-clocks"}
# A round counts as throttled when NVML's violation counters (time the power or thermal policy
# held the clocks below the requested ones) grew by more than this share of its wall time.
VIOLATION_SHARE = 0.01
# nvmlPerfPolicyType_t
_PERF_POLICY_POWER, _PERF_POLICY_THERMAL = 0, 1
_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_NO_PERMISSION = 3, 4


def reason_names(mask: int) -> list[str]:
    names = {**POWER_OR_HEAT_REASONS, **OTHER_REASONS}
    return [name for bit, name in sorted(names.items()) if mask & bit]


@dataclass(frozen=True)
class GpuState:
    """One round's reading. ``reasons``: the clock-event reasons active when the round ended
    ('+'-joined); the violation times: how long the power / thermal policy held the clocks down
    during the round (NVML only; None where the GPU does not count them)."""

    source: str
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    reasons: str = ""
    power_violation_ms: float | None = None
    thermal_violation_ms: float | None = None
    round_ms: float | None = None

    @property
    def throttled_by(self) -> list[str]:
        """What held the clocks down by power or heat during the round (empty: nothing did)."""
        found = [r for r in self.reasons.split("+") if r in POWER_OR_HEAT_REASONS.values()]
        violations = (("power-violation", self.power_violation_ms), ("thermal-violation", self.thermal_violation_ms))
        for name, ms in violations:
            if ms and self.round_ms and ms > VIOLATION_SHARE * self.round_ms:
                found.append(f"{name} {ms:.0f} ms")
        return found

    @property
    def throttled(self) -> bool:
        return bool(self.throttled_by)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throttled": self.throttled}


GPU_STATE_FIELDS = tuple(GpuState.__dataclass_fields__) + ("throttled",)


class GpuProbe:
    """Reads nothing: no NVML and no nvidia-smi here (``note`` says why)."""

    source = "none"

    def __init__(self, note: str = "") -> None:
        self.note = note

    def start(self) -> Any:
        return time.perf_counter()

    def finish(self, token: Any) -> GpuState | None:
        return None

    def close(self) -> None:
        pass


def _import_nvml():
    import pynvml

    return pynvml


def _shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass


def _nvml_handle(nvml, uuid: str | None, index: int):
    if uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except nvml.NVMLError:
            pass  # a MIG slice or an odd UUID form: the index is the next best thing
    return nvml.nvmlDeviceGetHandleByIndex(index)


class NvmlProbe(GpuProbe):
    source = "nvml"

    def __init__(self, nvml, handle) -> None:
        super().__init__()
        self.nvml, self.handle = nvml, handle
        self._counts_violations = self._violations() is not None

    def _read(self, fn: Callable, *args):
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError:
            return None

    def _violations(self) -> tuple[int, int] | None:
        power = self._read(self.nvml.nvmlDeviceGetViolationStatus, _PERF_POLICY_POWER)
        thermal = self._read(self.nvml.nvmlDeviceGetViolationStatus, _PERF_POLICY_THERMAL)
        if power is None or thermal is None:
            return None
        return int(power.violationTime), int(thermal.violationTime)

    def start(self) -> Any:
        return time.perf_counter(), self._violations() if self._counts_violations else None

    def finish(self, token: Any) -> GpuState:
        t0, before = token
        round_ms = (time.perf_counter() - t0) * 1e3
        nvml = self.nvml
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = self._read(reasons_fn)
        power_mw = self._read(nvml.nvmlDeviceGetPowerUsage)
        after = self._violations() if before is not None else None
        return GpuState(
            source=self.source,
            sm_mhz=self._read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            mem_mhz=self._read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
            temperature_c=self._read(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000,
            reasons="+".join(reason_names(int(mask))) if mask is not None else "",
            power_violation_ms=None if after is None else (after[0] - before[0]) / 1e6,
            thermal_violation_ms=None if after is None else (after[1] - before[1]) / 1e6,
            round_ms=round_ms,
        )

    def close(self) -> None:
        _shutdown(self.nvml)


# nvidia-smi's name for the reasons mask changed (clocks_throttle_reasons -> clocks_event_reasons).
_SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class SmiProbe(GpuProbe):
    """nvidia-smi once per round: about 50-100 ms of host time between rounds, none inside one."""

    source = "nvidia-smi"

    def __init__(self, device_id: str, run: Callable = subprocess.run) -> None:
        super().__init__()
        self.device_id, self.run = device_id, run
        self.reason_field = None
        for field in _SMI_REASON_FIELDS:
            if self._query(field) is not None:
                self.reason_field = field
                break
        if self.reason_field is None:
            raise OSError("nvidia-smi answered no query of clocks, temperature and power")

    def _query(self, reason_field: str) -> list[str] | None:
        fields = f"clocks.sm,clocks.mem,temperature.gpu,power.draw,{reason_field}"
        try:
            out = self.run(["nvidia-smi", f"--id={self.device_id}", f"--query-gpu={fields}",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.stdout.strip() else []
        return values if out.returncode == 0 and len(values) == 5 else None

    def finish(self, token: Any) -> GpuState | None:
        round_ms = (time.perf_counter() - token) * 1e3
        values = self._query(self.reason_field)
        if values is None:
            return None
        try:
            mask = int(values[4], 16)
        except ValueError:
            mask = None
        return GpuState(source=self.source, sm_mhz=_number(values[0]), mem_mhz=_number(values[1]),
                        temperature_c=_number(values[2]), power_w=_number(values[3]),
                        reasons="+".join(reason_names(mask)) if mask is not None else "", round_ms=round_ms)


def open_probe(uuid: str | None, index: int = 0, *, nvml=None, smi_run: Callable | None = None) -> GpuProbe:
    """NVML when pynvml imports and initialises, else nvidia-smi when it answers, else a probe
    that reads nothing and says why. ``uuid`` (torch's device UUID) picks the same GPU as torch
    whatever CUDA_VISIBLE_DEVICES says; ``index`` is the fallback."""
    why = []
    try:
        nvml = nvml if nvml is not None else _import_nvml()
        nvml.nvmlInit()
        return NvmlProbe(nvml, _nvml_handle(nvml, uuid, index))
    except ImportError:
        why.append("nvidia-ml-py is not installed")
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        why.append(f"NVML: {exc}")
    if smi_run is not None or shutil.which("nvidia-smi"):
        try:
            return SmiProbe(f"GPU-{uuid}" if uuid and not uuid.startswith(("GPU-", "MIG-")) else (uuid or str(index)),
                            smi_run or subprocess.run)
        except OSError as exc:
            why.append(str(exc))
    else:
        why.append("no nvidia-smi on PATH")
    return GpuProbe("GPU state not sampled: " + "; ".join(why))


class ApplicationClockLock:
    """``--lock-clocks``: the application clocks set to the GPU's default ones for the run, and the
    clocks found before put back by :meth:`release`. ``message`` says what happened, including
    why nothing was changed (not permitted, not supported, no NVML)."""

    def __init__(self, uuid: str | None, index: int = 0, *, nvml=None) -> None:
        self.uuid, self.index, self._nvml = uuid, index, nvml
        self.locked = False
        self.previous: tuple[int, int] | None = None  # (memory MHz, SM MHz)
        self.message = ""
        self.release_message = ""

    def acquire(self) -> str:
        try:
            nvml = self._nvml if self._nvml is not None else _import_nvml()
        except ImportError:
            self.message = ("--lock-clocks: needs NVML (pip install nvidia-ml-py); the clocks were left as "
                            "they are")
            return self.message
        self._nvml = nvml
        try:
            nvml.nvmlInit()
            handle = _nvml_handle(nvml, self.uuid, self.index)
            previous = (nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_MEM),
                        nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_SM))
            target = (nvml.nvmlDeviceGetDefaultApplicationsClock(handle, nvml.NVML_CLOCK_MEM),
                      nvml.nvmlDeviceGetDefaultApplicationsClock(handle, nvml.NVML_CLOCK_SM))
            nvml.nvmlDeviceSetApplicationsClocks(handle, *target)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            why = ("not permitted here (it needs root, or an administrator's `nvidia-smi -acp UNRESTRICTED`)"
                   if code == _NVML_ERROR_NO_PERMISSION else
                   "not supported by this GPU" if code == _NVML_ERROR_NOT_SUPPORTED else f"failed ({exc})")
            _shutdown(nvml)
            self.message = f"--lock-clocks: setting the application clocks is {why}; the clocks were left as they are"
            return self.message
        self.handle, self.previous, self.locked = handle, previous, True
        self.message = (f"application clocks locked at SM {target[1]} MHz, memory {target[0]} MHz (were SM "
                        f"{previous[1]}, memory {previous[0]}; put back when the run ends)")
        return self.message

    def release(self) -> str:
        if not self.locked:
            return ""
        nvml = self._nvml
        mem, sm = self.previous
        try:
            nvml.nvmlDeviceSetApplicationsClocks(self.handle, mem, sm)
            text = f"application clocks put back to SM {sm} MHz, memory {mem} MHz"
        except nvml.NVMLError as exc:
            text = f"--lock-clocks: could not put the application clocks back ({exc}); `nvidia-smi -rac` resets them"
        self.locked = False
        _shutdown(nvml)
        return text

    def __enter__(self) -> ApplicationClockLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release_message = self.release()
