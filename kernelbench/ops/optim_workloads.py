"""Parameter sets shared by the optimizer ops (model-sized GPU workloads, and small CPU versions)."""

from __future__ import annotations

from .base import Workload

Shapes = list[tuple[str, tuple[int, ...]]]


def model_370m_shapes(vocab: int = 32000, d: int = 1024, layers: int = 24) -> Shapes:
    """model-370m: 367,576,064 fp32 params in 147 tensors at the default sizes."""
    shapes: Shapes = [("embed", (vocab, d))]
    for i in range(layers):
        shapes += [
            (f"layers.{i}.attn_qkv", (3 * d, d)),
            (f"layers.{i}.attn_out", (d, d)),
            (f"layers.{i}.mlp_up", (4 * d, d)),
            (f"layers.{i}.mlp_down", (d, 4 * d)),
            (f"layers.{i}.norm1", (d,)),
            (f"layers.{i}.norm2", (d,)),
        ]
    return shapes + [("norm", (d,)), ("head", (vocab, d))]


def llama_shapes(vocab: int, d: int, layers: int, heads: int, kv_heads: int, hidden: int) -> Shapes:
    """A Llama-shaped module with Hugging Face parameter names, no biases, untied lm_head."""
    head_dim = d // heads
    shapes: Shapes = [("model.embed_tokens.weight", (vocab, d))]
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.self_attn.q_proj.weight", (d, d)),
            (f"{p}.self_attn.k_proj.weight", (kv_heads * head_dim, d)),
            (f"{p}.self_attn.v_proj.weight", (kv_heads * head_dim, d)),
            (f"{p}.self_attn.o_proj.weight", (d, d)),
            (f"{p}.mlp.gate_proj.weight", (hidden, d)),
            (f"{p}.mlp.up_proj.weight", (hidden, d)),
            (f"{p}.mlp.down_proj.weight", (d, hidden)),
            (f"{p}.input_layernorm.weight", (d,)),
            (f"{p}.post_attention_layernorm.weight", (d,)),
        ]
    return shapes + [("model.norm.weight", (d,)), ("lm_head.weight", (vocab, d))]


def llama_workload(name: str, tier: str, *, vocab: int, d: int, layers: int, heads: int,
                   kv_heads: int, hidden: int, seed: int = 0, note: str = "") -> Workload:
    return Workload(
        name, tier,
        {
            "shapes": llama_shapes(vocab, d, layers, heads, kv_heads, hidden),
            "hyperparams": {"dim": d, "n_heads": heads, "n_kv_heads": kv_heads},
        },
        seed=seed, note=note,
    )


SINGLE_4096x1024 = Workload("single-4096x1024", "gpu", {"shapes": [("weight", (4096, 1024))]})
MODEL_370M = Workload("model-370m", "gpu", {"shapes": model_370m_shapes()})
LLAMA_468M = llama_workload("llama-468m", "gpu", vocab=32000, d=1024, layers=24, heads=16,
                            kv_heads=16, hidden=4096)

# Small enough for the Triton interpreter on a 2-core CPU, odd sizes included on purpose.
TINY = Workload("tiny", "cpu", {"shapes": [("w0", (64, 48)), ("b0", (48,)), ("w1", (33, 17)), ("s", (1,))]}, seed=1)
MODEL_TINY = Workload("model-tiny", "cpu", {"shapes": model_370m_shapes(vocab=96, d=32, layers=2)}, seed=2)
LLAMA_TINY = llama_workload("llama-tiny", "cpu", vocab=96, d=64, layers=2, heads=4, kv_heads=2,
                            hidden=160, seed=3)


def gpt2_shapes(vocab: int, d: int, layers: int, positions: int) -> Shapes:
    """GPT-2 with Hugging Face names: Conv1D weights stored (in, out), fused c_attn, biases, tied
    lm_head (not listed, as model.named_parameters() gives it once)."""
    shapes: Shapes = [("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (positions, d))]
    for i in range(layers):
        h = f"transformer.h.{i}"
        shapes += [
            (f"{h}.ln_1.weight", (d,)), (f"{h}.ln_1.bias", (d,)),
            (f"{h}.attn.c_attn.weight", (d, 3 * d)), (f"{h}.attn.c_attn.bias", (3 * d,)),
            (f"{h}.attn.c_proj.weight", (d, d)), (f"{h}.attn.c_proj.bias", (d,)),
            (f"{h}.ln_2.weight", (d,)), (f"{h}.ln_2.bias", (d,)),
            (f"{h}.mlp.c_fc.weight", (d, 4 * d)), (f"{h}.mlp.c_fc.bias", (4 * d,)),
            (f"{h}.mlp.c_proj.weight", (4 * d, d)), (f"{h}.mlp.c_proj.bias", (d,)),
        ]
    return shapes + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def fused_qkv_shapes(vocab: int, d: int, layers: int, heads: int, kv_heads: int, hidden: int) -> Shapes:
    """Fused q/k/v weights stored [q; k; v] (Phi-3's ``qkv_proj``, Phi-1.5's ``Wqkv``, alternating
    by layer) and, without GQA, GPT-NeoX's per-head interleaved ``query_key_value`` as a last layer."""
    head_dim = d // heads
    qkv_rows = (heads + 2 * kv_heads) * head_dim
    shapes: Shapes = [("model.embed_tokens.weight", (vocab, d))]
    for i in range(layers):
        p = f"model.layers.{i}"
        qkv = f"{p}.self_attn.qkv_proj.weight" if i % 2 == 0 else f"{p}.mixer.Wqkv.weight"
        shapes += [(qkv, (qkv_rows, d)), (f"{p}.self_attn.o_proj.weight", (d, d)),
                   (f"{p}.mlp.gate_up_proj.weight", (2 * hidden, d)), (f"{p}.mlp.down_proj.weight", (d, hidden)),
                   (f"{p}.input_layernorm.weight", (d,)), (f"{p}.post_attention_layernorm.weight", (d,))]
    if kv_heads == heads:
        n = "gpt_neox.layers.0.attention"
        shapes += [(f"{n}.query_key_value.weight", (3 * d, d)), (f"{n}.query_key_value.bias", (3 * d,)),
                   (f"{n}.dense.weight", (d, d))]
    return shapes + [("model.norm.weight", (d,)), ("lm_head.weight", (vocab, d))]


def _model_workload(name: str, tier: str, shapes: Shapes, *, seed: int, preset: str | None = None,
                    **geometry: int) -> Workload:
    hyperparams: dict = dict(geometry)
    if preset is not None:
        hyperparams["preset"] = preset
    return Workload(name, tier, {"shapes": shapes, "hyperparams": hyperparams}, seed=seed)


GPT2_TINY = _model_workload("gpt2-tiny", "cpu", gpt2_shapes(vocab=96, d=32, layers=1, positions=24),
                            seed=4, dim=32, n_heads=4, n_kv_heads=4)
GPT2_124M = _model_workload("gpt2-124m", "gpu", gpt2_shapes(vocab=50257, d=768, layers=12, positions=1024),
                            seed=4, dim=768, n_heads=12, n_kv_heads=12)
FUSED_QKV_TINY = _model_workload("fused-qkv-tiny", "cpu",
                                 fused_qkv_shapes(vocab=96, d=32, layers=2, heads=4, kv_heads=4, hidden=48),
                                 seed=5, dim=32, n_heads=4, n_kv_heads=4)
FUSED_QKV_GQA_TINY = _model_workload("fused-qkv-gqa-tiny", "cpu",
                                     fused_qkv_shapes(vocab=96, d=32, layers=2, heads=4, kv_heads=2, hidden=48),
                                     seed=6, dim=32, n_heads=4, n_kv_heads=2)
FUSED_QKV_470M = _model_workload("fused-qkv-470m", "gpu",
                                 fused_qkv_shapes(vocab=32000, d=1024, layers=24, heads=16, kv_heads=16, hidden=4096),
                                 seed=5, dim=1024, n_heads=16, n_kv_heads=16)
# The same models under the presets (op adam-mini-preset, against the pure-PyTorch reference).
GPT2_TINY_PRESET = _model_workload("gpt2-tiny", "cpu", GPT2_TINY.spec["shapes"], seed=4, preset="gpt2",
                                   dim=32, n_heads=4, n_kv_heads=4)
GPT2_124M_PRESET = _model_workload("gpt2-124m", "gpu", GPT2_124M.spec["shapes"], seed=4, preset="gpt2",
                                   dim=768, n_heads=12, n_kv_heads=12)
FUSED_QKV_TINY_PRESET = _model_workload("fused-qkv-tiny", "cpu", FUSED_QKV_TINY.spec["shapes"], seed=5,
                                        preset="fused-qkv", dim=32, n_heads=4, n_kv_heads=4)
FUSED_QKV_470M_PRESET = _model_workload("fused-qkv-470m", "gpu", FUSED_QKV_470M.spec["shapes"], seed=5,
                                        preset="fused-qkv", dim=1024, n_heads=16, n_kv_heads=16)
FUSED_QKV_GQA_TINY_PRESET = _model_workload("fused-qkv-gqa-tiny", "cpu", FUSED_QKV_GQA_TINY.spec["shapes"], seed=6,
                                            preset="fused-qkv", dim=32, n_heads=4, n_kv_heads=2)
