"""The multi-head parallel adapter (He et al., 2022): l learned positions in each head's attention,
a prefix whose keys and values are plain parameters composed by addition, read from x."""

from __future__ import annotations

from .base import Form, register


class MultiHeadAdapterForm(Form):
    name, title = "mh_adapter", "MH adapter"
    positions = ("attn",)
    parallel_only = head_attention = True
    size_letter = "l"
    dimensions = ("composition", "length", "scale", "blocks")
    size_dimension = "length"
    supernet_rank = 4

    def place(self, spec, at) -> None:
        from ..modules import MultiHeadAdapter

        for layer in at.covered:
            at.head_edits(layer).mh = at.modules[str(layer)] = MultiHeadAdapter(spec, at.heads, at.head_dim, at.causal)

    def spec_fields(self, site, values):
        return {"size": int(values["length"])}

    def space_values(self, spec):
        return {"length": spec.size}

    def supernet_fields(self, site, space, gate):
        return {"insertion": "parallel", "composition": "add", **gate}

    def adapters_config(self, spec, hidden_size, leave_out, scaling, where, reasons):
        reasons.append(f"{where}: the multi-head parallel adapter")
        return None

    def peft_refusal(self, spec, where):
        return f"{where}: PEFT has no multi-head adapters"


MH_ADAPTER = register(MultiHeadAdapterForm())
