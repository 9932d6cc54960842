"""The environment fingerprint written into every report (and printed by ``kernelbench env``)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

import kernelbench

_SMI_FIELDS = {
    "driver": "driver_version",
    "clock_sm_mhz": "clocks.sm",
    "clock_mem_mhz": "clocks.mem",
    "clock_sm_max_mhz": "clocks.max.sm",
    "clock_mem_max_mhz": "clocks.max.mem",
    "power_limit_w": "power.limit",
    "persistence_mode": "persistence_mode",
    "compute_mode": "compute_mode",
    "temperature_c": "temperature.gpu",
}


def _nvidia_smi(index: int) -> dict:
    """Clocks, driver and modes as nvidia-smi reports them (read only; never changed)."""
    query = ",".join(_SMI_FIELDS.values())
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return {"nvidia_smi_error": str(exc)}
    values = [v.strip() for v in out.split(",")]
    return dict(zip(_SMI_FIELDS, values))


def _git_sha() -> str | None:
    """$KERNELBENCH_GIT_SHA when set (a copy of the tree, as on the GPU machine, is told its
    commit that way: a .git there may be older than the files), else HEAD of the checkout
    (``-dirty`` with uncommitted changes)."""
    if os.environ.get("KERNELBENCH_GIT_SHA"):
        return os.environ["KERNELBENCH_GIT_SHA"]
    root = Path(kernelbench.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def gpu_info(index: int = 0) -> dict:
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu_name": props.name,
        "gpu_uuid": str(getattr(props, "uuid", "")),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        **_nvidia_smi(index),
    }


def fingerprint(device: str, seed: int, argv: list[str] | None = None) -> dict:
    info = {
        "utc_time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "kernelbench": kernelbench.__version__,
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "platform": platform.platform(),
        "hostname": platform.node(),
        "command_line": shlex.join(argv if argv is not None else sys.argv),
        "seed": seed,
    }
    if device == "cuda" and torch.cuda.is_available():
        info.update(gpu_info(torch.cuda.current_device()))
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info
