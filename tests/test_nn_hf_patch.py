"""patch_hf_model on tiny Llama / Qwen2 / Mistral twins: the patched model's logits, loss and every
gradient against the unpatched one (fp32, Triton interpreter on CPU), per-instance swaps, errors,
and a whole-graph compile."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (an optional peer) is not installed")

from kernelbench.nn import patch_hf_model  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=64)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q / k / v projections with bias
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
}
# What each swap puts in the autograd graph of the loss.
KERNEL_NODES = {"rms_norm": "RMSNormFunction", "rotary": "RotaryFunction", "swiglu": "SiluMulFunction",
                "loss": "CrossEntropyFunction"}


def build(family: str, **overrides) -> torch.nn.Module:
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**TINY, **extra, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).float()
    with torch.no_grad():  # norms away from one, so a lost weight would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def batch(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (2, 16), generator=gen)


def step(model, tokens):
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    return out


def autograd_nodes(t: torch.Tensor) -> set[str]:
    """The class names of the autograd nodes behind ``t``, without the "Backward" suffix."""
    seen, names, stack = set(), set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__.removesuffix("Backward"))
        stack.extend(n for n, _ in node.next_functions)
    return names


def assert_model_close(got, want, ref_model, model, atol=1e-5, rtol=1e-4):
    torch.testing.assert_close(got.logits, want.logits, atol=atol, rtol=rtol, msg=lambda m: f"logits: {m}")
    torch.testing.assert_close(got.loss, want.loss, atol=atol, rtol=rtol, msg=lambda m: f"loss: {m}")
    for (name, p_ref), (_, p) in zip(ref_model.named_parameters(), model.named_parameters()):
        assert p.grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(p.grad, p_ref.grad, atol=atol, rtol=rtol, msg=lambda m, n=name: f"grad.{n}: {m}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_matches_unpatched_and_keeps_its_parameters(family):
    ref = build(family)
    model = copy.deepcopy(ref)
    params = list(model.parameters())
    assert patch_hf_model(model, impl="triton") is model
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    tokens = batch()
    want, got = step(ref, tokens), step(model, tokens)
    assert set(KERNEL_NODES.values()) <= autograd_nodes(got.loss)
    assert_model_close(got, want, ref, model)


def test_each_swap_can_be_left_out():
    model = patch_hf_model(build("llama"), rotary=False, loss=False, impl="triton")
    nodes = autograd_nodes(step(model, batch()).loss)
    assert {KERNEL_NODES["rms_norm"], KERNEL_NODES["swiglu"]} <= nodes
    assert not {KERNEL_NODES["rotary"], KERNEL_NODES["loss"]} & nodes


def test_other_instances_and_transformers_are_untouched():
    from transformers.models.llama import modeling_llama

    hf_rotary = modeling_llama.apply_rotary_pos_emb
    classes = {cls: cls.forward for cls in (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaAttention,
                                            modeling_llama.LlamaMLP)}
    other = build("llama")
    loss_before = other.loss_function
    patch_hf_model(build("llama"), impl="triton")
    assert modeling_llama.apply_rotary_pos_emb is hf_rotary
    assert all(cls.forward is fn for cls, fn in classes.items())
    assert other.loss_function is loss_before
    assert not any("forward" in vars(m) for m in other.modules())
    assert not set(KERNEL_NODES.values()) & autograd_nodes(step(other, batch()).loss)


def test_loss_matches_hf_with_ignored_labels_and_num_items_in_batch():
    from transformers.loss.loss_utils import ForCausalLMLoss

    model = patch_hf_model(build("llama"), rms_norm=False, rotary=False, swiglu=False, impl="triton")
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 128, generator=gen, requires_grad=True)
    labels = torch.randint(0, 128, (3, 7), generator=gen)
    labels[0, :3] = -100
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(11)}):
        got = model.loss_function(logits=logits, labels=labels, vocab_size=128, **kwargs)
        want = ForCausalLMLoss(logits=logits, labels=labels, vocab_size=128, **kwargs)
        (g_got,), (g_want,) = torch.autograd.grad(got, logits), torch.autograd.grad(want, logits)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(g_got, g_want, atol=1e-6, rtol=1e-5)


def test_unknown_models_are_refused_naming_what_is_supported():
    base = transformers.LlamaModel(transformers.LlamaConfig(**TINY))
    for model in (base, torch.nn.Linear(4, 4)):
        with pytest.raises(ValueError, match=rf"{type(model).__name__} is not supported.*LlamaForCausalLM, "
                                             r"Qwen2ForCausalLM, MistralForCausalLM"):
            patch_hf_model(model)


def test_unsupported_config_and_double_patch_are_refused_before_any_change():
    model = build("llama", hidden_act="gelu")
    with pytest.raises(ValueError, match=r"LlamaForCausalLM has hidden_act='gelu'.*swiglu=False"):
        patch_hf_model(model)
    assert not any("forward" in vars(m) for m in model.modules())
    patch_hf_model(model, swiglu=False, impl="triton")
    with pytest.raises(ValueError, match="already patched"):
        patch_hf_model(model)
    with pytest.raises(ValueError, match="impl must be one of"):
        patch_hf_model(build("llama"), impl="cuda")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_patched_model_compiles_whole(family):
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    ref = build(family)
    model = patch_hf_model(copy.deepcopy(ref), impl="triton")
    tokens = batch(1)
    want = step(ref, tokens)
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(model, backend=capture, fullgraph=True)
    got = step(compiled, tokens)
    assert len(graphs) == 1
    code = graphs[0].code
    for op in ("rms_norm_fwd", "rotary", "silu_mul_fwd", "cross_entropy_fwd"):
        assert f"torch.ops.kernelbench.{op}" in code, op
    assert_model_close(got, want, ref, model)
