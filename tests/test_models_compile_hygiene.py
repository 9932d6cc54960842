"""Compile hygiene on the CPU: the Llama model with kernelbench's layers (Triton in the
interpreter) compiles whole (``fullgraph=True``) with dynamic shapes under ``aot_eager``, steps
forward and backward, and raises no warning from kernelbench's code or about its ops (Python
warnings and torch's log records both). tests/gpu/test_models_compile_hygiene_gpu.py does the same
under Inductor and runs Inductor's mutation analysis on every Triton kernel."""

import logging
import warnings
from pathlib import Path

import pytest
import torch

import kernelbench
from kernelbench.models import Llama
from kernelbench.models.grid import parse_model_spec

PACKAGE = str(Path(kernelbench.__file__).resolve().parent)
# Two layers (the residual add fused into the next norm is traced), GQA, an odd vocabulary.
TINY = parse_model_spec("hidden=32,layers=2,heads=4,kv_heads=2,intermediate=48,vocab=67,max_seq=16")


def about_kernelbench(filename: str, message: str) -> bool:
    """A warning raised in kernelbench's code, or naming one of its ops (``kernelbench::...``)."""
    return str(Path(filename).resolve()).startswith(PACKAGE) or "kernelbench" in message


def compile_and_step(backend: str, device: str, caplog) -> tuple[list[str], torch.Tensor]:
    """Compiles the model's loss with ``backend`` (fullgraph, dynamic), runs two fwd+bwd steps of
    different sequence lengths; returns what was warned about kernelbench, and the last loss."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Llama(TINY, "kernelbench", impl="triton").to(device)
    step = torch.compile(model.loss, backend=backend, fullgraph=True, dynamic=True)
    found = []
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        for seq in (9, 13):  # a second length: the dynamic graph is reused, not specialised
            tokens = torch.randint(0, TINY.vocab_size, (2, seq + 1), device=device)
            loss = step(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
    found += [f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught
              if about_kernelbench(w.filename, str(w.message))]
    found += [f"log {r.name} at {r.pathname}:{r.lineno}: {r.getMessage()}" for r in caplog.records
              if r.levelno >= logging.WARNING and about_kernelbench(r.pathname, r.getMessage())]
    return found, loss.detach()


@pytest.mark.slow  # about 30 s of CPU: Dynamo, AOT autograd and the Triton interpreter
def test_kernelbench_layers_compile_without_warnings_under_aot_eager(caplog):
    from torch._dynamo.utils import counters

    counters.clear()
    found, loss = compile_and_step("aot_eager", "cpu", caplog)
    assert not found, "\n".join(found)
    assert torch.isfinite(loss)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_the_check_sees_a_warning_from_kernelbench(caplog):
    """The filter above is not vacuous: a warning naming a kernelbench op is caught."""
    assert about_kernelbench("/elsewhere/torch/x.py", "kernelbench::rmsnorm_fwd has no fake")
    assert about_kernelbench(str(Path(PACKAGE) / "nn" / "x.py"), "anything")
    assert not about_kernelbench("/elsewhere/torch/x.py", "TF32 is off")
