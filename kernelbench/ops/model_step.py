"""What the model-step ops (llama-step, hf-step) share: their token batches, the compiled step and
the throughput row."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import generator

if TYPE_CHECKING:
    import torch


def step_tokens(device: str, seed: int, step: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """(batch, seq + 1) token ids drawn from the workload's seed and the step: inputs are
    ``[:, :-1]``, next-token targets ``[:, 1:]``."""
    import torch

    gen = generator(device, seed * 1_000_003 + step)
    return torch.randint(0, vocab, (batch, seq + 1), generator=gen, device=device)


def _raise_recompile_limit() -> None:
    """Every case compiles the same method for a new model, a recompile of one code object to
    Dynamo; past its limit (8) it would stop compiling, so the limit goes up as for the anchors."""
    import torch._dynamo.config as dynamo_config

    from .function_op import _ANCHOR_RECOMPILE_LIMIT

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), _ANCHOR_RECOMPILE_LIMIT))


def compile_step(step: Callable, device: str, fullgraph: bool = True, mode: str | None = None,
                 options: dict | None = None) -> Callable:
    """``torch.compile(step)`` (``mode="reduce-overhead"``: under CUDA graphs; ``options``: Inductor
    settings for this compile only, not with a mode). Inductor needs a C++ / Triton toolchain; on
    the CPU the graph is still captured (whole with ``fullgraph``) and run through AOT autograd."""
    import torch

    _raise_recompile_limit()
    inductor = device == "cuda"
    kwargs: dict = {"mode": mode} if mode else {}
    if options and inductor:
        kwargs["options"] = options
    return torch.compile(step, fullgraph=fullgraph, backend="inductor" if inductor else "aot_eager", **kwargs)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, named ``grad.<parameter name>``, as the parity check compares them."""
    return {f"grad.{name}": p.grad for name, p in model.named_parameters() if p.grad is not None}


def tokens_per_s_row(tokens: int, median_ms: float) -> tuple[str, float, str, str]:
    return ("tokens_per_s", tokens / (median_ms * 1e-3), "tok/s", f"{tokens} tokens per step / median step time")
