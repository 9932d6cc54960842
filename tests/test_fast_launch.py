"""CachedLauncher's bookkeeping, with a stand-in for a Triton kernel (the real fast path needs a
GPU: tests/gpu run every optimizer step after the first through it)."""

from types import SimpleNamespace

import pytest
import torch

from kernelbench import fast_launch
from kernelbench.fast_launch import CachedLauncher, fast_apply


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


class _Scale(torch.autograd.Function):
    """y = x * s with a hand-written backward: a Function without setup_context."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.s, None


class _ScaleWithSetup(_Scale):
    @staticmethod
    def forward(x, s):
        return x * s

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.s = inputs[1]


def test_fast_apply_records_the_same_node_and_gradients_as_apply():
    x = torch.randn(4, 3, requires_grad=True)
    fast = fast_apply(_Scale)
    assert fast is not _Scale.apply
    y_fast, y_full = fast(x, 3.0), _Scale.apply(x, 3.0)
    assert type(y_fast.grad_fn) is type(y_full.grad_fn)
    torch.testing.assert_close(y_fast, y_full, rtol=0, atol=0)
    (g_fast,) = torch.autograd.grad(y_fast.sum(), x)
    (g_full,) = torch.autograd.grad(y_full.sum(), x)
    torch.testing.assert_close(g_fast, g_full, rtol=0, atol=0)


def test_fast_apply_leaves_functorch_and_setup_context_to_apply():
    # Under a transform the Function's own apply decides (here: it refuses, no setup_context).
    fast = fast_apply(_Scale)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vmap(lambda t: fast(t, 2.0))(torch.randn(3, 2))
    # With setup_context, apply binds default arguments: it is returned as it is.
    assert fast_apply(_ScaleWithSetup) == _ScaleWithSetup.apply


# ------------------------------------------------------------------------------------------------
# The switch and the version fence: the public path really runs, with the same results
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("torch_version, triton_version, supported", [
    ("2.11.0+cu130", "3.6.0", True),
    ("2.13.0+cpu", "3.9.0", True),
    ("2.10.1", "3.6.0", False),  # torch older than the checked range
    ("2.14.0.dev20270101", "3.6.0", False),  # newer
    ("2.11.0", "3.5.1", False),
    ("2.11.0", "3.10.0", False),
    ("2.11.0", None, False),  # no Triton
    ("garbage", "3.6.0", False),
])
def test_versions_outside_the_checked_ranges_are_not_supported(torch_version, triton_version, supported):
    assert fast_launch.versions_supported(torch_version, triton_version) is supported


def test_switched_off_launches_go_through_triton_every_time(compiled_mode, monkeypatch):
    kernel = FakeKernel()
    kernel.params.append(kernel.params.pop(2))  # constexprs last: a DirectLaunch can be bound
    launch = CachedLauncher(kernel, (2,), BLOCK=8, FLAG=False)
    x = torch.zeros(8)
    direct = launch.direct(x, 5, 1.0)
    assert direct is not None
    monkeypatch.setattr(fast_launch, "_on", fast_launch._on)  # restored after the test
    assert fast_launch.set_enabled(False) is True
    assert not fast_launch.enabled()
    for _ in range(3):
        launch(x, 5, 1.0)
    assert direct(0, 123, 5, 1.0) is False  # a DirectLaunch bound earlier launches nothing
    assert launch.direct(x, 5, 1.0) is None
    assert [entry[0] for entry in kernel.log] == ["triton"] * 5
    fast_launch.set_enabled(True)
    launch(x, 5, 1.0)
    assert kernel.log[-1][0] == "direct"


def test_switched_off_fast_apply_calls_the_functions_apply(monkeypatch):
    calls = []

    class Recorded(_Scale):
        @classmethod
        def apply(cls, *args):
            calls.append(args)
            return super().apply(*args)

    fast = fast_apply(Recorded)
    x = torch.randn(3, requires_grad=True)
    monkeypatch.setattr(fast_launch, "_on", True)
    y_fast = fast(x, 2.0)
    assert calls == []
    fast_launch.set_enabled(False)
    y_public = fast(x, 2.0)
    assert len(calls) == 1
    assert torch.equal(y_fast, y_public)
    # Outside the checked versions no private entry point is read at all.
    monkeypatch.setattr(fast_launch, "_SUPPORTED", False)
    assert fast_apply(Recorded) == Recorded.apply


# Every layer forward and backward on tiny inputs in the Triton interpreter; run here with the
# fast path on and in a process where torch's version is outside the checked range.
LAYERS = '''
import torch
from kernelbench.nn import apply_rotary, cross_entropy, rms_norm, silu_mul

def layer_results():
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, shape, residual in (("norm", (3, 40), False), ("norm-res", (2, 3, 24), True),
                                  ("norm-wide", (2, 9000), False)):
        x = torch.randn(shape, generator=gen).bfloat16().requires_grad_(True)
        w = torch.randn(shape[-1], generator=gen).bfloat16().requires_grad_(True)
        r = torch.randn(shape, generator=gen).bfloat16().requires_grad_(True) if residual else None
        for call in range(2):  # the second call of a signature takes a bound plan where there is one
            y = rms_norm(x, w, 1e-6, residual=r, impl="triton")
            ys = y if residual else (y,)
            grads = torch.autograd.grad(ys, [t for t in (x, w, r) if t is not None], [torch.ones_like(t) for t in ys])
            out[f"{name}-{call}"] = [t.detach() for t in ys] + list(grads)
        with torch.no_grad():
            out[f"{name}-nograd"] = rms_norm(x, w, 1e-6, residual=r, impl="triton")
    q = torch.randn(1, 2, 5, 8, generator=gen).requires_grad_(True)
    k = torch.randn(1, 1, 5, 8, generator=gen).requires_grad_(True)
    angles = torch.rand(5, 8, generator=gen)
    qo, ko = apply_rotary(q, k, angles.cos(), angles.sin(), impl="triton")
    out["rotary"] = [qo.detach(), ko.detach(), *torch.autograd.grad((qo, ko), (q, k), (qo.detach(), ko.detach()))]
    gate = torch.randn(4, 33, generator=gen).requires_grad_(True)
    up = torch.randn(4, 33, generator=gen).requires_grad_(True)
    s = silu_mul(gate, up, impl="triton")
    out["swiglu"] = [s.detach(), *torch.autograd.grad(s, (gate, up), torch.ones_like(s))]
    logits = torch.randn(6, 50, generator=gen).requires_grad_(True)
    targets = torch.randint(0, 50, (6,), generator=gen)
    loss = cross_entropy(logits, targets, impl="triton")
    out["xent"] = [loss.detach(), *torch.autograd.grad(loss, logits)]
    return out
'''


def _flatten(results):
    return {f"{key}/{i}": t for key, value in results.items()
            for i, t in enumerate(value if isinstance(value, (list, tuple)) else [value])}


def test_layers_take_the_plain_path_when_switched_off(monkeypatch):
    """Switched off, RMSNorm takes host.forward / host.backward and never its fast path; every
    layer gives the same bits as with the fast path on."""
    from kernelbench.nn.rmsnorm import fast_path

    namespace: dict = {}
    exec(LAYERS, namespace)
    monkeypatch.setattr(fast_launch, "_on", True)
    fast = _flatten(namespace["layer_results"]())
    fast_launch.set_enabled(False)

    def refuse(*args, **kwargs):
        raise AssertionError("the fast path ran while switched off")

    for name in ("forward", "backward", "small_call", "bind_small_call"):
        monkeypatch.setattr(fast_path, name, refuse)
    plain = _flatten(namespace["layer_results"]())
    assert fast.keys() == plain.keys()
    for key in fast:
        assert torch.equal(fast[key], plain[key]), key


def test_outside_the_checked_versions_everything_takes_the_public_path(tmp_path):
    """A torch version outside TORCH_VERSIONS: no private entry point is bound, and every layer's
    forward and backward give the bits this process gives with the fast path on."""
    import os
    import subprocess
    import sys

    out = tmp_path / "public.pt"
    code = ("import torch\ntorch.__version__ = '2.99.0'\n"
            "from kernelbench import fast_launch\n"
            "assert not fast_launch.enabled() and not fast_launch.set_enabled(True) and not fast_launch.enabled()\n"
            "assert fast_launch.current_device is torch.cuda.current_device\n"
            + LAYERS +
            "from kernelbench.nn.rmsnorm import fast_path\n"
            "fast_path.forward = fast_path.backward = fast_path.small_call = None  # must not be reached\n"
            f"torch.save(layer_results(), {str(out)!r})\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    namespace: dict = {}
    exec(LAYERS, namespace)
    fast = _flatten(namespace["layer_results"]())
    public = _flatten(torch.load(out))
    assert fast.keys() == public.keys()
    for key in fast:
        assert torch.equal(fast[key], public[key]), key


def test_the_environment_switch(monkeypatch):
    import os
    import subprocess
    import sys

    code = "from kernelbench import fast_launch; print(fast_launch.enabled())"
    for value, expected in (("0", "False"), ("1", str(fast_launch._SUPPORTED))):
        env = {**os.environ, fast_launch.SWITCH_ENV: value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.stdout.strip() == expected, done.stderr[-2000:]
