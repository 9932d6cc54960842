import os
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelbench.optim.adafactor import kernels as K
from kernelbench.optim.adafactor.host import COL_BLOCK, FLAT_BLOCK, ROW_BLOCK, LaunchConfig
config = LaunchConfig()
ints = {"BR": ROW_BLOCK, "BC": COL_BLOCK, "BCC": COL_BLOCK, "QB": FLAT_BLOCK, "NB": config.full.blocks_per_program,
        "PR": config.factored.part_rows, "RB": config.factored.reduce_block}
pointers = {"items_ptr": "*i32", "col_items_ptr": "*i32", "meta_ptr": "*i64", "ws_ptr": "*fp32"}
def comp(name, **flags):
    kernel = getattr(K, name)
    sig = {p.name: "constexpr" if p.is_constexpr else pointers.get(p.name) or ("i32" if p.name == "scal_off" else "fp32") for p in kernel.params}
    ce = {p.name: ints[p.name] for p in kernel.params if p.name in ints}
    ce.update(flags)
    for p in kernel.params:
        if p.is_constexpr and p.name not in ce:
            ce[p.name] = False
    c = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=ce), target=GPUTarget("cuda", 90, 32))
    tag = name + "_" + "_".join(k for k, v in flags.items() if v)
    open(os.environ["OUT"] + f"/{tag}.ptx", "w").write(c.asm["ptx"])
    open(os.environ["OUT"] + f"/{tag}.ttgir", "w").write(c.asm["ttgir"])
    print(tag, ce)
comp("_factored_stats_kernel", QUANT=True, ALIGNED=True, FIXED_BETA2=False, SCALE_PARAM=False, SHARDED=False)
comp("_factored_apply_kernel", QUANT=True, HAS_M=True, ALIGNED=True, SHARDED=True)
print(ints)
comp("_factored_stats_kernel", QUANT=True, ALIGNED=True, SHARDED=True)
comp("_factored_stats_kernel", QUANT=False, ALIGNED=True, SHARDED=True)
comp("_factored_stats_kernel", QUANT=False, ALIGNED=True, SHARDED=False)
