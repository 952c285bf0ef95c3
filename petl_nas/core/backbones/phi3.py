"""Phi-3 (and Phi-3.5, Phi-4-mini): a Llama-like decoder with q, k and v fused in ``qkv_proj`` and
the gate and up projections fused in ``gate_up_proj``.

Under grouped-query attention the q, k and v slices of ``qkv_proj`` are unequal: they are split in
the ratio of the config's head counts. LoRA on q, k or v adapts its slice; on ``ffn_in`` it adapts
``gate_up_proj`` whole (both halves, as on Llama's two W1 matrices).
"""

from . import BackboneSpec, Block, register

_QKV = "self_attn.qkv_proj[{}/num_attention_heads+num_key_value_heads+num_key_value_heads]"

PHI3 = register(
    BackboneSpec(
        model_types=("phi3",),
        blocks=(
            Block(
                "decoder",
                layers="layers",
                attention="self_attn",
                q=_QKV.format(0),
                k=_QKV.format(1),
                v=_QKV.format(2),
                o="self_attn.o_proj",
                ffn_in=("mlp.gate_up_proj",),
                ffn_out="mlp.down_proj",
                attn_norm="input_layernorm",
                ffn_norm="post_attention_layernorm",
            ),
        ),
    )
)
