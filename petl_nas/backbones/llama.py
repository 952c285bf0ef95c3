"""Llama-family decoders (Llama, Mistral, Qwen2): grouped-query attention and a gated (SwiGLU) FFN.

Prefix keys/values are per key/value head (the attention function shares them across each group of
query heads, as it shares the token keys); W1 is the gate and up projections, W2 the down projection.
"""

from . import BackboneSpec, Block, register

LLAMA = register(BackboneSpec(
    model_types=("llama", "mistral", "qwen2"),
    blocks=(Block(
        "decoder", layers="layers", attention="self_attn",
        q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
        ffn_in=("mlp.gate_proj", "mlp.up_proj"), ffn_out="mlp.down_proj"),),
))
