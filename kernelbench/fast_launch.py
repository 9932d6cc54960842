"""The fast path for launch-bound calls, in one place with one switch.

``kernel[grid](*args, **meta)`` binds the arguments, computes their specialization (16-byte
alignment of pointers, ints equal to 1 or divisible by 16, i32 vs i64), builds a cache key and
looks the compiled kernel up, on every call; ``Function.apply`` adds a Python wrapper to every
autograd call. Where a call moves little data that host work decides the speed.

- ``CachedLauncher`` launches one kernel with a fixed grid and fixed compile-time arguments. The
  first launch for a given argument *shape* (dtype and alignment of each tensor, the size class of
  each int) goes through Triton as usual; later launches with the same argument shape call that
  compiled kernel's launcher directly (what ``CompiledKernel[grid](*args)`` does without its
  per-call lookups; with a profiler's launch hooks set, through ``CompiledKernel[grid]``). The key
  holds every property Triton specializes on, so a cached kernel is only reused where Triton
  would have picked the same one. In the Triton interpreter every launch takes the ordinary path.
- ``CachedLauncher.direct`` returns a ``DirectLaunch`` bound to one specialization, called with
  every pointer as an int (``tensor.data_ptr()``): nothing is keyed per call, and where the
  compiled launcher only adds fixed arguments before its C function, that function is called
  directly. The caller guarantees that the arguments specialize as the first ones did.
- ``fast_apply(Function)``: ``Function.apply`` without its Python wrapper where it adds nothing.
- ``current_device()`` and the launches' stream without ``torch.cuda``'s Python.

The switch: ``KERNELBENCH_FAST_LAUNCH=0`` in the environment, or ``set_enabled(False)``, turns
all of it off: launches go through ``kernel[grid](...)``, Functions through ``Function.apply``,
callers with a fast path of their own (RMSNorm's) take their plain one. The fast path is also
off, whatever the switch says, where torch or Triton is outside ``TORCH_VERSIONS`` /
``TRITON_VERSIONS``: the private entry points it reads (torch's C ``Function.apply``,
``_cuda_getDevice``, ``_cuda_getCurrentRawStream``; Triton's ``CompiledKernel`` launcher) were
checked in those versions only. Either way results are the same: only host time differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Inclusive (major, minor) ranges whose private entry points the fast path was checked against.
TORCH_VERSIONS = ((2, 11), (2, 13))
TRITON_VERSIONS = ((3, 6), (3, 9))
SWITCH_ENV = "KERNELBENCH_FAST_LAUNCH"

_INT32 = (-(2**31), 2**31)


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def versions_supported(torch_version: str, triton_version: str | None) -> bool:
    """Whether these torch and Triton versions are inside the ranges the fast path was checked in."""
    for version, (low, high) in ((torch_version, TORCH_VERSIONS), (triton_version, TRITON_VERSIONS)):
        parsed = _major_minor(version) if version else None
        if parsed is None or not low <= parsed <= high:
            return False
    return True


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


_SUPPORTED = versions_supported(torch.__version__, _triton_version())
_on = _SUPPORTED and os.environ.get(SWITCH_ENV, "1") != "0"


def enabled() -> bool:
    """Whether the fast path is on (the switch, and supported torch / Triton versions)."""
    return _on


def set_enabled(on: bool) -> bool:
    """Turn the fast path on or off for the calls that follow (on only where the versions are
    supported); returns whether it was on."""
    global _on
    was = _on
    _on = bool(on) and _SUPPORTED
    return was


def _private(owner: Any, name: str) -> Any:
    """A private entry point of torch, or None outside the checked versions or where it is missing."""
    return getattr(owner, name, None) if _SUPPORTED else None


# The current CUDA device's index without torch.cuda.current_device's Python.
current_device: Callable[[], int] = _private(torch._C, "_cuda_getDevice") or torch.cuda.current_device
# The current stream of a device as the int a compiled kernel's launcher takes.
_raw_stream: Callable[[int], int] = (_private(torch._C, "_cuda_getCurrentRawStream")
                                     or (lambda device: torch.cuda.current_stream(device).cuda_stream))


def fast_apply(function: type[torch.autograd.Function]) -> Callable[..., Any]:
    """``function.apply`` without ``autograd.Function.apply``'s Python wrapper where the wrapper
    adds nothing: for a Function without ``setup_context``, outside functorch transforms, it only
    unwraps dead functorch wrappers (done here as well) before the C ``apply``. With the fast path
    off, or no such entry point, calls go to ``function.apply``."""
    full_apply = function.apply
    function_base = _private(torch._C, "_FunctionBase")
    functorch = _private(torch._C, "_functorch")
    transforms_active = _private(torch._C, "_are_functorch_transforms_active")
    unwrap_if_dead = getattr(functorch, "unwrap_if_dead", None)
    c_apply = function_base.__dict__.get("apply") if function_base is not None else None
    if c_apply is None or unwrap_if_dead is None or transforms_active is None:
        return full_apply
    if function.setup_context is not torch.autograd.Function.setup_context:
        return full_apply  # apply binds default arguments for setup_context
    c_apply, tensor = c_apply.__get__(None, function), torch.Tensor

    def apply(*args: Any) -> Any:
        if not _on or transforms_active():  # vmap, grad, ...: autograd.Function.apply decides
            return full_apply(*args)
        return c_apply(*[unwrap_if_dead(a) if isinstance(a, tensor) else a for a in args])

    return apply


def _arg_key(arg: Any) -> Any:
    """What Triton may specialize a runtime argument on (or ``_UNCACHEABLE``). Exact types are
    tested first: this runs for every argument of every launch."""
    kind = type(arg)
    if kind is int:
        return (arg == 1, arg % 16 == 0, _INT32[0] <= arg < _INT32[1], arg < 2**63)
    if kind is float:
        return float
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if kind is bool:
        return bool
    if arg is None:
        return None
    return _UNCACHEABLE


_UNCACHEABLE = object()


_launch_knobs: Any = None  # triton.knobs.runtime (its launch hooks), read once a kernel is compiled


def _read_launch_knobs() -> Any:
    global _launch_knobs
    if _launch_knobs is None:
        try:
            from triton import knobs
        except ImportError:  # a Triton without knobs: launches go through CompiledKernel[grid]
            return None
        _launch_knobs = getattr(knobs, "runtime", None)
    return _launch_knobs


def _no_launch_hooks() -> bool:
    # A profiler's launch hooks need Triton's own runner (it builds their metadata). Newer Tritons
    # hold the hooks in a HookChain that is never None: an empty chain means no hook.
    enter, leave = _launch_knobs.launch_enter_hook, _launch_knobs.launch_exit_hook
    return ((enter is None or not getattr(enter, "calls", True))
            and (leave is None or not getattr(leave, "calls", True)))


class PlanCache(dict):
    """Launch plans (launchers, grids, buffers) by key, at most ``limit`` of them: where shapes
    change every step (sequence lengths) the oldest plan is dropped instead of growing without end."""

    def __init__(self, limit: int = 256) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: Any, plan: Any) -> Any:
        while len(self) >= self.limit:
            del self[next(iter(self))]
        self[key] = plan
        return plan


class DirectLaunch:
    """One compiled specialization of a kernel on a fixed grid: ``launch(device, *args)`` with
    the runtime arguments in order, pointers as ints. Returns False without launching while the
    fast path is off or a profiler's launch hooks are set (they need the tensors): the caller then
    launches through its ``CachedLauncher``.

    The compiled kernel's launcher is a Python method that hands every call to a C function,
    adding the same fixed arguments each time (launch flags, no scratch buffers, the metadata).
    The first call watches what it hands over; where that is the grid, the stream, the function,
    fixed values and then exactly this call's arguments, later calls go to the C function
    directly (one Python frame fewer per launch). Any other shape, a scratch buffer among them,
    keeps every call on the launcher."""

    __slots__ = ("_run", "_grid", "_function", "_metadata", "_tail", "_c_launch", "_c_fixed", "_watched")

    def __init__(self, run: Any, grid3: tuple, function: Any, metadata: Any, constexpr_tail: Sequence = ()) -> None:
        self._run, self._grid, self._function, self._metadata = run, grid3, function, metadata
        self._tail = tuple(constexpr_tail)
        self._c_launch, self._c_fixed, self._watched = None, (), False

    def with_tail(self, constexpr_tail: Sequence) -> DirectLaunch:
        """The same launch, appending ``constexpr_tail`` to the arguments it is called with."""
        return DirectLaunch(self._run, self._grid, self._function, self._metadata, constexpr_tail)

    @property
    def calls_c_launcher(self) -> bool:
        """Whether calls go to the compiled launcher's C function directly."""
        return self._c_launch is not None

    def __call__(self, device: int, *args: Any) -> bool:
        if not (_on and _no_launch_hooks()):
            return False
        g = self._grid
        if self._c_launch is not None:
            self._c_launch(g[0], g[1], g[2], _raw_stream(device), self._function, *self._c_fixed, *args, *self._tail)
        elif self._watched:
            self._run(g[0], g[1], g[2], _raw_stream(device), self._function, self._metadata, None, None, None,
                      *args, *self._tail)
        else:
            self._watch((*args, *self._tail), _raw_stream(device))
        return True

    def _watch(self, args: tuple, stream: int) -> None:
        """Launch through the launcher, seeing what it passes its C function."""
        self._watched = True
        run, g = self._run, self._grid
        c_launch = getattr(run, "launch", None)
        seen = []

        def watch(*passed: Any) -> Any:
            seen.append(passed)
            return c_launch(*passed)

        if c_launch is not None and "launch" in getattr(run, "__dict__", ()):
            run.launch = watch
            try:
                run(g[0], g[1], g[2], stream, self._function, self._metadata, None, None, None, *args)
            finally:
                run.launch = c_launch
        else:
            run(g[0], g[1], g[2], stream, self._function, self._metadata, None, None, None, *args)
            return
        if len(seen) != 1:
            return
        passed, n = seen[0], len(args)
        head, fixed, tail = passed[:5], passed[5:len(passed) - n], passed[len(passed) - n:]
        if (len(passed) < 5 + n or head[:3] != tuple(g) or head[3] != stream or head[4] is not self._function
                or any(a is not b for a, b in zip(tail, args))):
            return
        # Fixed means flags, None (no scratch buffer, no hook) or the metadata given: anything
        # else (a buffer allocated per call) could differ the next time.
        if all(v is None or v is self._metadata or (type(v) in (bool, int) and v in (0, 1)) for v in fixed):
            self._c_launch, self._c_fixed = c_launch, tuple(fixed)


class CachedLauncher:
    """Launches ``kernel`` on ``grid`` with the compile-time arguments and options in ``meta``
    (``BLOCK=...``, ``num_warps=...``): ``launcher(*runtime_args)``. Runtime arguments are passed
    positionally, in the kernel's order; every ``tl.constexpr`` parameter must be in ``meta``."""

    def __init__(self, kernel: Any, grid: Sequence[int], **meta: Any) -> None:
        self.kernel = kernel
        self.grid = tuple(grid)
        # The compiled kernel's launcher reads grid[0], grid[1] and grid[2].
        self._grid3 = self.grid + (1,) * (3 - len(self.grid))
        self.meta = meta
        params = getattr(kernel, "params", None)
        # The compiled kernel's launcher takes every parameter in order, constexprs included.
        self._constexpr_at: list[tuple[int, Any]] = []
        if params is not None:
            for i, p in enumerate(params):
                if p.is_constexpr:
                    if p.name not in meta:
                        raise TypeError(f"CachedLauncher: constexpr '{p.name}' of {kernel} must be given in meta")
                    self._constexpr_at.append((i, meta[p.name]))
        # Usually every constexpr follows the runtime parameters: then they are simply appended.
        n_runtime = (len(params) - len(self._constexpr_at)) if params is not None else 0
        self._constexpr_tail = ([value for _, value in self._constexpr_at]
                                if all(i >= n_runtime for i, _ in self._constexpr_at) else None)
        self._runners: dict[tuple, Any] = {}
        self._cacheable = params is not None and os.environ.get("TRITON_INTERPRET") != "1"

    def __call__(self, *args: Any) -> None:
        # Under torch.compile, Triton's own launch path is the one dynamo knows how to capture.
        if not (self._cacheable and _on) or torch.compiler.is_compiling():
            self.kernel[self.grid](*args, **self.meta)
            return
        device = torch.cuda.current_device()
        key = (device, *map(_arg_key, args))
        entry = self._runners.get(key)
        if entry is not None:
            runner, launch = entry
            full = self._with_constexprs(args)
            if launch is None or not launch(device, *full):
                runner(*full)
            return
        compiled = self.kernel[self.grid](*args, **self.meta)
        if _UNCACHEABLE in key or not hasattr(compiled, "run") or not hasattr(compiled, "__getitem__"):
            return
        runner = compiled[self._grid3]  # loads the module: function and packed_metadata exist after
        launch = None
        loaded = all(hasattr(compiled, name) for name in ("function", "packed_metadata"))
        if loaded and _read_launch_knobs() is not None:
            launch = DirectLaunch(compiled.run, self._grid3, compiled.function, compiled.packed_metadata)
        self._runners[key] = (runner, launch)

    def direct(self, *args: Any) -> DirectLaunch | None:
        """Launch ``args`` and return a ``DirectLaunch`` of the kernel compiled for them, or None
        where there is none to call directly (the interpreter, the fast path off, constexprs
        between runtime parameters); the caller then keeps calling this launcher."""
        self(*args)
        if self._constexpr_tail is None or not (self._cacheable and _on) or torch.compiler.is_compiling():
            return None
        entry = self._runners.get((torch.cuda.current_device(), *map(_arg_key, args)))
        if entry is None or entry[1] is None:
            return None
        return entry[1].with_tail(self._constexpr_tail)

    def _with_constexprs(self, args: tuple) -> list:
        if self._constexpr_tail is not None:
            return [*args, *self._constexpr_tail]
        full = list(args)
        for position, value in self._constexpr_at:
            full.insert(position, value)
        return full
