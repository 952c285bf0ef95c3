"""ModernBERT: a pre-norm encoder with rotary positions, alternating global and sliding-window
attention, a fused q/k/v ``Wqkv`` and a gated FFN whose ``Wi`` computes both halves of W1.

LoRA on q, k or v adapts its third of ``Wqkv``'s output; on ``ffn_in`` it adapts ``Wi`` whole (both
halves, as on Llama's two W1 matrices). The sliding windows reach the attention function as its
mask, so a prefix is visible from every position of every layer. Its projections and LayerNorms
have no biases by default: BitFit there is a `ConfigError`.
"""

from . import BackboneSpec, Block, register

MODERNBERT = register(
    BackboneSpec(
        model_types=("modernbert",),
        blocks=(
            Block(
                "encoder",
                layers="layers",
                attention="attn",
                q="attn.Wqkv[0/3]",
                k="attn.Wqkv[1/3]",
                v="attn.Wqkv[2/3]",
                o="attn.Wo",
                ffn_in=("mlp.Wi",),
                ffn_out="mlp.Wo",
                attn_norm="attn_norm",
                ffn_norm="mlp_norm",
            ),
        ),
    )
)
