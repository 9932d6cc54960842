"""Start the dist-adamw benchmark on N local ranks through torch.distributed.run; return its JSON.

    from kernelbench.dist.launch import launch
    result = launch(nproc=2, workload="model-370m", steps=50, output=Path("results/dist-adamw.json"))

On a machine with GPUs each rank gets one GPU and NCCL; without them (or with ``cpu=True``) the
ranks are CPU processes on Gloo with the Triton interpreter (a check that everything runs, not a
measurement).

However the caller ends (an exception, Ctrl-C, SIGTERM raised as an exception, the timeout), the
launcher and every rank end with it: torchrun starts each rank in a session of its own, so the
ranks are found through /proc and killed one by one; and on Linux torchrun and the ranks get a
parent-death signal, so even a caller killed with SIGKILL leaves no rank behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from kernelbench.harness.rows import ERROR, NOT_MEASURED, OK, Row
from kernelbench.ops.base import UsageError, unknown_name_error

# NVLink multicast must stay off on the GPU machines: NCCL's NVLS and torch's symmetric memory.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent exits (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children in sessions of their own included), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_tree(proc: subprocess.Popen) -> None:
    """Kills the launcher and every process below it, and reaps the launcher."""
    for _ in range(3):  # a rank may be starting while we look
        pids = descendants(proc.pid)
        for pid in [proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not pids:
            break
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def command(nproc: int, workload: str, steps: int, output: Path, *, warmup: int = 10,
            bucket_mb: float | None = None, gather_group: bool = False) -> list[str]:
    """The command line ``launch`` runs (also what a user can paste into a shell)."""
    return (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "kernelbench.dist.bench",
            "--workload",
            workload,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--output",
            str(output),
        ]
        + (["--bucket-mb", str(bucket_mb)] if bucket_mb is not None else [])
        + (["--gather-group"] if gather_group else [])
    )


def launch(
    nproc: int,
    workload: str,
    steps: int,
    output: Path,
    *,
    warmup: int = 10,
    bucket_mb: float | None = None,
    gather_group: bool = False,
    timeout_s: float = 900.0,
    cpu: bool = False,
) -> dict[str, Any]:
    """Runs the worker on ``nproc`` ranks and returns the JSON rank 0 wrote to ``output``.

    Raises UsageError for bad arguments (checked here, before any process starts), and
    RuntimeError when the run fails or passes ``timeout_s`` (the whole process tree is killed;
    the message ends with the tail of its output)."""
    from kernelbench.dist.bench import workloads

    if workload not in workloads():
        raise unknown_name_error("workload", workload, workloads())
    if nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {nproc}")
    if bucket_mb is not None and bucket_mb <= 0:
        raise UsageError(f"--bucket-mb must be > 0, got {bucket_mb:g}")
    if not cpu and torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UsageError(f"--nproc {nproc} needs {nproc} GPUs; {torch.cuda.device_count()} visible")
    if steps < 1 or warmup < 0:
        raise UsageError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}")

    output = Path(output)
    if output.exists():
        output.unlink()  # so a stale file is never mistaken for this run's result
    env = {**os.environ, **MULTICAST_OFF}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU, so they take Gloo and the CPU
    if cpu or not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    # The worker is started with -m: make this checkout importable whether or not it is installed.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))

    cmd = command(nproc, workload, steps, output, warmup=warmup, bucket_mb=bucket_mb, gather_group=gather_group)
    # A session of its own, so that a timeout kills torchrun and every rank it started.
    # torchrun ends its ranks on SIGTERM; it gets one when this process dies, however it dies.
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM),
    )
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        log, _ = proc.communicate()
        raise RuntimeError(
            f"dist-adamw: no result after {timeout_s:.0f} s (a rank hung?); killed. Command: {' '.join(cmd)}\n"
            + _tail(log)
        ) from None
    except BaseException:
        stop_tree(proc)  # Ctrl-C, SIGTERM, any error of the caller's: no rank outlives it
        raise
    result = _read_result(output)
    if result is None:
        raise RuntimeError(
            f"dist-adamw: the ranks failed (exit code {proc.returncode}). Command: {' '.join(cmd)}\n" + _tail(log)
        )
    if proc.returncode != 0:
        # Rank 0 writes the JSON only after every rank's timings reached it, so the measurement is
        # complete; what failed is the shutdown (a Gloo rank can abort in teardown on a loaded
        # machine). Keep the rows and say so.
        result["teardown_error"] = (
            f"the ranks exited with code {proc.returncode} after the results were written: "
            + _tail(log, 6).replace("\n", " | ")
        )
    return result


def _read_result(output: Path) -> dict[str, Any] | None:
    """Rank 0's JSON, or None when it is missing or cut short."""
    try:
        return json.loads(output.read_text())
    except (OSError, ValueError):
        return None


def _tail(log: str | None, lines: int = 60) -> str:
    return "\n".join((log or "").splitlines()[-lines:])


# What each of the worker's timings is, as (candidate, what) rows of a kernelbench report.
_METRIC_ROWS = {
    "sharded_step": ("sharded-zero1", "step: reduce-scatter + Triton update + all-gather, pipelined"),
    "sharded_comm": ("sharded-zero1:comm", "reduce-scatter + all-gather alone"),
    "sharded_update": ("sharded-zero1:update", "Triton AdamW on this rank's shard alone"),
    "allreduce_fused_step": ("allreduce+torch-fused", "step: all-reduce of grads + torch fused AdamW on everything"),
    "allreduce": ("allreduce+torch-fused:comm", "all-reduce alone"),
    "fused_adamw": ("allreduce+torch-fused:update", "torch fused AdamW alone"),
}


def run_workload(
    op, workload: str, device: str, folder: Path, settings: dict[str, Any]
) -> tuple[list[Row], str | None]:
    """One launch of ``op`` (dist-adamw) on ``workload`` as report rows, and the error that ended
    it, if any (its first line is what a user needs; the row keeps the tail of the ranks' log)."""
    try:
        result = launch(
            settings["nproc"],
            workload,
            settings["steps"],
            folder / f"{op.name}-{workload}.json",
            bucket_mb=settings["bucket_mb"],
            gather_group=settings["gather_group"],
            cpu=device == "cpu",
        )
    except RuntimeError as exc:
        row = Row(
            op.name,
            workload,
            f"{settings['nproc']} ranks",
            "sharded-zero1",
            "time_median_ms",
            None,
            "ms",
            ERROR,
            message=str(exc)[-2000:],
        )
        return [row], str(exc).splitlines()[0]
    return result_rows(result), None


def result_rows(result: dict[str, Any]) -> list[Row]:
    """The worker's JSON as kernelbench result rows (long format, as harness.runner writes)."""
    workload = result["workload"]
    mode = f"{result['world_size']} ranks, {result['bucket_mb']:g} MiB buckets" + (
        ", all-gathers on a second communicator" if result.get("gather_group") else ""
    )

    def row(candidate, metric, value, unit, message="", status=OK, flags=""):
        return Row(result["op"], workload, mode, candidate, metric, value, unit, status, flags, message=message)

    rows = []
    anchor = result["metrics_ms"]["allreduce_fused_step"]["median"]
    # Without GPUs the shard update runs in the Triton interpreter: its times are no measurement.
    interpreted = "Triton interpreter" in result["timing"]
    for metric, stats in result["metrics_ms"].items():
        candidate, what = _METRIC_ROWS[metric]
        if interpreted and candidate.startswith("sharded"):
            rows.append(
                row(
                    candidate,
                    "time_median_ms",
                    None,
                    "ms",
                    "Triton interpreter (no GPU): time not measured",
                    status=NOT_MEASURED,
                )
            )
            continue
        flags = "noisy" if stats.get("noisy") else ""
        rows.append(row(candidate, "time_median_ms", stats["median"], "ms", f"{what}; {result['timing']}", flags=flags))
        for key in ("p25", "p75", "iqr", "min"):
            rows.append(row(candidate, f"time_{key}_ms", stats[key], "ms"))
        rows.append(row(candidate, "reps", stats["reps"], ""))
        if metric == "sharded_step" and not interpreted:
            rows.append(
                row(
                    candidate,
                    "ratio_vs_anchor",
                    stats["median"] / anchor,
                    "x",
                    "median / median of allreduce+torch-fused in the same run (below 1: faster)",
                )
            )
    for candidate, key in (("sharded-zero1", "sharded"), ("allreduce+torch-fused", "allreduce_fused")):
        per_rank = result["state_bytes_per_rank"][key]["allocated_delta"]
        if per_rank and all(v is not None for v in per_rank):
            rows.append(
                row(
                    candidate,
                    "state_bytes",
                    max(per_rank),
                    "B",
                    "per rank (largest): allocated after the first step minus before construction",
                )
            )
    parity = result["parity"]
    rows.append(
        row(
            "sharded-zero1",
            "parity_max_rel_vs_allreduce_fused",
            parity["max_rel_diff"],
            "",
            f"params after {parity['after_steps']} step(s), both paths from the same params and grads",
        )
    )
    if "teardown_error" in result:
        rows.append(row("sharded-zero1", "teardown", None, "", result["teardown_error"], status=ERROR))
    return rows
