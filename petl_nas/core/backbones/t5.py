"""T5 and mT5: three attention kinds; T5 v1.1 / mT5 have a gated-GELU FFN (W1 = wi_0 and wi_1).

An encoder block is [self-attention, FFN]; a decoder block is [self-attention, cross-attention, FFN].
T5 does not scale q·k by 1/sqrt(d) and adds a relative position bias; the attention function
receives both (``scaling=1.0``, ``position_bias``), and prefix keys get no position bias.
"""

from . import BackboneSpec, Block, register


def _blocks(w1: tuple[str, ...]) -> tuple[Block, ...]:
    def block(name, layers, module, ffn_index=None):
        att = f"layer.{module}"
        ffn = f"layer.{ffn_index}.DenseReluDense" if ffn_index is not None else None
        return Block(
            name,
            layers=layers,
            attention=att,
            q=f"{att}.q",
            k=f"{att}.k",
            v=f"{att}.v",
            o=f"{att}.o",
            ffn_in=tuple(f"{ffn}.{w}" for w in w1) if ffn else (),
            ffn_out=f"{ffn}.wo" if ffn else None,
            heads="num_heads",
            attn_norm=f"layer.{module.split('.')[0]}.layer_norm",
            ffn_norm=f"layer.{ffn_index}.layer_norm" if ffn else None,
        )

    return (
        block("encoder", "encoder.block", "0.SelfAttention", 1),
        block("decoder", "decoder.block", "0.SelfAttention", 2),
        block("cross", "decoder.block", "1.EncDecAttention"),
    )


T5_GATED = register(
    BackboneSpec(model_types=("t5", "mt5"), blocks=_blocks(("wi_0", "wi_1")), when=lambda config: config.is_gated_act)
)
T5 = register(BackboneSpec(model_types=("t5", "mt5"), blocks=_blocks(("wi",))))
