"""Adafactor8bit's kernels compile for a GPU at every combination of their boolean compile-time
flags (8-bit state, first moment, sharded step, aligned rows, ...), at the launch sizes the host
code uses.

The other CPU tests run the kernels in the Triton interpreter, which executes them as Python and
never type-checks them: a kernel whose loop re-assigns a variable with another shape runs there
and fails to compile on the GPU. Triton's compiler needs no GPU to compile for one (an sm_90
target here), so this runs in a process of its own without the interpreter. It also checks that
no compiled kernel computes in fp64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

# Runs in the child: compiles each kernel at every combination of its bool flags (PHASE 0-2 where a
# kernel has phases) and prints the failures as JSON.
_CHILD = r"""
import itertools, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelbench.optim.adafactor import kernels as K
from kernelbench.optim.adafactor.host import COL_BLOCK, FLAT_BLOCK, ROW_BLOCK, LaunchConfig

config = LaunchConfig()
ints = {"BR": ROW_BLOCK, "BC": COL_BLOCK, "BCC": COL_BLOCK, "QB": FLAT_BLOCK, "NB": config.full.blocks_per_program,
        "PR": config.factored.part_rows, "RB": config.factored.reduce_block}
pointers = {"items_ptr": "*i32", "col_items_ptr": "*i32", "meta_ptr": "*i64", "ws_ptr": "*fp32"}
int_args = {"scal_off"}
failures, compiled, fp64 = {}, {}, {}
for name in sorted(n for n in dir(K) if n.endswith("_kernel")):
    kernel = getattr(K, name)
    flags = [p.name for p in kernel.params if p.is_constexpr and p.name not in ints and p.name != "PHASE"]
    phases = (0, 1, 2) if any(p.name == "PHASE" for p in kernel.params) else (None,)
    signature = {p.name: "constexpr" if p.is_constexpr
                 else pointers.get(p.name) or ("i32" if p.name in int_args else "fp32") for p in kernel.params}
    for values in itertools.product((False, True), repeat=len(flags)):
        for phase in phases:
            constexprs = dict(zip(flags, values))
            constexprs.update({p.name: ints[p.name] for p in kernel.params if p.name in ints})
            if phase is not None:
                constexprs["PHASE"] = phase
            try:
                ptx = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                     target=GPUTarget("cuda", 90, 32)).asm["ptx"]
                compiled[name] = compiled.get(name, 0) + 1
                if ".f64" in ptx:
                    fp64[f"{name} {constexprs}"] = ptx.count(".f64")
            except Exception as exc:
                failures[f"{name} {constexprs}"] = str(exc).strip().splitlines()[-1][:300]
print(json.dumps({"compiled": compiled, "failures": failures, "fp64": fp64}))
"""


KERNELS = sorted(["_factored_apply_kernel", "_factored_cols_kernel", "_factored_rms_kernel", "_factored_stats_kernel",
                  "_finish_kernel", "_full_apply_kernel", "_full_m_encode_kernel", "_full_rms_kernel"])


def test_every_kernel_compiles_for_the_gpu_at_every_flag_combination():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["failures"], json.dumps(result["failures"], indent=1)
    # The state's math is fp32 throughout. An fp32-subnormal literal, which Triton 3.6 types fp64,
    # puts the expressions it enters in fp64: codes then round unlike the interpreter's.
    assert not result["fp64"], json.dumps(result["fp64"], indent=1)
    assert sorted(result["compiled"]) == KERNELS, result["compiled"]
