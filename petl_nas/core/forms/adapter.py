"""The bottleneck adapter (Houlsby et al., 2019; He et al.'s parallel adapter): h + s·f(x W_down) W_up
at the attention output or the FFN output, sequential (reads h) or parallel (reads the sublayer's x)."""

from __future__ import annotations

from .base import Form, register


class Adapter(Form):
    name, title = "adapter", "adapter"
    keys = ("nonlinearity", "init", "dropout")
    dimensions = ("insertion", "composition", "bottleneck", "scale", "nonlinearity", "init", "blocks")
    size_dimension = "bottleneck"
    supernet_rank = 1
    zero_start_inits = ("lora",)  # W_up and its bias start at 0 (Compacter's t too)

    def layer(self, spec, at):
        from ..modules import Bottleneck

        return Bottleneck(spec, at.d, at.causal)

    def place(self, spec, at) -> None:
        (out_site,) = at.block.sites("o" if spec.position == "attn" else "ffn_out")
        shares_input = spec.insertion == "parallel" and not spec.dropout and at.shared is None
        for layer in at.covered:
            adapter = at.modules[str(layer)] = self.layer(spec, at)
            if spec.insertion == "parallel":
                at.read_sublayer_input(layer, spec.position)
                if shares_input:
                    at.share_read(layer, spec.position, adapter)
                at.edit(layer, out_site.path, "parallel", adapter, spec.position)
            else:
                at.edit(layer, out_site.path, "sequential", adapter)

    def spec_fields(self, site, values):
        return {
            "insertion": values["insertion"],
            "nonlinearity": values["nonlinearity"],
            "init": values["init"],
            "size": int(values["bottleneck"]),
        }

    def space_values(self, spec):
        return {"insertion": spec.insertion, "bottleneck": spec.size}

    def supernet_fields(self, site, space, gate):
        return {"insertion": "parallel", "init": "lora", **gate}

    def describe(self, spec):
        return [spec.insertion, spec.nonlinearity]

    def adapters_config(self, spec, hidden_size, leave_out, scaling, where, reasons):
        if spec.nonlinearity == "identity":
            reasons.append(f"{where}: identity nonlinearity")
        return {
            "architecture": "bottleneck",
            "mh_adapter": spec.position == "attn",
            "output_adapter": spec.position == "ffn",
            "reduction_factor": hidden_size / spec.size,
            "non_linearity": spec.nonlinearity,
            "is_parallel": spec.insertion == "parallel",
            "scaling": scaling,
            "use_gating": spec.gate,
            "init_weights": "mam_adapter" if spec.init == "lora" else "bert",
            "original_ln_before": True,
            "original_ln_after": True,
            "residual_before_ln": True,
            "leave_out": leave_out,
        }

    def peft_refusal(self, spec, where):
        return f"{where}: PEFT has no bottleneck adapters"


ADAPTER = register(Adapter())
