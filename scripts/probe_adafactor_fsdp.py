"""Probe: where the sharded 8-bit Adafactor step first departs from the unsharded one (2 GPUs)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import test_adafactor_fsdp_gpu as t  # noqa: E402

from kernelbench.distributed.spawn import run_ranks  # noqa: E402


def probe(rank, world):
    t.STEPS = int(os.environ.get("PROBE_STEPS", "5"))
    t.CASES = {k: t.CASES[k] for k in os.environ.get("PROBE_CASES", "8bit").split(",")}
    return t._parity(rank, world)


if __name__ == "__main__":
    out = run_ranks(probe, 2, backend="nccl", timeout_s=300, collective_timeout_s=60)[0]
    for case, rows in out.items():
      print("=== case", case)
      for step in range(1, int(os.environ.get("PROBE_STEPS", "5")) + 1):
          bad = [r for r in rows if r["step"] == step and (r.get("code_distance", 0) > 0 or r.get("bitwise") is False)]
          print(f"step {step}: {len(bad)} rows differ")
          for r in bad[:60]:
              print("  ", r["tensor"], {k: v for k, v in r.items() if k in ("max_abs", "rel_frob", "code_distance")})
