"""Compile hygiene on the GPU: the Llama model with kernelbench's layers compiles whole under
Inductor (``fullgraph=True``, ``dynamic=True``) without a warning from kernelbench's code or about
its ops, and Inductor's mutation analysis (``identify_accessed_tensors``, run on the TTIR of every
kernel a ``wrap_triton`` call launches) succeeds on each kernel: it names the tensors the kernel
writes, never falls back to "every input is mutated", and covers every kernel traced."""

import logging
import warnings
from pathlib import Path

import pytest
import torch
from torch._higher_order_ops import triton_kernel_wrap

import kernelbench
from kernelbench.models import Llama
from kernelbench.models.grid import parse_model_spec

pytestmark = pytest.mark.gpu

PACKAGE = str(Path(kernelbench.__file__).resolve().parent)
# Two layers (the residual add fused into the next norm is traced), GQA, an odd vocabulary.
TINY = parse_model_spec("hidden=128,layers=2,heads=4,kv_heads=2,intermediate=192,vocab=131,max_seq=64")


def about_kernelbench(filename: str, message: str) -> bool:
    """A warning raised in kernelbench's code, or naming one of its ops (``kernelbench::...``)."""
    return str(Path(filename).resolve()).startswith(PACKAGE) or "kernelbench" in message


class _Collect(logging.Handler):
    """Warnings logged while attached (pytest's caplog is off on the GPU machine: ``-p no:logging``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged():
    """WARNING and above from any logger: the root one and torch's (which does not propagate)."""
    handler = _Collect()
    loggers = [logging.getLogger(), logging.getLogger("torch")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.records
    for logger in loggers:
        logger.removeHandler(handler)


def compile_and_step(records: list[logging.LogRecord], impl: str = "triton") -> tuple[list[str], torch.Tensor]:
    """The model's loss under Inductor (fullgraph, dynamic), two fwd+bwd steps of different
    sequence lengths; what was warned about kernelbench, and the last loss. With impl="auto" an
    eager step first, as a user's first step: the layers choose at its shapes, the trace reads
    the choices."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Llama(TINY, "kernelbench", impl=impl).to("cuda")
    if impl == "auto":
        tokens = torch.randint(0, TINY.vocab_size, (2, 34), device="cuda")
        model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    step = torch.compile(model.loss, backend="inductor", fullgraph=True, dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seq in (33, 47):
            tokens = torch.randint(0, TINY.vocab_size, (2, seq + 1), device="cuda")
            loss = step(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
        torch.cuda.synchronize()
    found = [f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught
             if about_kernelbench(w.filename, str(w.message))]
    found += [f"log {r.name} at {r.pathname}:{r.lineno}: {r.getMessage()}" for r in records
              if r.levelno >= logging.WARNING and about_kernelbench(r.pathname, r.getMessage())]
    return found, loss.detach()


@pytest.fixture
def analysed(monkeypatch):
    """Every call of Inductor's mutation analysis: (kernel name, tensor arguments, written)."""
    calls = []
    # torch 2.13 names it identify_accessed_tensors (reads and writes); earlier ones
    # identify_mutated_tensors (the names of the arguments written).
    name = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(triton_kernel_wrap, n))
    analyse = getattr(triton_kernel_wrap, name)

    def spy(kernel, kwargs, tma_descriptor_metadata):
        result = analyse(kernel, kwargs, tma_descriptor_metadata)
        tensors = {k for k, v in kwargs.items() if isinstance(v, torch.Tensor) or type(v).__name__ == "TensorBox"}
        written = {dep.name for dep in result.read_writes.writes} if hasattr(result, "read_writes") else set(result)
        calls.append((kernel.fn.__name__, kernel.fn.__module__, tensors, written))
        return result

    monkeypatch.setattr(triton_kernel_wrap, name, spy)
    return calls


def test_inductor_compiles_kernelbench_layers_cleanly_and_analyses_every_kernel(analysed, logged):
    traced_before = set(triton_kernel_wrap.kernel_side_table.id_to_kernel.values())
    found, loss = compile_and_step(logged)
    assert not found, "\n".join(found)
    assert torch.isfinite(loss)
    fallbacks = [r.getMessage() for r in logged if "assuming every input is mutated" in r.getMessage()]
    assert not fallbacks, fallbacks
    ours = [c for c in analysed if c[1].startswith("kernelbench")]
    assert ours, "Inductor analysed no kernelbench kernel: the layers did not reach it as Triton kernels"
    for name, _, tensors, written in ours:
        assert written, f"{name}: the analysis found no tensor written"
        assert written <= tensors and written != tensors, f"{name}: writes {sorted(written)} of {sorted(tensors)}"
    traced = {k.fn.__name__ for k in set(triton_kernel_wrap.kernel_side_table.id_to_kernel.values()) - traced_before
              if k.fn.__module__.startswith("kernelbench")}
    assert traced <= {name for name, *_ in ours}, f"traced but not analysed: {sorted(traced - {n for n, *_ in ours})}"
    # The four layer kinds of the model all launch Triton kernels.
    modules = {module.split(".")[2] for _, module, *_ in ours}
    assert {"rmsnorm", "rotary", "swiglu", "crossentropy"} <= modules, modules


def test_the_layers_default_impl_compiles_whole_without_warnings(logged, tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    from kernelbench.nn.autoselect import clear_memory_cache

    monkeypatch.setenv("KERNELBENCH_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    counters.clear()
    found, loss = compile_and_step(logged, impl="auto")
    clear_memory_cache()
    assert not found, "\n".join(found)
    assert torch.isfinite(loss)
    assert not counters["graph_break"], dict(counters["graph_break"])
