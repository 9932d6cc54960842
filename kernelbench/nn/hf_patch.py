"""kernelbench's layers in a Hugging Face causal LM, one model instance at a time.

``patch_hf_model(model)`` takes a ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or
``MistralForCausalLM`` (or a subclass) and swaps, on that instance only:

- each RMSNorm module's ``forward`` for ``kernelbench.nn.rms_norm`` (same module, same weight);
- each attention module's rotary application for ``kernelbench.nn.apply_rotary``: the attention
  class's own forward code, bound to the instance with globals in which ``apply_rotary_pos_emb``
  is kernelbench's (the tables stay Hugging Face's, so every ``rope_type`` works);
- each MLP's ``act_fn(gate) * up`` for ``kernelbench.nn.silu_mul``;
- the model's ``loss_function`` (Hugging Face's per-instance hook) for a causal-LM loss on
  ``kernelbench.nn.cross_entropy``, which skips the fp32 copy of the logits.

Classes, transformers' module globals and other instances are left alone; parameters stay the
same ``Parameter`` objects, so an optimizer built before the patch keeps working.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

# The class of a model's transformers family -> the prefix of its layer classes.
SUPPORTED_MODELS = {"LlamaForCausalLM": "Llama", "Qwen2ForCausalLM": "Qwen2", "MistralForCausalLM": "Mistral"}
SILU_ACTIVATIONS = ("silu", "swish")
IMPLS = ("auto", "triton", "torch")
PATCHED_ATTR = "_kernelbench_patched"

__all__ = ["IMPLS", "SUPPORTED_MODELS", "attention_class", "attention_forward", "bind_forward", "patch_hf_model"]


def _family(model: torch.nn.Module) -> tuple[str, types.ModuleType]:
    """(layer-class prefix, modeling module) of the transformers class ``model`` is or derives from."""
    for cls in type(model).__mro__:
        if cls.__name__ in SUPPORTED_MODELS and cls.__module__.startswith("transformers.models."):
            return SUPPORTED_MODELS[cls.__name__], sys.modules[cls.__module__]
    raise ValueError(f"patch_hf_model: {type(model).__name__} is not supported; it patches "
                     f"{', '.join(SUPPORTED_MODELS)} (transformers) and their subclasses")


def _check_config(model: torch.nn.Module) -> None:
    config = model.config
    act = getattr(config, "hidden_act", "silu")
    if act not in SILU_ACTIVATIONS:
        raise ValueError(f"patch_hf_model: {type(model).__name__} has hidden_act={act!r}; the SwiGLU swap needs "
                         f"{' or '.join(map(repr, SILU_ACTIVATIONS))} (pass swiglu=False to keep the model's)")


def _rms_norm_forward(impl: str) -> Callable:
    from .rmsnorm import rms_norm

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, impl=impl)

    return forward


def _mlp_forward(impl: str) -> Callable:
    from .swiglu import silu_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x), impl=impl))

    return forward


def _rotary_function(hf_rotary: Callable, impl: str) -> Callable:
    from .rotary import apply_rotary

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        # Tables per batch row (explicit, differing position_ids) are beyond kernelbench's
        # (positions, dim) table; shapes are static, so this choice costs no guard on values.
        if (cos.dim() == 3 and cos.shape[0] != 1) or unsqueeze_dim not in (1, 2):
            return hf_rotary(q, k, cos, sin, unsqueeze_dim)
        return apply_rotary(q, k, cos, sin, layout="bhsd" if unsqueeze_dim == 1 else "bshd", impl=impl)

    return apply_rotary_pos_emb


# (attention class, rotary name) -> its forward with that rotary in its globals: built once, so
# every patched instance of a class shares one code object (one compile).
_attention_forwards: dict[tuple[type, str], Callable] = {}


def attention_forward(attention_cls: type, name: str, make_rotary: Callable[[Callable], Callable]) -> Callable:
    """``attention_cls.forward``'s code with ``apply_rotary_pos_emb`` replaced by
    ``make_rotary(hf_apply_rotary_pos_emb)``; ``name`` tells rotaries apart (a cache key)."""
    key = (attention_cls, name)
    if key not in _attention_forwards:
        # The class's own code: decorators around it only rename deprecated keywords.
        code_fn = inspect.unwrap(attention_cls.forward)
        if "apply_rotary_pos_emb" not in code_fn.__code__.co_names:
            raise ValueError(f"patch_hf_model: {attention_cls.__name__}.forward does not call apply_rotary_pos_emb "
                             "in this transformers version; pass rotary=False")
        # The globals live in a module of their own in sys.modules: torch.compile guards a
        # function's globals through the module its __name__ names.
        scope = types.ModuleType(f"{__name__}.{attention_cls.__name__}_{name}")
        scope.__dict__.update({k: v for k, v in code_fn.__globals__.items() if k not in ("__name__", "__spec__")})
        scope.apply_rotary_pos_emb = make_rotary(code_fn.__globals__["apply_rotary_pos_emb"])
        sys.modules[scope.__name__] = scope
        fn = types.FunctionType(code_fn.__code__, scope.__dict__, code_fn.__name__, code_fn.__defaults__,
                                code_fn.__closure__)
        fn.__kwdefaults__ = code_fn.__kwdefaults__
        fn.__qualname__ = code_fn.__qualname__
        _attention_forwards[key] = fn
    return _attention_forwards[key]


def attention_class(model: torch.nn.Module) -> type:
    """The attention class of ``model``'s transformers family (ValueError for another model)."""
    prefix, modeling = _family(model)
    return getattr(modeling, f"{prefix}Attention")


def bind_forward(model: torch.nn.Module, cls: type, forward: Callable) -> None:
    """``forward`` as the ``forward`` of each ``cls`` module of ``model`` (the instances only)."""
    for module in model.modules():
        if isinstance(module, cls):
            module.forward = types.MethodType(forward, module)


def _causal_lm_loss(impl: str) -> Callable:
    from .crossentropy import cross_entropy

    def loss_function(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                      **kwargs):
        """Hugging Face's ``ForCausalLMLoss`` (labels shifted by one, mean over the non-ignored
        positions or sum / num_items_in_batch) on kernelbench's cross-entropy."""
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        reduction = "mean" if num_items_in_batch is None else "sum"
        loss = cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device),
                             ignore_index=ignore_index, reduction=reduction, impl=impl)
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        return loss

    return loss_function


def patch_hf_model(model: torch.nn.Module, *, rms_norm: bool = True, rotary: bool = True, swiglu: bool = True,
                   loss: bool = True, impl: str = "auto") -> torch.nn.Module:
    """Swap kernelbench's RMSNorm, rotary, SwiGLU activation and loss into ``model`` (a
    transformers ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``MistralForCausalLM``) and return it.

    Per instance: other instances and transformers' classes are untouched; weights stay the same
    ``Parameter`` objects. ``impl`` is each layer's ("auto", "triton", "torch"). A model of
    another class, a config the swaps cannot take (a non-SiLU ``hidden_act`` with ``swiglu``)
    or a model patched before raises ValueError, before anything is changed.
    """
    if impl not in IMPLS:
        raise ValueError(f"patch_hf_model: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    prefix, modeling = _family(model)
    if getattr(model, PATCHED_ATTR, None) is not None:
        raise ValueError(f"patch_hf_model: this {type(model).__name__} is already patched "
                         f"({', '.join(getattr(model, PATCHED_ATTR)) or 'nothing'}); patch a fresh instance")
    if swiglu:
        _check_config(model)
    classes = {name: getattr(modeling, f"{prefix}{name}") for name in ("RMSNorm", "Attention", "MLP")}
    # Built before any module changes, so an error leaves the model as it was.
    forwards = {
        "RMSNorm": _rms_norm_forward(impl) if rms_norm else None,
        "Attention": attention_forward(classes["Attention"], f"kernelbench_{impl}",
                                       lambda hf_rotary: _rotary_function(hf_rotary, impl)) if rotary else None,
        "MLP": _mlp_forward(impl) if swiglu else None,
    }
    for name, cls in classes.items():
        if forwards[name] is not None:
            bind_forward(model, cls, forwards[name])
    if loss:
        model.loss_function = _causal_lm_loss(impl)
    done = dict(rms_norm=rms_norm, rotary=rotary, swiglu=swiglu, loss=loss)
    setattr(model, PATCHED_ATTR, tuple(name for name, on in done.items() if on))
    return model
