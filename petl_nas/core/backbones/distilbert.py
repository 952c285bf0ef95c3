"""DistilBERT: a 6-layer BERT with its own module names."""

from . import BackboneSpec, Block, register

DISTILBERT = register(
    BackboneSpec(
        model_types=("distilbert",),
        blocks=(
            Block(
                "encoder",
                layers="transformer.layer",
                attention="attention",
                q="attention.q_lin",
                k="attention.k_lin",
                v="attention.v_lin",
                o="attention.out_lin",
                ffn_in=("ffn.lin1",),
                ffn_out="ffn.lin2",
                heads="n_heads",
                attn_norm="sa_layer_norm",
                ffn_norm="output_layer_norm",
            ),
        ),
    )
)
