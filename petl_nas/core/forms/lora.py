"""LoRA (Hu et al., 2021): a low-rank update s·x A B beside each targeted weight (q, k, v, o of the
attention; W1, W2 of the FFN), reading that weight's own input; with ``dora: true``, DoRA (Liu et
al., 2024): the same update plus a trained magnitude per output row of W + s·B·A. DoRA's rate is
LoRA's (one family): PEFT and the paper train A, B and the magnitudes at one rate."""

from __future__ import annotations

from .base import register
from .weights import WeightUpdate


class LoRAForm(WeightUpdate):
    name, title = "lora", "LoRA"
    keys = ("targets", "init", "dropout", "dora")
    composition, init = "scaled", "lora"
    dimensions = ("composition", "rank", "scale", "lora_targets", "dora", "blocks")
    size_dimension = "rank"
    supernet_rank = 0
    sums_by_size = True  # no bias, r·(in + out) per weight: linear in r
    zero_start_inits = ("lora",)  # B starts at 0

    def sums(self, spec):
        return not spec.dora  # each DoRA rescales its own W + s·B·A

    def place(self, spec, at) -> None:
        from ..modules import DoRA, LoRA

        for layer, target, site, key in self.weights(spec, at):
            if spec.dora:
                lora = at.modules[key] = DoRA(spec, at.weight(layer, site), at.causal)
            else:
                lora = at.modules[key] = LoRA(spec, *at.features(layer, site), at.causal)
            at.edit(layer, site.path, "weight" if spec.dora else "lora", lora, at.out_slice(layer, site))
            source = at.input_source(target)
            if source is not None and not spec.dropout:
                at.share_read(layer, source, lora)

    def spec_fields(self, site, values):
        return {
            "size": int(values["rank"]),
            "targets": self.space_targets(site, values),
            "dora": bool(values.get("dora", False)),
        }

    def space_values(self, spec):
        return {"rank": spec.size, "dora": spec.dora, **self.targets_value(spec)}

    def supernet_fields(self, site, space, gate):
        return {"targets": space.targets(site), **gate}

    def describe(self, spec):
        return ["on " + ",".join(spec.targets)] + (["DoRA"] if spec.dora else [])

    def short_words(self, spec):
        return [",".join(spec.targets)] + (["DoRA"] if spec.dora else [])

    def adapters_config(self, spec, hidden_size, leave_out, scaling, where, reasons):
        attn = [t for t in spec.targets if t in ("q", "k", "v")]
        if "o" in spec.targets:
            reasons.append(f"{where}: LoRA on the attention output weight o")
        if spec.learn_scale:
            reasons.append(f"{where}: learned LoRA scale")
        if spec.dora:
            reasons.append(f"{where}: DoRA")
        return {
            "architecture": "lora",
            "selfattn_lora": bool(attn),
            "attn_matrices": attn,
            "intermediate_lora": "ffn_in" in spec.targets,
            "output_lora": "ffn_out" in spec.targets,
            "r": spec.size,
            "alpha": spec.size * (spec.scale if spec.composition == "scaled" else 1.0),
            "use_gating": spec.gate,
            "composition_mode": "add",
            "dropout": spec.dropout,
            "leave_out": leave_out,
        }

    # ---- HF PEFT's LoRA: the same update, s = lora_alpha / r -----------------------------------
    peft_type = "LORA"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        alpha = spec.size * (spec.scale if spec.composition == "scaled" else 1.0)
        return {
            "r": spec.size,
            "lora_alpha": alpha,
            "lora_dropout": spec.dropout,
            "target_modules": target_modules,
            "use_dora": spec.dora,
            "bias": "none",
            "fan_in_fan_out": False,
        }  # `deploy.interop` sets both where the run needs it

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():
            layer.lora_A[adapter].weight.copy_(module.A)
            layer.lora_B[adapter].weight.copy_(module.B)
            if hasattr(module, "magnitude"):
                layer.lora_magnitude_vector[adapter].weight.copy_(module.magnitude)


LORA = register(LoRAForm())
