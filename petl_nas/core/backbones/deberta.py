"""DeBERTa v2 and v3 (``deberta-v2``): BERT's layer layout with disentangled attention.

Its attention adds content-to-position and position-to-content terms in its own code instead of
calling transformers' attention interface, so the head-attention forms (prefix, multi-head
adapter) have nothing to attach to: ``attention=None`` makes them a `ConfigError` here. Adapters,
LoRA, Compacter, BitFit and prompt tuning apply as on BERT.
"""

from . import BackboneSpec, Block, register

DEBERTA_V2 = register(
    BackboneSpec(
        model_types=("deberta-v2",),
        blocks=(
            Block(
                "encoder",
                layers="encoder.layer",
                attention=None,
                q="attention.self.query_proj",
                k="attention.self.key_proj",
                v="attention.self.value_proj",
                o="attention.output.dense",
                ffn_in=("intermediate.dense",),
                ffn_out="output.dense",
                attn_norm="attention.output.LayerNorm",
                ffn_norm="output.LayerNorm",
            ),
        ),
    )
)
