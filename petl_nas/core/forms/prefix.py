"""Prefix tuning (Li & Liang, 2021; He et al.'s gated view): l learned key and value vectors per
layer joined to the attention's own, reparameterised by an MLP while training (or flat)."""

from __future__ import annotations

import functools

from .base import Form, register


class Prefix(Form):
    name, title = "prefix", "prefix"
    keys = ("reparam",)
    positions = ("attn",)
    parallel_only = head_attention = gated_composition = True
    composition = "gated"
    size_letter = "l"
    dimensions = ("prefix_composition", "length", "scale", "prefix_reparam", "blocks")
    size_dimension = "length"
    supernet_rank = 3

    def place(self, spec, at) -> None:
        from ..modules import Composition, PrefixEncoder

        encoder = at.modules["encoder"] = PrefixEncoder(
            len(at.covered), at.kv_heads, at.head_dim, spec.size, spec.reparam, at.d, flat=at.flat_prefix
        )
        # UniPELT's prefix gate (per example) reads the sublayer input x (width d); the per-token
        # gate reads the projected query (width H·D).
        reads_x = spec.gate and spec.gate_per == "example" and not at.causal and spec.composition == "gated"
        for slot, layer in enumerate(at.covered):
            composition = None
            if spec.gate or spec.composition == "scaled":
                composition = at.modules[str(layer)] = Composition(
                    spec, at.d if reads_x else at.heads * at.head_dim, at.causal
                )
            edits = at.head_edits(layer)
            edits.prefix, edits.prefix_index = encoder, slot
            edits.prefix_composition, edits.prefix_compose = spec.composition, composition
            if reads_x:
                at.read_sublayer_input(layer, "attn")
                at.share_read(layer, "attn", composition.gate)
                edits.sublayer_input = functools.partial(at.root.input_of, (at.block_name, layer, "attn"))

    def spec_fields(self, site, values):
        return {"size": int(values["length"]), "reparam": int(values["prefix_reparam"])}

    def space_values(self, spec):
        return {"prefix_composition": spec.composition, "length": spec.size, "prefix_reparam": spec.reparam}

    def supernet_fields(self, site, space, gate):
        return {"reparam": space.smallest("prefix_reparam"), "composition": "gated"}  # its positions are gated instead

    def describe(self, spec):
        parts = [f"MLP {spec.reparam}" if spec.reparam else "flat"]
        if spec.composition != "scaled":
            parts.append("λ-gated" if spec.composition == "gated" else "add")
        return parts

    def adapters_config(self, spec, hidden_size, leave_out, scaling, where, reasons):
        if spec.composition != "gated":
            reasons.append(
                f"{where}: {spec.composition} composition (AdapterHub's prefix is the "
                f"concatenation, He et al.'s gated form)"
            )
        return {
            "architecture": "prefix_tuning",
            "prefix_length": spec.size,
            "flat": spec.reparam == 0,
            "bottleneck_size": spec.reparam or 512,
            "non_linearity": "tanh",
            "use_gating": spec.gate,
            "shared_gating": True,
            "leave_out": leave_out,
        }

    peft_type = "PREFIX_TUNING"  # not this prefix on any backbone: `deploy.interop` says why, knowing it

    def peft_refusal(self, spec, where):
        return None


PREFIX = register(Prefix())
