"""RMSNorm's host side: launch configurations, launch plans, and the plain ``forward`` /
``backward`` that a benchmark or another kernel can call on rows (``x2d``: (M, N), unit column
stride). Kernels: ``kernels.py``; the fast path for launch-bound calls: ``fast_path.py``.

Each launch takes a frozen config (``FwdConfig``, ``BwdConfig``; defaults per N from
``fwd_config`` / ``bwd_config``, tuned on an H200: results/2026-11-22-h200-norm/README.md):
- forward: rows in registers up to N = 2048 and at 16384 (several rows per program when N is
  small, so a program moves at least 4096 elements); two passes at the other widths.
- backward, N <= 8192: rows in registers on a persistent grid of as many programs per SM as can
  be resident (read from the compiled kernel); each program's share of dw goes to an fp32
  (programs, N) buffer that ``_sum_rows_kernel`` reduces. Backwards of at most 32768 elements
  run as one program that writes dw itself, and may recompute rstd from the rows
  (``recomputes_rstd``), so the forward keeps none.
- backward, 8192 < N <= 16384: the wide kernel (a whole row in registers per step).
- backward, wider: two passes per row, dw from the column kernel.
- N > 65536 is refused (``impl="auto"`` falls back to PyTorch there).

Launches go through ``CachedLauncher``s kept per plan, keyed by (shape, strides, dtypes, device,
config), so a repeated shape costs no configuration work. The ops torch.compile traces
(``function.py``) launch the same kernels and configs, from the ``*_spec`` functions here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..._device import sm_count
from ...fast_launch import CachedLauncher, PlanCache
from .._triton_support import acc_dtype, is_power_of_two, real_stand_ins, tl_acc, triton, why_not_here
from .kernels import (
    _rmsnorm_bwd_kernel,
    _rmsnorm_bwd_wide_kernel,
    _rmsnorm_dw_kernel,
    _rmsnorm_fwd_kernel,
    _sum_rows_kernel,
)

MAX_N = 65536
# fp64 is accepted too and computed in fp64 throughout (for gradcheck); the others use fp32.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

# Rows up to this width can stay in registers in the forward (16 warps: 32 fp32 values per thread).
_FWD_SINGLE_PASS_MAX_N = 16384
# Padded widths whose forward takes two passes instead, as (chunk width, num_warps): faster than
# the rows in registers there on an H200 (results/2026-11-22-h200-norm/README.md).
_FWD_TWO_PASS = {4096: (2048, 8), 8192: (4096, 16), 32768: (8192, 32), 65536: (8192, 32)}
# Single-pass rows wider than this load the weight together with x: its latency then hides under
# x's instead of following the reduction (one row per program leaves nothing else to overlap).
_FWD_EARLY_WEIGHT_MIN_N = 4096
# The backward holds x, dy and the dw accumulator per element, three times the forward's
# registers, so it keeps rows in registers only up to half the forward's width.
_BWD_SINGLE_PASS_MAX_N = 8192
# Up to this width the wide backward keeps a whole row in registers at 32 warps (64 registers a
# thread, no spills); wider rows spill there, and take the two-pass kernel.
_BWD_WIDE_MAX_N = 16384
_BWD_WIDE_WARPS = 32
# Two-pass backward: 32 warps, 2 programs per SM, so the rows re-read in pass 2 stay in L2.
_BWD_TWO_PASS_WARPS = 32
_BWD_TWO_PASS_PROGRAMS_PER_SM = 2
# Chunk width of the two-pass kernels: 16 fp32 values per thread at 16 warps, no spills.
_CHUNK_N = 8192
# Backwards this small are launch-bound (the device finishes before the host issues the next
# launch): one program does every row and writes dw itself, saving the dw-reduction launch.
_ONE_PROGRAM_BWD_MAX_ELEMENTS = 32768
# Small N: pack rows so a program moves >= 4096 elements (8 KB of bf16); fewer, fatter programs
# keep enough bytes in flight per SM and amortise the per-program reduction and launch work.
_ELEMENTS_PER_PROGRAM = 4096



@dataclass(frozen=True)
class FwdConfig:
    """Launch of ``_rmsnorm_fwd_kernel``: ``block_m`` rows of the padded width ``block_n`` per
    program (``single_pass``), or one row per program in chunks of ``block_n`` (two passes)."""

    block_m: int
    block_n: int
    single_pass: bool
    num_warps: int
    early_weight: bool = False  # single pass: load the weight together with x

    def __post_init__(self) -> None:
        if not is_power_of_two(self.block_n):
            raise ValueError(f"rmsnorm FwdConfig: block_n must be a power of two, got {self.block_n}")
        if not self.single_pass and self.block_m != 1:
            raise ValueError(
                f"rmsnorm FwdConfig: the two-pass kernel takes one row per block, got block_m={self.block_m}")


BWD_KERNELS = ("rows", "wide", "two-pass")


@dataclass(frozen=True)
class BwdConfig:
    """Launch of the backward: ``kernel`` "rows" (``block_m`` rows of the padded width
    ``block_n`` in registers), "wide" (one whole row of ``block_n`` in registers per step) or
    "two-pass" (one row in chunks of ``block_n``). ``programs_per_sm``: the persistent grid's
    programs per SM, 0 for as many as can be resident."""

    kernel: str
    block_m: int
    block_n: int
    num_warps: int
    programs_per_sm: int = 0

    def __post_init__(self) -> None:
        if self.kernel not in BWD_KERNELS:
            raise ValueError(f"rmsnorm BwdConfig: kernel must be one of {', '.join(BWD_KERNELS)}, got {self.kernel!r}")
        if not is_power_of_two(self.block_n):
            raise ValueError(f"rmsnorm BwdConfig: block_n must be a power of two, got {self.block_n}")
        if self.kernel != "rows" and self.block_m != 1:
            raise ValueError(f"rmsnorm BwdConfig: the {self.kernel} kernel takes one row per block, "
                             f"got block_m={self.block_m}")


def _rows_in_registers(n: int) -> tuple[int, int, int]:
    """(block_m, block_n, num_warps) of a kernel keeping rows of width n in registers."""
    block_n = triton.next_power_of_2(n)
    block_m = max(1, _ELEMENTS_PER_PROGRAM // block_n)
    # 16 fp32 values per thread per live tensor: two 16-byte bf16 vectors per load, low spills.
    return block_m, block_n, min(16, max(4, block_m * block_n // 512))


@functools.cache
def fwd_config(n: int) -> FwdConfig:
    """The forward's default launch for rows of width n."""
    two_pass = _FWD_TWO_PASS.get(triton.next_power_of_2(n))
    if two_pass is not None:
        return FwdConfig(1, two_pass[0], False, two_pass[1])
    if n <= _FWD_SINGLE_PASS_MAX_N:
        block_m, block_n, num_warps = _rows_in_registers(n)
        return FwdConfig(block_m, block_n, True, num_warps, early_weight=n > _FWD_EARLY_WEIGHT_MIN_N)
    return FwdConfig(1, _CHUNK_N, False, 16)


@functools.cache
def bwd_config(n: int) -> BwdConfig:
    """The backward's default launch for rows of width n."""
    if n <= _BWD_SINGLE_PASS_MAX_N:
        return BwdConfig("rows", *_rows_in_registers(n))
    if n <= _BWD_WIDE_MAX_N:
        return BwdConfig("wide", 1, triton.next_power_of_2(n), _BWD_WIDE_WARPS)
    return BwdConfig("two-pass", 1, _CHUNK_N, _BWD_TWO_PASS_WARPS, _BWD_TWO_PASS_PROGRAMS_PER_SM)



# ------------------------------------------------------------------------------------------------
# Launch plans
# ------------------------------------------------------------------------------------------------
def as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, N) view with unit column stride (copies only when the last dim is strided)."""
    if t.dim() == 2 and t.stride(1) == 1:  # already rows: no view (host time in launch-bound calls)
        return t
    rows = t.reshape(-1, n)
    return rows if rows.stride(-1) == 1 or rows.shape[0] == 0 else rows.contiguous()


def launch_device(x2d: torch.Tensor) -> int:
    """The device Triton launches on: the current one (plans, and their launches' stream, follow it)."""
    return torch.cuda.current_device() if x2d.is_cuda else -1


# Launchers by plan key: a call with a shape seen before does no configuration work. config None
# stands for the default (no lookup per call).
_fwd_plans: PlanCache = PlanCache()
_bwd_plans: PlanCache = PlanCache()


def fwd_key(x2d, y, residual2d, weight, config: FwdConfig | None) -> tuple:
    """A forward plan's key: (m, n, dtype, device, x / y row strides, has residual, residual row
    stride, weight dtype, config)."""
    m, n = x2d.shape
    return (m, n, x2d.dtype, launch_device(x2d), x2d.stride(0), y.stride(0), residual2d is not None,
            residual2d.stride(0) if residual2d is not None else 0, weight.dtype if weight is not None else None,
            config)


def fwd_launcher(key: tuple) -> CachedLauncher:
    """The forward kernel's launcher for a plan key (``fwd_key``), made on first use."""
    launcher = _fwd_plans.get(key)
    if launcher is None:
        m, n, dtype, _, _, _, has_residual, _, weight_dtype, config = key
        grid, meta = fwd_spec(m, n, dtype, has_residual, weight_dtype is not None, config or fwd_config(n))
        launcher = _fwd_plans.remember(key, CachedLauncher(_rmsnorm_fwd_kernel, grid, **meta))
    return launcher


def bwd_key(x2d, weight, rstd, dy2d, dres2d, dx, config: BwdConfig | None) -> tuple:
    """A backward plan's key: (m, n, dtype, device, weight dtype, dy dtype, dres dtype, x / dy /
    dres / dx row strides, recompute (rstd None), config)."""
    m, n = x2d.shape
    return (m, n, x2d.dtype, launch_device(x2d), weight.dtype if weight is not None else None, dy2d.dtype,
            dres2d.dtype if dres2d is not None else None, x2d.stride(0), dy2d.stride(0),
            dres2d.stride(0) if dres2d is not None else 0, dx.stride(0), rstd is None, config)


def bwd_plan(key: tuple, args: list) -> BwdPlan:
    """The backward's plan for a key (``bwd_key``), made on first use from ``args`` (``bwd_args``)."""
    plan = _bwd_plans.get(key)
    if plan is None:
        n, weight_dtype, dres_dtype, recompute, config = key[1], key[4], key[6], key[11], key[12]
        plan = _bwd_plans.remember(key, make_bwd_plan(args, weight_dtype is not None, dres_dtype is not None,
                                                      config or bwd_config(n), recompute))
    return plan


def fwd_args(x2d, res2d, weight, y, h, rstd, eps) -> tuple:
    """The forward kernel's runtime arguments; placeholders (never read) for absent tensors."""
    m, n = x2d.shape
    return (
        x2d, x2d.stride(0),
        res2d if res2d is not None else x2d, res2d.stride(0) if res2d is not None else 0,
        weight if weight is not None else x2d,
        y, y.stride(0),
        h if h is not None else y, h.stride(0) if h is not None else 0,
        rstd, m, n, eps,
    )


def fwd_spec(m, n, dtype, has_residual, has_weight, config: FwdConfig) -> tuple[tuple, dict]:
    """(grid, compile-time arguments) of the forward kernel's launch."""
    if config.single_pass and config.block_n < n:
        raise ValueError(f"rmsnorm FwdConfig: a single pass needs block_n >= N, got {config.block_n} < {n}")
    return (triton.cdiv(m, config.block_m),), dict(
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, SINGLE_PASS=config.single_pass,
        HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, ACC=tl_acc(dtype),
        EARLY_WEIGHT=config.single_pass and config.early_weight, num_warps=config.num_warps,
    )



class BwdSpec(NamedTuple):
    """The backward's launches for one (shape, dtypes, config): what the eager plan caches as
    launchers and what the traced op launches through ``wrap_triton``."""

    kernel: str  # the main kernel, BwdConfig.kernel: "wide" is _rmsnorm_bwd_wide_kernel, else _rmsnorm_bwd_kernel
    grid: tuple  # the main kernel's: (row programs,)
    meta: dict  # the main kernel's compile-time arguments
    partial_rows: int  # rows of the fp32 dw partial buffer (0: none, no weight or one program)
    dw_columns: tuple | None  # (grid, meta) of _rmsnorm_dw_kernel, which writes the partials (two passes)
    rows_per_split: int  # rows each _rmsnorm_dw_kernel program sums
    sum_rows: tuple | None  # (grid, meta) of _sum_rows_kernel: partials -> dw (None: no partials)

    @property
    def takes_eps(self) -> bool:  # the main kernel's arguments end in eps
        return self.kernel != "wide"


class BwdPlan(NamedTuple):
    """The backward's launchers for one plan key (``bwd_key``)."""

    spec: BwdSpec
    main: CachedLauncher  # the main kernel (spec.kernel)
    dw_columns: CachedLauncher | None
    sum_rows: CachedLauncher | None



def recomputes_rstd(m: int, n: int) -> bool:
    """Whether the default backward of (m, n) rows recomputes rstd (one program, rows in
    registers): then the eager forward keeps no rstd buffer. For launch-bound calls, where one
    tensor fewer made and freed across the autograd engine's threads is host time
    (results/2026-11-24-h100-direct-launch/README.md)."""
    return n <= _BWD_SINGLE_PASS_MAX_N and m * n <= _ONE_PROGRAM_BWD_MAX_ELEMENTS



def bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, main_out) -> list:
    """The main backward kernel's runtime arguments but eps; placeholders (never read) for absent
    tensors. ``main_out``: dw, its fp32 partials, or a placeholder where the kernel writes none."""
    m, n = x2d.shape
    return [
        x2d, x2d.stride(0),
        weight if weight is not None else x2d,
        dy2d, dy2d.stride(0),
        dres2d if dres2d is not None else dy2d, dres2d.stride(0) if dres2d is not None else 0,
        rstd,
        dx, dx.stride(0),
        main_out,
        m, n,
    ]



def make_bwd_plan(args, has_weight, has_dres, config: BwdConfig, recompute: bool = False) -> BwdPlan:
    spec = bwd_spec(args, has_weight, has_dres, config, recompute)
    main = _rmsnorm_bwd_wide_kernel if spec.kernel == "wide" else _rmsnorm_bwd_kernel
    return BwdPlan(
        spec, CachedLauncher(main, spec.grid, **spec.meta),
        CachedLauncher(_rmsnorm_dw_kernel, spec.dw_columns[0], **spec.dw_columns[1]) if spec.dw_columns else None,
        CachedLauncher(_sum_rows_kernel, spec.sum_rows[0], **spec.sum_rows[1]) if spec.sum_rows else None,
    )


def bwd_spec(args, has_weight, has_dres, config: BwdConfig, recompute: bool = False) -> BwdSpec:
    """``args``: the main kernel's runtime arguments without eps (traced ones too: the occupancy
    query compiles the kernel for stand-ins of their dtypes)."""
    x2d = args[0]
    m, n = x2d.shape
    sms = sm_count(x2d.device)
    acc = tl_acc(x2d.dtype)
    if config.kernel != "two-pass" and config.block_n < n:
        raise ValueError(
            f"rmsnorm BwdConfig: the {config.kernel} kernel needs block_n >= N, got {config.block_n} < {n}")
    if recompute and config.kernel != "rows":
        raise ValueError(f"rmsnorm backward: only the rows kernel recomputes rstd, not {config.kernel!r}")
    if config.kernel == "wide":
        kernel = _rmsnorm_bwd_wide_kernel
        meta = dict(BLOCK_N=config.block_n, HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc,
                    num_warps=config.num_warps)
    else:
        kernel = _rmsnorm_bwd_kernel
        meta = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, SINGLE_PASS=config.kernel == "rows",
                    HAS_DRES=has_dres, HAS_WEIGHT=has_weight, ACC=acc, RECOMPUTE_RSTD=recompute,
                    num_warps=config.num_warps)
        args = [*args, 0.0]  # eps, for the occupancy query's compile
    # Persistent, each program looping over rows. By default as many programs per SM as can be
    # resident at once (from the compiled kernel's registers and shared memory): more would run
    # as a second, partial wave. Capped at the row blocks so every program writes a dw partial.
    programs_per_sm = config.programs_per_sm or _resident_per_sm(kernel, args, meta, x2d)
    row_programs = min(triton.cdiv(m, config.block_m), max(1, programs_per_sm * sms))
    if config.kernel == "rows" and not config.programs_per_sm and m * n <= _ONE_PROGRAM_BWD_MAX_ELEMENTS:
        row_programs = 1
    spec = BwdSpec(config.kernel, (row_programs,), meta, 0, None, 0, None)
    if not has_weight or (config.kernel == "rows" and row_programs == 1):
        return spec  # no dw, or the one program's share is dw: written directly
    dw_columns, rows_per_split, partial_rows = None, 0, row_programs
    if config.kernel == "two-pass":
        dw_block_n = 256
        col_blocks = triton.cdiv(n, dw_block_n)
        dw_splits = max(1, min(triton.cdiv(m, 32), 4 * sms // col_blocks))
        rows_per_split = triton.cdiv(m, dw_splits)
        partial_rows = triton.cdiv(m, rows_per_split)
        dw_columns = ((col_blocks, partial_rows), dict(BLOCK_R=32, BLOCK_N=dw_block_n, ACC=acc, num_warps=16))
    sum_rows = ((triton.cdiv(n, 64),), dict(BLOCK_P=64, BLOCK_N=64, ACC=acc, num_warps=8))
    return spec._replace(partial_rows=partial_rows, dw_columns=dw_columns, rows_per_split=rows_per_split,
                         sum_rows=sum_rows)


_resident_cache: dict = {}


def _resident_per_sm(kernel, args: list, meta: dict, like: torch.Tensor) -> int:
    """Programs of ``kernel`` that fit on one SM at once (registers, shared memory, threads),
    read from the compiled kernel; 2 where that cannot be read (the interpreter, another
    Triton's API), which always fits at <= 16 warps."""
    if not like.is_cuda:
        return 2
    # A tuple of the values themselves: this runs on every backward, so no string building.
    key = (kernel.fn.__name__, like.device.index, like.dtype, *meta.values())
    if key not in _resident_cache:
        warps = meta["num_warps"]
        try:
            compiled = kernel.warmup(*real_stand_ins(args), grid=(1,), **meta)
            compiled._init_handles()
            props = torch.cuda.get_device_properties(like.device)
            regs = getattr(props, "regs_per_multiprocessor", 65536)
            smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
            # Registers are allocated per warp in units of 256 (8 per thread).
            regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256
            fits = min(regs // (regs_per_warp * warps), 64 // warps)
            if compiled.metadata.shared:
                fits = min(fits, smem // compiled.metadata.shared)
            _resident_cache[key] = max(1, fits)
        except Exception:  # an API difference must not break the backward
            _resident_cache[key] = 2
    return _resident_cache[key]


# rstd written by forwards nobody differentiates: one buffer per (rows, dtype, device), never read.
_rstd_scratch: PlanCache = PlanCache(limit=16)


def scratch_rstd(m: int, x2d: torch.Tensor) -> torch.Tensor:
    key = (m, x2d.dtype, x2d.device)
    buf = _rstd_scratch.get(key)
    if buf is None:
        buf = _rstd_scratch.remember(key, torch.empty(m, dtype=acc_dtype(x2d.dtype), device=x2d.device))
    return buf


# ------------------------------------------------------------------------------------------------
# Forward and backward on rows
# ------------------------------------------------------------------------------------------------
def forward(x2d, weight, residual2d, eps, *, config: FwdConfig | None = None, rstd=None):
    """y, h (the new residual, or None) and rstd of rows ``x2d``; ``config`` None: ``fwd_config(N)``;
    ``rstd``: the buffer rstd is written to (a new one when None)."""
    m = x2d.shape[0]
    # empty_like of rows with unit column stride is row-major (and cheaper on the host than empty).
    y = torch.empty_like(x2d)
    h = torch.empty_like(y) if residual2d is not None else None
    if rstd is None:
        rstd = torch.empty(m, dtype=acc_dtype(x2d.dtype), device=x2d.device)
    if m:
        fwd_launcher(fwd_key(x2d, y, residual2d, weight, config))(
            *fwd_args(x2d, residual2d, weight, y, h, rstd, eps))
    return y, h, rstd


def backward(x2d, weight, rstd, dy2d, dres2d, *, config: BwdConfig | None = None, eps: float = 0.0):
    """dx and dw (None without a weight); ``config`` None: ``bwd_config(N)``. ``rstd`` None:
    recomputed from the rows with ``eps`` (the "rows" kernel only)."""
    m, n = x2d.shape
    dx = torch.empty_like(x2d)  # row-major: rows with unit column stride (cheaper than empty)
    if m == 0:
        return dx, (torch.zeros_like(weight) if weight is not None else None)
    key = bwd_key(x2d, weight, rstd, dy2d, dres2d, dx, config)
    if rstd is None:
        rstd = x2d  # a placeholder pointer: the kernel reads no rstd
    plan = bwd_plan(key, bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, rstd))
    dw, out = bwd_outputs(plan, x2d, weight)
    args = bwd_args(x2d, weight, dy2d, dres2d, rstd, dx, out if plan.dw_columns is None and out is not None else rstd)
    plan.main(*args, eps) if plan.spec.takes_eps else plan.main(*args)
    return dx, reduce_dw(plan, x2d, dy2d, rstd, out, dw, weight)


def bwd_outputs(plan: BwdPlan, x2d, weight) -> tuple:
    """(dw, out): where one program writes dw itself, both dw; else no dw yet and the fp32 buffer
    of the programs' dw partials (None, None without a weight)."""
    if weight is None:
        return None, None
    if plan.sum_rows is None:
        dw = torch.empty_like(weight)
        return dw, dw
    return None, torch.empty((plan.spec.partial_rows, x2d.shape[1]), dtype=acc_dtype(x2d.dtype), device=x2d.device)


def reduce_dw(plan: BwdPlan, x2d, dy2d, rstd, out, dw, weight):
    """dw after the main kernel: as it wrote it, or reduced from the partials in ``out``."""
    if plan.sum_rows is None:
        return dw
    m, n = x2d.shape
    if plan.dw_columns is not None:
        plan.dw_columns(x2d, x2d.stride(0), dy2d, dy2d.stride(0), rstd, out, m, n, plan.spec.rows_per_split)
    dw = torch.empty_like(weight)
    plan.sum_rows(out, dw, plan.spec.partial_rows, n)
    return dw


# ------------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------------
def check_inputs(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None) -> None:
    """Raise a one-line error naming what is wrong with the inputs and what is accepted."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rms_norm: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"rms_norm: unsupported dtype {x.dtype}; accepted: float32, bfloat16, float16, float64")
    if x.dim() == 0:
        raise ValueError("rms_norm: x must have at least one dimension (the one normalised)")
    n = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (n,):
        raise ValueError(
            f"rms_norm: weight has shape {tuple(weight.shape)}, expected ({n},) to match the last "
            f"dimension of x {tuple(x.shape)}"
        )
    if weight is not None and weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"rms_norm: unsupported weight dtype {weight.dtype}; accepted: float32, bfloat16, float16, float64"
        )
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rms_norm: residual has shape {tuple(residual.shape)}, expected x's {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"rms_norm: residual dtype {residual.dtype} differs from x's {x.dtype}")
    if weight is not None and weight.device != x.device:
        raise ValueError(f"rms_norm: weight is on {weight.device}, x on {x.device}")


def check_backward_inputs(dy: torch.Tensor, dh: torch.Tensor | None, normed: torch.Tensor,
                          weight: torch.Tensor | None, rstd: torch.Tensor) -> None:
    """The backward op's tensors against the normalised input: what its kernels read and write."""
    check_inputs(normed, weight, None)
    rows = normed.numel() // normed.shape[-1] if normed.shape[-1] else 0
    expected = [("dy", dy, (normed.shape, normed.dtype)), ("rstd", rstd, ((rows,), acc_dtype(normed.dtype)))]
    if dh is not None:
        expected.append(("dh", dh, (normed.shape, normed.dtype)))
    for name, t, want in expected:
        if not isinstance(t, torch.Tensor) or (tuple(t.shape), t.dtype, t.device) != (tuple(want[0]), want[1],
                                                                                        normed.device):
            got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"rms_norm backward: {name} is {got}; expected {tuple(want[0])} {want[1]} on "
                             f"{normed.device}")


def triton_usable(x: torch.Tensor) -> str | None:
    """Why the Triton path cannot take ``x`` here, or None when it can."""
    why = why_not_here(x)
    if why is None and x.shape[-1] > MAX_N:
        why = f"last dimension {x.shape[-1]} > {MAX_N}, the widest row the Triton kernels take"
    return why

