"""MPNet (``mpnet``; all-mpnet-base-v2 and the other sentence-transformers MPNet checkpoints).

BERT's layer layout with its own names (``attention.attn.{q,k,v,o}``) and a relative position
bias added to the attention scores in its own code instead of through transformers' attention
interface: the head-attention forms (prefix, multi-head adapter) have nothing to attach to, so
``attention=None`` makes them a `ConfigError` here, as on DeBERTa. Adapters, LoRA, Compacter,
BitFit and prompt tuning apply as on BERT.
"""

from . import BackboneSpec, Block, register

MPNET = register(
    BackboneSpec(
        model_types=("mpnet",),
        blocks=(
            Block(
                "encoder",
                layers="encoder.layer",
                attention=None,
                q="attention.attn.q",
                k="attention.attn.k",
                v="attention.attn.v",
                o="attention.attn.o",
                ffn_in=("intermediate.dense",),
                ffn_out="output.dense",
                attn_norm="attention.LayerNorm",
                ffn_norm="output.LayerNorm",
            ),
        ),
    )
)
