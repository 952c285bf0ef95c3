"""GPT-NeoX (Pythia, GPT-NeoX-20B): a decoder whose q, k and v are fused in
``attention.query_key_value`` *per head* (each head's q, k and v rows in turn), partial rotary
embeddings, and, in Pythia, attention and FFN side by side (parallel residual).

LoRA on q, k or v adapts that part of every head's rows of the fused weight; the rest is untouched.
PEFT can only adapt the fused weight whole, so such a LoRA does not export to PEFT (said by name).
"""

from . import BackboneSpec, Block, register

_QKV = "attention.query_key_value[{}/3 per num_attention_heads]"

GPT_NEOX = register(
    BackboneSpec(
        model_types=("gpt_neox",),
        blocks=(
            Block(
                "decoder",
                layers="layers",
                attention="attention",
                q=_QKV.format(0),
                k=_QKV.format(1),
                v=_QKV.format(2),
                o="attention.dense",
                ffn_in=("mlp.dense_h_to_4h",),
                ffn_out="mlp.dense_4h_to_h",
                attn_norm="input_layernorm",
                ffn_norm="post_attention_layernorm",
            ),
        ),
    )
)
