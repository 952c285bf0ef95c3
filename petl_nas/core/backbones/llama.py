"""Llama-family decoders: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (text), OLMo, OLMo 2,
StableLM, Granite and SmolLM3.

They share module names: grouped-query attention (``self_attn.{q,k,v,o}_proj``) and a gated FFN
(W1 is the gate and up projections, W2 the down projection). Prefix keys/values are per key/value
head (the attention function shares them across each group of query heads, as it shares the token
keys). Qwen3, Gemma 3 and OLMo 2 normalise q and k before the rotary embedding (OLMo 2 over the
whole projection): the prefix's keys are learned as the attention sees them, so they take neither.
StableLM rotates only part of each head; Granite passes its attention multiplier to the attention
function as the q·k scale, which the prefix's columns share. Gemma 2 soft-caps its attention
logits, which SDPA cannot do: prefix and multi-head adapters are refused there (`head_attention`).
"""

from . import BackboneSpec, Block, register

LLAMA = register(
    BackboneSpec(
        model_types=(
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo",
            "olmo2",
            "stablelm",
            "granite",
            "smollm3",
        ),
        blocks=(
            Block(
                "decoder",
                layers="layers",
                attention="self_attn",
                q="self_attn.q_proj",
                k="self_attn.k_proj",
                v="self_attn.v_proj",
                o="self_attn.o_proj",
                ffn_in=("mlp.gate_proj", "mlp.up_proj"),
                ffn_out="mlp.down_proj",
            ),
        ),
    )
)
