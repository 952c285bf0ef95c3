"""GPT-2: decoder-only, Conv1D projections (weights stored [in, out]) and a fused q/k/v ``c_attn``.

LoRA on q, k or v adapts its third of ``c_attn``'s output; the other slices are untouched.
"""

from . import BackboneSpec, Block, register

GPT2 = register(
    BackboneSpec(
        model_types=("gpt2",),
        blocks=(
            Block(
                "decoder",
                layers="h",
                attention="attn",
                q="attn.c_attn[0/3]",
                k="attn.c_attn[1/3]",
                v="attn.c_attn[2/3]",
                o="attn.c_proj",
                ffn_in=("mlp.c_fc",),
                ffn_out="mlp.c_proj",
                attn_norm="ln_1",
                ffn_norm="ln_2",
            ),
        ),
    )
)
