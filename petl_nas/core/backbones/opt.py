"""OPT: a decoder-only model with BART's decoder names (``self_attn.{q,k,v,out}_proj``, ``fc1``,
``fc2`` on the layer itself) and learned positions counted from the attention mask.

OPT-350m embeds at ``word_embed_proj_dim`` (512) and projects up to its hidden size (1024): a soft
prompt joins the embeddings, so it has the embedding width, as on ELECTRA.
"""

from . import BackboneSpec, Block, register

OPT = register(
    BackboneSpec(
        model_types=("opt",),
        blocks=(
            Block(
                "decoder",
                layers="decoder.layers",
                attention="self_attn",
                q="self_attn.q_proj",
                k="self_attn.k_proj",
                v="self_attn.v_proj",
                o="self_attn.out_proj",
                ffn_in=("fc1",),
                ffn_out="fc2",
                attn_norm="self_attn_layer_norm",
                ffn_norm="final_layer_norm",
            ),
        ),
    )
)
