"""Phi-1, Phi-1.5 and Phi-2 (``phi``): a decoder whose attention and FFN read the same LayerNorm
output side by side (a parallel block), with partial rotary embeddings, biases everywhere, the
attention output in ``self_attn.dense`` and a plain FFN (``mlp.fc1``, ``mlp.fc2``). Phi-3 and later
are another family (`phi3.py`).
"""

from . import BackboneSpec, Block, register

PHI = register(
    BackboneSpec(
        model_types=("phi",),
        blocks=(
            Block(
                "decoder",
                layers="layers",
                attention="self_attn",
                q="self_attn.q_proj",
                k="self_attn.k_proj",
                v="self_attn.v_proj",
                o="self_attn.dense",
                ffn_in=("mlp.fc1",),
                ffn_out="mlp.fc2",
            ),
        ),
    )
)
