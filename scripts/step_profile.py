"""Where a Llama training step's GPU time goes: torch.profiler over fwd+bwd of ``llama-step``
candidates, each built as the harness builds it (its layers, impl, fused head and loss, compile
mode and options), kernels grouped by name (top N by total CUDA time), with the step's elapsed
time beside the kernels' sum.

    python scripts/step_profile.py --candidates torch-compile kernelbench-compile+auto -w qwen2.5-0.5b-layer4 \
        [--top 25] [--steps 3] [--rounds 1] [--gaps 10] [--host 30]

``-w``: a grid name or MODEL@BxS (default llama-1b-layer4).
``--gaps N``: where the GPU waits within the profiled steps, the N longest idle stretches between
two kernels with the kernels on either side, and the CUDA runtime calls that took the host longest
(a synchronising call there is what lets the GPU run dry).
``--host N``: the host's side too: its time per step in the N host events of most self time (ops,
compiled regions, kernel launches), and its events per step, for a step the host decides.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from kernelbench.nn.autoselect import describe_choices
from kernelbench.ops import get_op
from kernelbench.ops.llama_step import LlamaStepCase

from common import emit, require_cuda


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", nargs="+", required=True, help="llama-step candidates")
    parser.add_argument("-w", "--workload", default="llama-1b-layer4", help="a grid name or MODEL@BxS")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--steps", type=int, default=3, help="steps profiled, and per timed round")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds, the candidates alternated")
    parser.add_argument("--gaps", type=int, default=0, help="report the N longest GPU idle stretches")
    parser.add_argument("--host", type=int, default=0, help="report the N host events of most self time")
    args = parser.parse_args()
    require_cuda("step_profile")
    steps = args.steps
    built = {name: build_candidate_step(name, args.workload) for name in args.candidates}
    # Elapsed time per step: each candidate's `steps` steps back to back, the candidates alternated
    # `--rounds` times so that clock drift hits them alike; the median round is kept.
    elapsed: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(args.rounds):
        for name, step in built.items():
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            torch.cuda.synchronize()
            elapsed[name].append(start.elapsed_time(end) / steps)
    for name, step in built.items():
        activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.host else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        totals: dict[str, list[float]] = {}
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                entry = totals.setdefault(evt.name[:90], [0.0, 0])
                entry[0] += evt.device_time / steps / 1e3  # ms per step
                entry[1] += 1 / steps
        total = sum(v[0] for v in totals.values())
        rounds = sorted(elapsed[name])
        median = rounds[len(rounds) // 2]
        print(f"== {name}: {total:.2f} ms of kernels per step, "
              f"{median:.2f} ms elapsed (median of {len(rounds)} rounds of {steps} steps: "
              f"{', '.join(f'{r:.2f}' for r in elapsed[name])})")
        emit(name=name, kernel_ms_per_step=round(total, 4),
             elapsed_ms_per_step=round(median, 4), elapsed_rounds=[round(r, 4) for r in elapsed[name]])
        for name, (ms, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"{ms:8.3f} ms {count:5.0f}x  {name}")
            emit(name=name, kernel=name, ms_per_step=round(ms, 4),
                 calls_per_step=round(count, 1))
        if args.gaps:
            report_gaps(prof, steps, args.gaps, name)
        if args.host:
            report_host(prof, steps, args.host, name)


def build_candidate_step(name: str, workload_name: str):
    """One fwd+bwd step of a llama-step candidate, built and warmed up as the harness does."""
    op = get_op("llama-step")
    workload = op.workloads.get(workload_name) or op.custom_workload(workload_name)
    if workload is None:
        raise SystemExit(f"-w {workload_name}: not a grid name nor MODEL@BxS")
    case = LlamaStepCase(op.get_candidate(name).build(), workload, "cuda", "fwd+bwd")

    def step():
        case.prepare()
        case.run()

    for _ in range(3):
        step()
    if case.auto_choices:
        chosen = describe_choices(case.auto_choices, traced=case.spec.compile != "eager")
        print(f"== {name}: impl='auto' chose {chosen}")
    return step


def report_gaps(prof, steps: int, top: int, name: str) -> None:
    """The GPU's idle time between consecutive device events (the profiled steps start from an idle GPU),
    the longest stretches with their neighbours, and the host's costliest CUDA runtime calls."""
    device = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    gaps = []
    busy_until = device[0].time_range.end
    for before, after in zip(device, device[1:]):
        busy_until = max(busy_until, before.time_range.end)
        idle = after.time_range.start - busy_until
        if idle > 0:
            gaps.append((idle, before.name[:50], after.name[:50]))
    idle_ms = sum(g[0] for g in gaps) / steps / 1e3
    print(f"   GPU idle between kernels: {idle_ms:.3f} ms per step ({len(gaps)} stretches in {steps} steps)")
    emit(candidate=name, gpu_idle_ms_per_step=round(idle_ms, 4))
    for idle, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"   {idle / 1e3:8.3f} ms idle  after {before}  before {after}")
    runtime: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cuda"):
            entry = runtime.setdefault(e.name, [0.0, 0])
            entry[0] += e.cpu_time_total / steps / 1e3
            entry[1] += 1 / steps
    for name, (ms, count) in sorted(runtime.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"   host {ms:8.3f} ms {count:6.0f}x  {name}")


def report_host(prof, steps: int, top: int, name: str) -> None:
    """The host events of most self time per step (the profiler's own cost included alike for
    every layer set), and how many host events a step has."""
    totals: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU:
            entry = totals.setdefault(e.name[:90], [0.0, 0])
            entry[0] += e.self_cpu_time_total / steps / 1e3
            entry[1] += 1 / steps
    events = sum(v[1] for v in totals.values())
    self_ms = sum(v[0] for v in totals.values())
    print(f"   host: {events:.0f} events per step, {self_ms:.2f} ms of their self time")
    emit(candidate=name, host_events_per_step=round(events, 1), host_self_ms_per_step=round(self_ms, 4))
    for name, (ms, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"   host {ms:8.3f} ms {count:6.0f}x  {name}")
        emit(candidate=name, host_event=name, self_ms_per_step=round(ms, 4), calls_per_step=round(count, 1))


if __name__ == "__main__":
    main()
