"""AdamMini's partition as a drop-in for official adam-mini 1.1.1: the name-set attributes, the
official default on models named like GPT-2, Llama, Qwen2, Mistral, Phi and T5, the opt-in presets
against the pure-PyTorch reference, small tensors' fp32 state, sharing rules and clear errors.
Tiny shapes (the Triton interpreter)."""

import logging
import warnings

import pytest
import torch

from kernelbench.ops.optim_workloads import fused_qkv_shapes, gpt2_shapes, llama_shapes
from kernelbench.optim.adam_mini import AdamMini, AdamMiniReference, Rule

HP = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def named(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02)) for n, s in shapes]


def clone(named_params):
    return [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named_params]


def step_both(pairs, steps=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = [torch.randn(p.shape, generator=gen) for _, p in pairs[0][1]]
        for opt, params in pairs:
            for (_, p), g in zip(params, grads):
                p.grad = g.clone()
            opt.step()


def assert_close(ours, theirs, tol=1e-5):
    for (name, a), (_, b) in zip(ours, theirs):
        assert (a - b).abs().max() <= tol * b.abs().max(), name


def t5_shapes(d=16, ff=24):
    shapes = [("shared.weight", (40, d))]
    for stack in ("encoder", "decoder"):
        p = f"{stack}.block.0.layer"
        shapes += [(f"{p}.0.SelfAttention.{x}.weight", (d, d)) for x in "qkvo"]
        shapes += [(f"{p}.0.SelfAttention.relative_attention_bias.weight", (8, 2)),
                   (f"{p}.0.layer_norm.weight", (d,)), (f"{p}.1.DenseReluDense.wi.weight", (ff, d)),
                   (f"{p}.1.DenseReluDense.wo.weight", (d, ff)), (f"{p}.1.layer_norm.weight", (d,))]
    return shapes


def qwen2_shapes(d=16, heads=2, kv=1, ff=24):
    hd, shapes = d // heads, llama_shapes(vocab=40, d=d, layers=1, heads=heads, kv_heads=kv, hidden=ff)
    return shapes + [("model.layers.0.self_attn.q_proj.bias", (d,)),
                     ("model.layers.0.self_attn.k_proj.bias", (kv * hd,)),
                     ("model.layers.0.self_attn.v_proj.bias", (kv * hd,))]


MODELS = {
    # name: (shapes, geometry); Mistral's parameter names are Llama's
    "gpt2": (gpt2_shapes(vocab=40, d=16, layers=1, positions=12), dict(dim=16, n_heads=2)),
    "llama-gqa": (llama_shapes(vocab=40, d=16, layers=1, heads=2, kv_heads=1, hidden=24),
                  dict(dim=16, n_heads=2, n_kv_heads=1)),
    "qwen2": (qwen2_shapes(), dict(dim=16, n_heads=2, n_kv_heads=1)),
    "phi-fused": (fused_qkv_shapes(vocab=40, d=16, layers=2, heads=2, kv_heads=1, hidden=24),
                  dict(dim=16, n_heads=2, n_kv_heads=1)),
    "t5": (t5_shapes(), dict(dim=16, n_heads=2)),
}


@pytest.mark.parametrize("model", list(MODELS))
def test_default_partition_equals_official(model):
    from adam_mini import Adam_mini

    shapes, geometry = MODELS[model]
    ours = named(shapes)
    theirs = clone(ours)
    opt = AdamMini(ours, verbose=False, **HP, **geometry)
    step_both([(opt, ours), (Adam_mini(theirs, verbose=False, **HP, **geometry), theirs)])
    assert_close(ours, theirs)


def test_one_d_and_three_d_parameters_in_a_row_set():
    """The official code fails on a 1-D parameter matched by a row set (T5's final_layer_norm and
    Phi's final_layernorm contain 'final_layer') and on a 3-D+ one; ours gives the first one block
    per tensor and the second one block per index of dim 0, and says so."""
    opt = AdamMini(named([("encoder.final_layer_norm.weight", (16,)), ("mlp.conv.weight", (4, 3, 5))]), verbose=False)
    report = {r["name"]: r for r in opt.partition_report()}
    norm, conv = report["encoder.final_layer_norm.weight"], report["mlp.conv.weight"]
    assert (norm["kind"], norm["n_blocks"], norm["weight_decay"]) == ("tensor", 1, 0.0) and "1-D" in norm["reason"]
    assert (conv["kind"], conv["n_blocks"], conv["block_len"]) == ("row", 4, 15) and "3-D" in conv["reason"]


def test_name_sets_change_the_partition_until_the_first_step():
    params = named([("h.0.attn.c_attn.weight", (16, 16)), ("h.0.mlp.c_fc.weight", (16, 8))])
    opt = AdamMini(params, dim=16, n_heads=2, verbose=False)
    report = {r["name"]: r for r in opt.partition_report()}
    assert report["h.0.attn.c_attn.weight"]["kind"] == "tensor"
    assert isinstance(opt.wqk_names, set) and "q_proj" in opt.wqk_names and opt.adam_block_names == {"bias"}
    opt.wqk_names.add("c_attn")
    opt.mlp_names.discard("mlp")
    report = {r["name"]: r for r in opt.partition_report()}
    assert (report["h.0.attn.c_attn.weight"]["kind"], report["h.0.attn.c_attn.weight"]["n_blocks"]) == ("head", 2)
    assert report["h.0.mlp.c_fc.weight"]["kind"] == "tensor"
    params[0][1].grad, params[1][1].grad = torch.randn(16, 16), torch.randn(16, 8)
    opt.step()
    assert opt.state[params[0][1]]["vmean"].shape == (2, 1)
    with pytest.raises(RuntimeError, match="embd_names changed after the first step"):
        opt.embd_names.add("wpe")
    with pytest.raises(RuntimeError, match="wv_names changed after the first step"):
        opt.wv_names = {"v"}


def test_gpt2_preset_layout_and_reference():
    shapes, geometry = MODELS["gpt2"]
    ours = named(shapes, seed=2)
    ref = clone(ours)
    opt = AdamMini(ours, preset="gpt2", **HP, **geometry)
    report = {r["name"]: r for r in opt.partition_report()}
    c_attn = report["transformer.h.0.attn.c_attn.weight"]
    assert c_attn["kind"] == "conv1d-qkv" and c_attn["path"] == "pytorch"
    assert c_attn["n_blocks"] == 2 + 2 + 16  # q and k: one per head's columns; v: one per column
    assert report["transformer.h.0.mlp.c_fc.weight"]["n_blocks"] == 64  # Conv1D (16, 64): one per output neuron
    assert report["transformer.wpe.weight"]["kind"] == "row"
    assert report["transformer.h.0.attn.c_attn.bias"]["kind"] == "adam"
    step_both([(opt, ours), (AdamMiniReference(ref, preset="gpt2", **HP, **geometry), ref)], steps=3)
    assert_close(ours, ref)
    # a q head's block is that head's 8 columns over all 16 input rows
    vmean = opt.state[dict(ours)["transformer.h.0.attn.c_attn.weight"]]["vmean"]
    assert vmean.shape == (20,)


def test_fused_qkv_preset_layout_and_reference():
    """GPT-NeoX's query_key_value, rows grouped per head as [q_h; k_h; v_h] (no GQA)."""
    shapes = [("gpt_neox.layers.0.attention.query_key_value.weight", (48, 16)),
              ("gpt_neox.layers.0.attention.query_key_value.bias", (48,)), ("gpt_neox.layers.0.mlp.w", (24, 16))]
    ours = named(shapes, seed=3)
    ref = clone(ours)
    geometry = dict(dim=16, n_heads=2)
    opt = AdamMini(ours, preset="fused-qkv", **HP, **geometry)
    neox = opt.partition_report()[0]
    assert neox["kind"] == "qkv-interleaved" and neox["n_blocks"] == 2 * (2 + 8) and neox["path"] == "triton"
    step_both([(opt, ours), (AdamMiniReference(ref, preset="fused-qkv", **HP, **geometry), ref)], steps=3)
    assert_close(ours, ref)


def test_fused_qkv_preset_with_gqa_and_fp8_runs_in_the_kernels():
    shapes, geometry = MODELS["phi-fused"]
    ours = named(shapes, seed=4)
    ref = clone(ours)
    opt = AdamMini(ours, preset="fused-qkv", **HP, **geometry)
    qkv = {r["name"]: r for r in opt.partition_report()}["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv["kind"] == "qkv" and qkv["n_blocks"] == 2 + 1 + 8 and qkv["block_len"] == 0
    step_both([(opt, ours), (AdamMiniReference(ref, preset="fused-qkv", **HP, **geometry), ref)], steps=3)
    assert_close(ours, ref)
    low = clone(ours)
    opt8 = AdamMini(low, preset="fused-qkv", state_dtype="fp8", min_8bit_size=0, **HP, **geometry)
    step_both([(opt8, low)], steps=1)
    state = opt8.state[dict(low)["model.layers.0.self_attn.qkv_proj.weight"]]
    assert state["m_fp8"].dtype == torch.float8_e4m3fn and state["m_scale"].numel() == 11


def test_small_tensors_keep_fp32_state():
    params = named([("mlp.w", (64, 80)), ("norm.weight", (512,)), ("mlp.fc.bias", (80,))])
    opt = AdamMini(params, state_dtype="fp8", verbose=False)
    step_both([(opt, params)], steps=1)
    w, norm, bias = (p for _, p in params)
    assert opt.state[w]["m_fp8"].dtype == torch.float8_e4m3fn
    assert opt.state[norm]["m"].dtype == torch.float32 and opt.state[bias]["m"].dtype == torch.float32
    report = {r["name"]: r for r in opt.partition_report()}
    assert report["norm.weight"]["m_dtype"] == "fp32" and "min_8bit_size 4096" in report["norm.weight"]["reason"]
    opt = AdamMini(clone(params), state_dtype="bf16", min_8bit_size=100, verbose=False)
    assert [r["m_dtype"] for r in opt.partition_report()] == ["bf16", "bf16", "fp32"]


def test_tied_parameter_has_one_state_and_conflicts_are_errors():
    embed = torch.nn.Parameter(torch.randn(40, 16) * 0.02)
    opt = AdamMini([("model.embed_tokens.weight", embed), ("lm_head.weight", embed)], dim=16, n_heads=2, verbose=False)
    report = opt.partition_report()
    assert len(report) == 1 and report[0]["names"] == ("model.embed_tokens.weight", "lm_head.weight")
    embed.grad = torch.randn(40, 16)
    opt.step()
    assert opt.state[embed]["step"].item() == 1 and len(opt.state) == 1
    shared = torch.nn.Parameter(torch.randn(16, 16))
    opt = AdamMini([("layers.0.q_proj.weight", shared), ("layers.0.scale.weight", shared)], dim=16, n_heads=2)
    with pytest.raises(ValueError, match="one parameter is named 'layers.0.q_proj.weight'.*'layers.0.scale.weight'"):
        opt.partition_report()


def test_geometry_errors_are_clear():
    q = [("layers.0.self_attn.q_proj.weight", torch.nn.Parameter(torch.randn(30, 30)))]
    with pytest.raises(ValueError, match=r"dim \(30\) is not a multiple of n_heads \(4\)"):
        AdamMini(q, dim=30, n_heads=4).partition_report()
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        AdamMini(q, dim=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="fused q/k/v weight.*needs 48 rows"):
        AdamMini([("qkv_proj.weight", torch.nn.Parameter(torch.randn(40, 16)))], dim=16, n_heads=2,
                 preset="fused-qkv").partition_report()
    with pytest.raises(ValueError, match="preset 'gpt3' is not one of gpt2, fused-qkv"):
        AdamMini(q, preset="gpt3")
    with pytest.raises(ValueError, match="fallback 'rows' is not one of official, structure"):
        AdamMini(q, fallback="rows")


def test_summary_through_logging_and_one_warning_for_unmatched_2d(caplog):
    shapes, geometry = MODELS["gpt2"]
    params = named(shapes)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, "kernelbench.optim.adam_mini"):
        warnings.simplefilter("always")
        opt = AdamMini(params, **geometry)
        step_both([(opt, params)], steps=1)
    found = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert found == ["AdamMini found 1 embedding layers, 0 output layers, 0 queries and keys, 0 values, "
                     "0 attn_proj, 2 MLPs; state fp32"]
    assert len(caught) == 1 and "3 2-D parameters matched no name set" in str(caught[0].message)
    assert "transformer.h.0.attn.c_attn.weight" in str(caught[0].message) and "preset='gpt2'" in str(caught[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = AdamMini(clone(params), model_sharding=True, verbose=False, **geometry)
        step_both([(quiet, clone(params))], steps=1)
        AdamMini(clone(params), model_sharding=True, **geometry)
    assert [type(w.message) for w in caught] == [DeprecationWarning]


def test_structure_fallback_and_user_rules_with_weight_only_kinds():
    w = torch.nn.Parameter(torch.randn(16, 48))
    bias = torch.nn.Parameter(torch.randn(48))
    named_params = [("blocks.0.proj.weight", w), ("blocks.0.proj.bias", bias)]
    report = AdamMini(named_params, fallback="structure", verbose=False).partition_report()
    assert (report[0]["kind"], report[0]["n_blocks"]) == ("row", 16)
    rules = [Rule("proj", "column", weight_decay=False)]
    report = AdamMini(named_params, rules=rules, verbose=False).partition_report()
    # a weight-only kind skips the 1-D bias, which falls through to the official rules (Adam)
    assert [(r["kind"], r["n_blocks"], r["weight_decay"]) for r in report] == [("column", 48, 0.0), ("adam", 48, 0.0)]
