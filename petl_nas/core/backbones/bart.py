"""BART, mBART, M2M100 (NLLB), Marian and Pegasus: encoder self-, decoder self- and cross-attention
(N_attn = 3), two FFNs (N_ffn = 2).

mBART differs from BART only in where its LayerNorms sit, and M2M100 in its sinusoidal positions;
the module names are the same, and each scales its embeddings inside the embedding module, so a
soft prompt joins embeddings on the scale the tokens' are. Marian (the OPUS-MT translators) and
Pegasus have the same layout but scale token embeddings in the encoder's forward, only when given
ids: their spec says so, and a prompted input's tokens get that scale when petl-nas embeds them.
"""

from . import BackboneSpec, Block, register


def _attention(name: str, layers: str, module: str, heads: str, ffn: bool) -> Block:
    return Block(
        name,
        layers=layers,
        attention=module,
        q=f"{module}.q_proj",
        k=f"{module}.k_proj",
        v=f"{module}.v_proj",
        o=f"{module}.out_proj",
        ffn_in=("fc1",) if ffn else (),
        ffn_out="fc2" if ffn else None,
        heads=heads,
        attn_norm=f"{module}_layer_norm",
        ffn_norm="final_layer_norm" if ffn else None,
    )


BART = register(
    BackboneSpec(
        model_types=("bart", "mbart", "m2m_100"),
        blocks=(
            _attention("encoder", "encoder.layers", "self_attn", "encoder_attention_heads", ffn=True),
            _attention("decoder", "decoder.layers", "self_attn", "decoder_attention_heads", ffn=True),
            _attention("cross", "decoder.layers", "encoder_attn", "decoder_attention_heads", ffn=False),
        ),
    )
)

MARIAN = register(BackboneSpec(model_types=("marian", "pegasus"), blocks=BART.blocks, scales_ids_in_stack=True))
