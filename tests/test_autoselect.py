"""kernelbench.nn.autoselect: the choice, the in-memory and on-disk caches, the fallbacks."""

import json
import os
import subprocess
import sys

import pytest
import torch

from kernelbench.nn import autoselect_report
from kernelbench.nn.autoselect import cache_path, choose_impl, clear_memory_cache
from kernelbench.nn.rmsnorm import AUTOSELECT


class FakeTimer:
    """Stands in for CUDA-event timing: fixed times, counts how often it was asked."""

    def __init__(self, times):
        self.times, self.calls = times, 0

    def __call__(self, runners):
        self.calls += 1
        assert set(runners) == set(self.times)
        return dict(self.times)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    yield tmp_path
    clear_memory_cache()


def test_measures_once_then_memory_then_file(cache_dir):
    timer = FakeTimer({"triton": 0.5, "torch": 0.8})
    first = autoselect_report("rmsnorm", (4, 64), torch.bfloat16, timer=timer)
    assert (first["choice"], first["source"], timer.calls) == ("triton", "measured", 1)
    assert first["times_ms"] == {"triton": 0.5, "torch": 0.8} and "fastest measured" in first["reason"]

    second = autoselect_report("rmsnorm", (4, 64), torch.bfloat16, timer=timer)
    assert (second["source"], timer.calls) == ("memory", 1)

    clear_memory_cache()  # as a new process would start: only the file is left
    third = autoselect_report("rmsnorm", (4, 64), torch.bfloat16, timer=timer)
    assert (third["choice"], third["source"], timer.calls) == ("triton", "file", 1)

    stored = json.loads(cache_path().read_text())
    assert cache_path().parent == cache_dir
    (key,) = stored
    assert key == first["key"] and key.startswith("rmsnorm|-|4x64|bfloat16|fwd+bwd|cpu|torch ")
    assert stored[key]["choice"] == "triton"


def test_key_separates_shape_dtype_mode_and_refresh_remeasures(cache_dir):
    timer = FakeTimer({"triton": 0.9, "torch": 0.3})
    autoselect_report("rmsnorm", (4, 64), torch.bfloat16, timer=timer)
    autoselect_report("rmsnorm", (4, 128), torch.bfloat16, timer=timer)
    autoselect_report("rmsnorm", (4, 64), torch.float16, timer=timer)
    autoselect_report("rmsnorm", (4, 64), torch.bfloat16, mode="fwd", timer=timer)
    assert timer.calls == 4 and len(json.loads(cache_path().read_text())) == 4
    again = autoselect_report("rmsnorm", (4, 64), torch.bfloat16, timer=timer, refresh=True)
    assert (again["source"], again["choice"], timer.calls) == ("measured", "torch", 5)


def test_fresh_process_reads_the_file(cache_dir):
    autoselect_report("rotary", (1, 2, 1, 8, 16, 16), torch.float32, variant="half-bhsd",
                      timer=FakeTimer({"triton": 0.1, "torch": 0.2}))
    code = (
        "import torch; from kernelbench.nn import autoselect_report\n"
        "def no_timer(runners): raise SystemExit('measured again')\n"
        "r = autoselect_report('rotary', (1, 2, 1, 8, 16, 16), torch.float32, variant='half-bhsd', timer=no_timer)\n"
        "print(r['source'], r['choice'])\n"
    )
    env = {**os.environ, "KERNELBENCH_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["file", "triton"]


def test_auto_dispatch_follows_the_choice(cache_dir):
    # A cached "triton" answer for this CPU shape makes impl="auto" take the Triton (interpreter) path.
    autoselect_report("rmsnorm", (3, 40), torch.float32, mode="fwd", timer=FakeTimer({"triton": 1.0, "torch": 2.0}))
    assert choose_impl(AUTOSELECT, (3, 40), torch.float32, "cpu", requires_grad=False) == "triton"
    from kernelbench.nn import rms_norm

    x, w = torch.randn(3, 40), torch.randn(40)
    assert torch.allclose(rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6, impl="triton"), atol=0, rtol=0)


def test_recording_collects_every_choice_made_inside_cached_ones_too(cache_dir):
    from kernelbench.nn.autoselect import choices_as_run, describe_choices, recording_choices
    from kernelbench.nn.rotary import module as rotary_module

    autoselect_report("rmsnorm", (3, 40), torch.float32, mode="fwd", timer=FakeTimer({"triton": 1.0, "torch": 2.0}))
    choose_impl(AUTOSELECT, (3, 40), torch.float32, "cpu", requires_grad=False)  # answered before recording
    with recording_choices() as outer:
        assert choose_impl(AUTOSELECT, (3, 40), torch.float32, "cpu", requires_grad=False) == "triton"
        with recording_choices() as inner:
            rotary_shape = (1, 2, 4, 8, 2, 8)
            choose_impl(rotary_module.AUTOSELECT, rotary_shape, torch.float32, "cpu", requires_grad=True,
                        variant="half-bhsd")
    choose_impl(AUTOSELECT, (5, 40), torch.float32, "cpu", requires_grad=False)  # after: not recorded
    rms_key = ("rmsnorm", (3, 40), torch.float32, "cpu", "fwd", "")
    rotary_key = ("rotary", rotary_shape, torch.float32, "cpu", "fwd+bwd", "half-bhsd")
    assert outer == {rms_key: "triton", rotary_key: "torch"} and inner == {rotary_key: "torch"}
    assert describe_choices(outer) == ("rmsnorm 3x40 float32 fwd: triton; "
                                       "rotary half-bhsd 1x2x4x8x2x8 float32 fwd+bwd: torch")
    # A compiled model's rotary calls take torch's formula (Candidates.traced) whatever eager chose.
    assert "rotary half-bhsd 1x2x4x8x2x8 float32 fwd+bwd: torch (traced; eager torch)" in describe_choices(
        outer, traced=True)
    assert "rmsnorm 3x40 float32 fwd: triton;" in describe_choices(outer, traced=True)
    assert choices_as_run({**outer, rotary_key: "triton"}, traced=True) == {rms_key: "triton", rotary_key: "torch"}
    assert choices_as_run({rotary_key: "triton"}) == {rotary_key: "triton"}


def test_cpu_without_timer_answers_torch_and_writes_nothing(cache_dir):
    report = autoselect_report("rmsnorm", (16, 2048, 4096), torch.bfloat16, device="cpu")
    assert report["choice"] == "torch" and report["reason"] == "no CUDA: timings not measured"
    assert report["times_ms"] == {"triton": None, "torch": None}
    assert not cache_path().exists()


def test_wide_rows_fall_back_to_torch(cache_dir):
    report = autoselect_report("rmsnorm", (2, 70000), torch.float32, timer=FakeTimer({"triton": 0.0, "torch": 1.0}))
    assert report["choice"] == "torch" and "70000 > 65536" in report["reason"]


class RunningTimer:
    """Runs every runner once (the interpreter on the CPU), then answers fixed times: what each
    implementation returned is kept to compare."""

    def __init__(self, times):
        self.times, self.ran = times, []

    def __call__(self, runners):
        for name, run in runners.items():
            run()
            self.ran.append(name)
        return dict(self.times)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_swiglu_candidates_run_both_implementations(cache_dir, mode):
    timer = RunningTimer({"triton": 2.0, "torch": 1.0})
    report = autoselect_report("swiglu", (2, 3, 40), torch.float32, mode=mode, timer=timer)
    assert sorted(timer.ran) == ["torch", "triton"]
    assert report["choice"] == "torch" and report["key"].startswith(f"swiglu|-|2x3x40|float32|{mode}|")


def test_rmsnorm_residual_variant_times_the_fused_call(cache_dir):
    timer = RunningTimer({"triton": 1.0, "torch": 2.0})
    report = autoselect_report("rmsnorm", (2, 3, 40), torch.float32, variant="residual", timer=timer)
    assert sorted(timer.ran) == ["torch", "triton"]
    assert report["choice"] == "triton" and report["key"].startswith("rmsnorm|residual|2x3x40|")
    with pytest.raises(ValueError, match="rmsnorm variant 'fused'; accepted: '' or 'residual'"):
        autoselect_report("rmsnorm", (2, 40), torch.float32, variant="fused", timer=timer)


def test_rmsnorm_with_a_residual_asks_for_the_residual_variant(cache_dir, monkeypatch):
    from kernelbench.nn import rmsnorm as rmsnorm_module

    asked = []

    def fake_choose(candidates, shape, dtype, device, *, requires_grad, variant=""):
        asked.append((candidates.op, shape, variant, requires_grad))
        return "torch"

    monkeypatch.setattr(rmsnorm_module.module, "choose_impl", fake_choose)
    x, r, w = torch.randn(3, 40), torch.randn(3, 40), torch.ones(40)
    y, h = rmsnorm_module.rms_norm(x, w, 1e-6, residual=r)
    rmsnorm_module.rms_norm(x, w, 1e-6)
    assert asked == [("rmsnorm", (3, 40), "residual", False), ("rmsnorm", (3, 40), "", False)]
    assert torch.equal(h, x + r)


def test_bad_arguments(cache_dir):
    with pytest.raises(ValueError, match="unknown op 'layernorm'"):
        autoselect_report("layernorm", (2, 4), torch.float32)
    with pytest.raises(ValueError, match=r"rotary shape is \(B, Hq, Hk, S, D, rotary_dim\)"):
        autoselect_report("rotary", (2, 4), torch.float32)
    with pytest.raises(ValueError, match="swiglu has no variants, got 'half'"):
        autoselect_report("swiglu", (2, 4), torch.float32, variant="half", timer=FakeTimer({"triton": 1, "torch": 2}))
    with pytest.raises(ValueError, match="unknown mode"):
        autoselect_report("rmsnorm", (2, 4), torch.float32, mode="bwd")


def test_without_triton_one_log_line(cache_dir):
    code = (
        "import sys, logging; sys.modules['triton'] = None\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n"
        "import torch; from kernelbench.nn import RMSNorm, apply_rotary\n"
        "m = RMSNorm(32)\n"
        "for n in (3, 4): m(torch.randn(n, 32))\n"
        "q = torch.randn(1, 2, 4, 8); c = torch.ones(4, 8)\n"
        "apply_rotary(q, q, c, c)\n"
        "print(m.impl, 'ok')\n"
    )
    env = {**os.environ, "KERNELBENCH_CACHE_DIR": str(cache_dir)}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "auto ok"
    assert [line for line in out.stderr.splitlines() if "triton not installed" in line] == [
        "kernelbench.nn: triton not installed; RMSNorm, rotary and SwiGLU use PyTorch"
    ]


def test_autoselect_imports_no_candidate():
    """auto-selection takes the candidates it times: importing it loads neither kernel module."""
    code = ("import sys, kernelbench.nn.autoselect\n"
            "print(sorted(m for m in sys.modules if m in ('kernelbench.nn.rmsnorm', 'kernelbench.nn.rotary',\n"
            "                                             'kernelbench.nn.swiglu')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
