"""CachedLauncher's bookkeeping, with a stand-in for a Triton kernel (the real fast path needs a
GPU: tests/gpu run every optimizer step after the first through it)."""

from types import SimpleNamespace

import pytest
import torch

from kernelbench import fast_launch
from kernelbench.fast_launch import CachedLauncher


class FakeCompiled:
    """What Triton's CompiledKernel offers: ``[grid]`` (a runner) and, once loaded, ``run``,
    ``function`` and ``packed_metadata``."""

    def __init__(self, log: list, loaded: bool = True) -> None:
        self.log = log
        if loaded:
            self.function, self.packed_metadata = "fn", "meta"

    def run(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter, exit_, *args):
        assert (stream, function, packed_metadata) == (1234, "fn", "meta")
        assert (launch_metadata, enter, exit_) == (None, None, None)
        self.log.append(("direct", (gx, gy, gz), args))

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


class FakeKernel:
    """Parameters (ptr, n, BLOCK: constexpr, scale, FLAG: constexpr), like a @triton.jit function."""

    def __init__(self, loaded: bool = True) -> None:
        self.loaded = loaded
        names = [("ptr", False), ("n", False), ("BLOCK", True), ("scale", False), ("FLAG", True)]
        self.params = [SimpleNamespace(name=n, is_constexpr=c) for n, c in names]
        self.log: list = []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return FakeCompiled(self.log, self.loaded)
        return launch


@pytest.fixture
def compiled_mode(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fast_launch.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fast_launch, "_raw_stream", lambda device: 1234)
    monkeypatch.setattr(fast_launch, "_launch_knobs", SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))


def test_first_launch_goes_through_triton_then_direct_with_constexprs_in_place(compiled_mode):
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (7,), BLOCK=128, FLAG=True, num_warps=4)
    x = torch.zeros(64)
    launch(x, 1000, 0.5)
    launch(x, 1010, 0.25)
    assert kernel.log[0] == ("triton", (7,), (x, 1000, 0.5), {"BLOCK": 128, "FLAG": True, "num_warps": 4})
    kind, grid, args = kernel.log[1]
    assert (kind, grid) == ("direct", (7, 1, 1))  # the compiled launcher reads three grid dims
    assert args[0] is x and list(args[1:]) == [1010, 128, 0.25, True]


@pytest.mark.parametrize("first, second", [
    (1000, 1),          # an int that becomes 1 (Triton specializes on == 1)
    (1000, 1024),       # ... or divisible by 16
    (1000, 2**40),      # ... or needs 64 bits
])
def test_a_change_triton_specializes_on_goes_back_through_triton(compiled_mode, first, second):
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (1,), BLOCK=8, FLAG=False)
    x = torch.zeros(8)
    launch(x, first, 1.0)
    launch(x, second, 1.0)
    assert [entry[0] for entry in kernel.log] == ["triton", "triton"]
    launch(x, second, 2.0)  # the same shape again: cached
    assert kernel.log[-1][0] == "direct"


def test_tensor_dtype_and_alignment_are_part_of_the_key(compiled_mode):
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (1,), BLOCK=8, FLAG=False)
    base = torch.zeros(64)
    launch(base, 3, 1.0)
    launch(base[1:], 3, 1.0)  # 4 bytes off a 16-byte boundary
    launch(base.to(torch.float64), 3, 1.0)
    assert [entry[0] for entry in kernel.log] == ["triton", "triton", "triton"]


def test_interpreter_always_takes_the_ordinary_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (2,), BLOCK=8, FLAG=False)
    for _ in range(3):
        launch(torch.zeros(8), 5, 1.0)
    assert [entry[0] for entry in kernel.log] == ["triton"] * 3


def test_a_missing_constexpr_is_named():
    with pytest.raises(TypeError, match="constexpr 'FLAG'"):
        CachedLauncher(FakeKernel(), (1,), BLOCK=8)


def test_constexprs_between_runtime_parameters_are_inserted_in_place(compiled_mode):
    kernel = FakeKernel()
    kernel.params.insert(1, SimpleNamespace(name="EARLY", is_constexpr=True))
    launch = CachedLauncher(kernel, (1,), BLOCK=8, FLAG=False, EARLY=3)
    x = torch.zeros(8)
    launch(x, 5, 1.0)
    launch(x, 5, 1.0)
    assert list(kernel.log[-1][2][1:]) == [3, 5, 8, 1.0, False]


def test_launch_hooks_or_an_unloaded_kernel_take_triton_runner(compiled_mode, monkeypatch):
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (3,), BLOCK=8, FLAG=False)
    x = torch.zeros(8)
    launch(x, 5, 1.0)
    launch(x, 5, 1.0)
    assert kernel.log[-1][0] == "direct"
    hooks = SimpleNamespace(launch_enter_hook=print, launch_exit_hook=None)  # a profiler's hook
    monkeypatch.setattr(fast_launch, "_launch_knobs", hooks)
    launch(x, 5, 1.0)
    assert kernel.log[-1][:2] == ("runner", (3, 1, 1))
    # A compiled kernel without the loaded function (another Triton): always its runner.
    unloaded = FakeKernel(loaded=False)
    launch = CachedLauncher(unloaded, (3,), BLOCK=8, FLAG=False)
    monkeypatch.setattr(fast_launch, "_launch_knobs", SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))
    launch(x, 5, 1.0)
    launch(x, 5, 1.0)
    assert [entry[0] for entry in unloaded.log] == ["triton", "runner"]


def test_plan_cache_keeps_the_newest_plans_up_to_its_limit():
    plans = fast_launch.PlanCache(limit=3)
    for key in "abcd":
        assert plans.remember(key, key.upper()) == key.upper()
    assert list(plans) == ["b", "c", "d"]
    assert plans.get("d") == "D" and "a" not in plans


def test_direct_launch_takes_pointers_as_ints_and_the_constexprs_in_place(compiled_mode, monkeypatch):
    kernel = FakeKernel()
    kernel.params.append(kernel.params.pop(2))  # (ptr, n, scale, FLAG, BLOCK): constexprs last
    launch = CachedLauncher(kernel, (5,), BLOCK=16, FLAG=True)
    x = torch.zeros(16)
    direct = launch.direct(x, 7, 0.5)  # launches through Triton first
    assert kernel.log[0][0] == "triton" and len(kernel.log) == 1
    assert direct(0, 123456, 7, 0.25) is True
    assert kernel.log[-1] == ("direct", (5, 1, 1), (123456, 7, 0.25, True, 16))
    # A profiler's hooks need the tensors: nothing is launched, the caller falls back.
    monkeypatch.setattr(fast_launch, "_launch_knobs", SimpleNamespace(launch_enter_hook=print, launch_exit_hook=None))
    assert direct(0, 123456, 7, 0.25) is False
    assert len(kernel.log) == 2


def test_no_direct_launch_where_none_can_be_bound(compiled_mode, monkeypatch):
    x = torch.zeros(8)
    unloaded = FakeKernel(loaded=False)
    unloaded.params.append(unloaded.params.pop(2))
    assert CachedLauncher(unloaded, (1,), BLOCK=8, FLAG=False).direct(x, 3, 1.0) is None
    assert unloaded.log[0][0] == "triton"  # launched all the same
    inside = FakeKernel()  # BLOCK sits between runtime parameters
    assert CachedLauncher(inside, (1,), BLOCK=8, FLAG=False).direct(x, 3, 1.0) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted = FakeKernel()
    interpreted.params.append(interpreted.params.pop(2))
    assert CachedLauncher(interpreted, (1,), BLOCK=8, FLAG=False).direct(x, 3, 1.0) is None
    assert [entry[0] for entry in interpreted.log] == ["triton"]


def test_empty_hook_chains_are_no_hooks(compiled_mode, monkeypatch):
    """Newer Tritons keep launch hooks in a HookChain (a list of calls) that is never None."""
    kernel = FakeKernel()
    launch = CachedLauncher(kernel, (2,), BLOCK=8, FLAG=False)
    x = torch.zeros(8)
    empty = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]), launch_exit_hook=SimpleNamespace(calls=[]))
    monkeypatch.setattr(fast_launch, "_launch_knobs", empty)
    launch(x, 5, 1.0)
    launch(x, 5, 1.0)
    assert kernel.log[-1][0] == "direct"
    empty.launch_exit_hook.calls.append(print)  # a profiler adds a hook
    launch(x, 5, 1.0)
    assert kernel.log[-1][0] == "runner"


class FakeLauncher:
    """Triton's compiled launcher: a Python ``__call__`` handing its C function (an attribute of
    the instance) the grid, stream and function, fixed flags, scratch buffers, the metadata and
    hooks, then the kernel's arguments, flat or (``as_tuple``) as one tuple."""

    def __init__(self, log: list, scratch=None, as_tuple: bool = False) -> None:
        self.log, self.scratch, self.as_tuple = log, scratch, as_tuple
        self.launch = lambda *passed: log.append(("c", passed))

    def __call__(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args):
        self.log.append(("python",))
        scratch = self.scratch() if self.scratch else None
        if self.as_tuple:
            self.launch(gx, gy, gz, stream, function, True, 0, metadata, launch_metadata, enter, exit_, scratch, args)
        else:
            self.launch(gx, gy, gz, stream, function, True, 0, scratch, None, metadata, launch_metadata, enter, exit_,
                        *args)


def test_direct_launch_calls_the_c_launcher_once_it_has_seen_fixed_arguments(compiled_mode):
    log: list = []
    direct = fast_launch.DirectLaunch(FakeLauncher(log), (5, 1, 1), "fn", "meta", (16,))
    for ptr in (111, 222, 333):
        assert direct(0, ptr, 7) is True
    passed = [entry[1] for entry in log if entry[0] == "c"]
    assert [entry[0] for entry in log] == ["python", "c", "c", "c"]
    assert direct.calls_c_launcher
    assert passed == [(5, 1, 1, 1234, "fn", True, 0, None, None, "meta", None, None, None, ptr, 7, 16)
                      for ptr in (111, 222, 333)]


@pytest.mark.parametrize("launcher", ["scratch", "as_tuple"])
def test_direct_launch_keeps_the_launcher_where_its_c_arguments_may_change(compiled_mode, launcher):
    """A scratch buffer allocated per call, or arguments handed over in another shape: every call
    goes through the launcher."""
    log: list = []
    run = FakeLauncher(log, scratch=object) if launcher == "scratch" else FakeLauncher(log, as_tuple=True)
    direct = fast_launch.DirectLaunch(run, (5, 1, 1), "fn", "meta", (16,))
    for ptr in (111, 222):
        assert direct(0, ptr, 7) is True
    assert [entry[0] for entry in log] == ["python", "c", "python", "c"]
    assert not direct.calls_c_launcher
