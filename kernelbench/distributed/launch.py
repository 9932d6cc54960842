"""Start a worker module on N local ranks through torch.distributed.run; return the JSON it wrote.

    from kernelbench.distributed.launch import launch
    result = launch("my.worker", 2, ["--steps", "50"], Path("out.json"))

The worker is started as ``python -m torch.distributed.run ... -m MODULE ARGS --output OUTPUT``;
rank 0 writes its result to OUTPUT as JSON. On a machine with GPUs each rank gets one GPU; with
``cpu=True`` (or without GPUs) the ranks see none and run on the CPU with the Triton interpreter.
This module knows no op: an op that runs its candidates on several ranks imports it.

However the caller ends (an exception, Ctrl-C, SIGTERM raised as an exception, the timeout), the
launcher and every rank end with it: torchrun starts each rank in a session of its own, so the
ranks are found through /proc and killed one by one; and on Linux torchrun and the ranks get a
parent-death signal, so even a caller killed with SIGKILL leaves no rank behind. Nothing here
imports torch at module level, so an op declaring itself stays cheap to import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def command(module: str, nproc: int, args: Sequence[str], output: Path) -> list[str]:
    """The command line ``launch`` runs (also what a user can paste into a shell)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", module, *map(str, args), "--output", str(output)]


def launch(module: str, nproc: int, args: Sequence[str], output: Path, *, timeout_s: float = 900.0,
           cpu: bool = False, name: str = "the ranks", one_gpu: bool = False,
           stalled: Callable[[dict[str, Any] | None], str | None] | None = None,
           poll_s: float = 2.0) -> dict[str, Any]:
    """Runs ``module`` on ``nproc`` ranks and returns the JSON rank 0 wrote to ``output``.

    ``one_gpu``: the ranks see only the first visible GPU.
    ``stalled``: called every ``poll_s`` with what ``output`` holds so far (None before rank 0
    wrote it); a message back means the ranks are stuck: the tree is killed and the result so far
    comes back with ``stalled`` set to the message (RuntimeError when there is none).
    Raises RuntimeError when the run fails or passes ``timeout_s`` (the whole process tree is
    killed; the message starts with ``name`` and ends with the tail of the ranks' output). A run
    whose ranks fail, or pass ``timeout_s``, after rank 0 wrote a result (a worker may rewrite
    it as it goes) keeps that result, with a ``teardown_error`` saying what failed."""
    if nproc < 1:
        raise ValueError(f"launch: nproc must be >= 1, got {nproc}")
    output = Path(output)
    if output.exists():
        output.unlink()  # so a stale file is never mistaken for this run's result
    env = {**os.environ, **MULTICAST_OFF}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU, so they take Gloo and the CPU
    elif one_gpu:  # code that reads the GPU count as its world size (official adam-mini) sees one
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    if cpu or not _cuda_available():
        env.setdefault("TRITON_INTERPRET", "1")
    # The worker is started with -m: make this checkout importable whether or not it is installed.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))

    cmd = command(module, nproc, args, output)
    # The ranks' output goes to a file, not a pipe: nothing to drain while the ranks are watched.
    with tempfile.TemporaryFile("w+") as log_file:
        # A session of its own, so that a timeout kills torchrun and every rank it started.
        # torchrun ends its ranks on SIGTERM; it gets one when this process dies, however it dies.
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        try:
            stall = _wait(proc, output, timeout_s, stalled, poll_s)
        except BaseException:
            stop_tree(proc)  # Ctrl-C, SIGTERM, any error of the caller's: no rank outlives it
            raise
        killed = proc.returncode is None  # stalled or past the deadline
        if killed:
            stop_tree(proc)
        log_file.seek(0)
        log = log_file.read()
    partial = _read_result(output)
    if killed:
        message = (f"{name}: {stall}" if stall is not None
                   else f"{name}: no result after {timeout_s:.0f} s (a rank hung?)")
        message += f"; killed. Command: {' '.join(cmd)}\n" + _tail(log)
        if partial is None:
            raise RuntimeError(message)
        # A worker that writes its result as it goes keeps what it measured before it was stopped.
        partial["teardown_error"] = message.replace("\n", " | ")[-2000:]
        if stall is not None:
            partial["stalled"] = stall
        return partial
    if partial is None:
        raise RuntimeError(f"{name}: the ranks failed (exit code {proc.returncode}). Command: {' '.join(cmd)}\n"
                           + _tail(log))
    if proc.returncode != 0:
        # Rank 0 writes the JSON only after every rank's results reached it, so the measurement
        # is complete; what failed is the shutdown (a Gloo rank can abort in teardown on a loaded
        # machine). Keep the result and say so.
        partial["teardown_error"] = (f"the ranks exited with code {proc.returncode} after the results were written: "
                                     + _tail(log, 6).replace("\n", " | "))
    return partial


def _wait(proc: subprocess.Popen, output: Path, timeout_s: float,
          stalled: Callable[[dict[str, Any] | None], str | None] | None, poll_s: float) -> str | None:
    """Waits for the launcher to exit, at most ``timeout_s``; returns ``stalled``'s message if it
    reported one first (``proc.returncode`` stays None when the launcher is still running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(left, poll_s) if stalled is not None else left))
            return None
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None
        if stalled is not None:
            message = stalled(_read_result(output))
            if message is not None:
                return message


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _read_result(output: Path) -> dict[str, Any] | None:
    """Rank 0's JSON, or None when it is missing or cut short."""
    try:
        return json.loads(output.read_text())
    except (OSError, ValueError):
        return None


def _tail(log: str | None, lines: int = 60) -> str:
    return "\n".join((log or "").splitlines()[-lines:])
