"""The Llama-style decoder: names, sizes, and the same function under every layer set."""

import pytest
import torch

from kernelbench.models import CONFIGS, Llama, LlamaConfig


def test_hf_parameter_names_and_count():
    cfg = CONFIGS["llama-tiny"]
    model = Llama(cfg)
    names = [n for n, _ in model.named_parameters()]
    assert names[0] == "model.embed_tokens.weight" and names[-1] == "lm_head.weight"
    assert "model.layers.1.self_attn.k_proj.weight" in names
    assert "model.layers.0.mlp.down_proj.weight" in names and "model.norm.weight" in names
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()
    k = dict(model.named_parameters())["model.layers.0.self_attn.k_proj.weight"]
    assert k.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.hidden)


def test_tied_embeddings_share_one_parameter():
    cfg = LlamaConfig(vocab_size=32, hidden=16, n_layers=1, n_heads=2, n_kv_heads=1, intermediate=32,
                      max_seq=8, tie_embeddings=True)
    model = Llama(cfg)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()


def test_kernelbench_layers_match_torch_layers_fp64():
    """The fused residual add and Triton kernels (interpreter) compute the torch-layer model's
    loss and every gradient."""
    cfg = CONFIGS["llama-tiny"]
    ref = Llama(cfg, "torch").double()
    ref.reset_parameters(seed=1)
    ours = Llama(cfg, "kernelbench", impl="triton").double()
    ours.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (ref, ours):
        loss = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_fused_head_loss_matches_the_head_then_the_loss_fp64():
    """kernelbench's linear + cross-entropy in place of lm_head and the loss (chunks of 8 rows, so
    several chunks and a ragged last one): the same loss and gradients, and no logits."""
    cfg = CONFIGS["llama-tiny"]
    ref = Llama(cfg, "torch").double()
    ref.reset_parameters(seed=2)
    ours = Llama(cfg, "kernelbench", impl="triton", fused_head_loss=True).double()
    ours.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    results = []
    for model in (ref, ours):
        loss, logits = model.head_loss(model.hidden_states(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        results.append((loss.item(), logits))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-12) and results[1][1] is None
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_fused_head_loss_auto_fuses_where_the_logits_are_many(monkeypatch):
    """"auto" fuses a batch of at least FUSE_MIN_LOGITS logits (rows x vocabulary) and keeps the
    plain head below it; the threshold is lowered to the tiny model's scale."""
    from kernelbench.nn.linear_crossentropy import host

    cfg = CONFIGS["llama-tiny"]
    model = Llama(cfg, "kernelbench", impl="torch", fused_head_loss="auto")
    monkeypatch.setattr(host, "FUSE_MIN_LOGITS", 20 * cfg.vocab_size)
    tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    _, logits_short = model.head_loss(model.hidden_states(tokens[:, :9]), tokens[:, 1:10])  # 18 rows
    _, logits_long = model.head_loss(model.hidden_states(tokens[:, :-1]), tokens[:, 1:])  # 20 rows
    assert logits_short is not None and logits_long is None
    assert (model.fuses_head_loss(19), model.fuses_head_loss(20)) == (False, True)
    with pytest.raises(ValueError, match="fused_head_loss: True, False or 'auto', got 'yes'"):
        Llama(cfg, "kernelbench", fused_head_loss="yes")


@pytest.mark.parametrize("layers, overrides", [("torch", None), ("kernelbench", {"loss": lambda logits, t: 0})])
def test_fused_head_loss_needs_kernelbench_loss(layers, overrides):
    with pytest.raises(ValueError, match="fused_head_loss.*layers='kernelbench'"):
        Llama(CONFIGS["llama-tiny"], layers, overrides=overrides, fused_head_loss=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(hidden=60, n_heads=8), "not divisible by n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "not divisible by n_kv_heads"),
    (dict(n_layers=0), "at least 1"),
])
def test_bad_config(kwargs, match):
    base = dict(vocab_size=16, hidden=64, n_layers=1, n_heads=4, n_kv_heads=2, intermediate=32, max_seq=8)
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**{**base, **kwargs})


def test_sequence_longer_than_tables_is_refused():
    cfg = CONFIGS["llama-tiny"]
    with pytest.raises(ValueError, match="exceeds max_seq"):
        Llama(cfg)(torch.zeros(1, cfg.max_seq + 1, dtype=torch.long))


def test_impl_per_slot(monkeypatch):
    """impl as {slot: impl}: that slot's calls take it, the others "auto"; an unknown slot is an error."""
    import kernelbench.nn as knn

    cfg = CONFIGS["llama-tiny"]
    model = Llama(cfg, "kernelbench", impl={"rotary": "torch", "norm": "triton"})
    assert model.layer_set.impls == {"norm": "triton", "rotary": "torch", "silu_mul": "auto", "loss": "auto"}
    assert model.model.norm.impl == "triton"
    asked = []
    real = knn.apply_rotary
    monkeypatch.setattr(knn, "apply_rotary", lambda *a, impl, **kw: asked.append(impl) or real(*a, impl=impl, **kw))
    model = Llama(cfg, "kernelbench", impl={"rotary": "torch"})
    model.loss(*torch.randint(0, cfg.vocab_size, (2, 2, 5), generator=torch.Generator().manual_seed(0)))
    assert asked == ["torch"] * cfg.n_layers
    with pytest.raises(ValueError, match=r"impl: unknown layer \['attention'\]; accepted: norm, rotary"):
        Llama(cfg, "kernelbench", impl={"attention": "torch"})
