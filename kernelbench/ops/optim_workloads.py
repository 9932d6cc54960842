"""Parameter sets shared by the optimizer ops (ANCHORS.md's workloads, and small CPU versions)."""

from __future__ import annotations

from .base import Workload

Shapes = list[tuple[str, tuple[int, ...]]]


def model_370m_shapes(vocab: int = 32000, d: int = 1024, layers: int = 24) -> Shapes:
    """ANCHORS.md's model-370m: 367,576,064 fp32 params in 147 tensors at the default sizes."""
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
