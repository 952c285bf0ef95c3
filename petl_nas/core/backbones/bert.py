"""BERT-family encoders: BERT, RoBERTa, XLM-R, ELECTRA, CamemBERT (same module names in transformers 5)."""

from . import BackboneSpec, Block, register

BERT = register(
    BackboneSpec(
        model_types=("bert", "roberta", "xlm-roberta", "camembert", "electra"),
        blocks=(
            Block(
                "encoder",
                layers="encoder.layer",
                attention="attention.self",
                q="attention.self.query",
                k="attention.self.key",
                v="attention.self.value",
                o="attention.output.dense",
                ffn_in=("intermediate.dense",),
                ffn_out="output.dense",
                attn_norm="attention.output.LayerNorm",
                ffn_norm="output.LayerNorm",
            ),
        ),
    )
)
