"""LoKr (LyCORIS; PEFT's ``LoKrConfig``): a Kronecker-product update s·(W₁ ⊗ W₂) beside each
targeted weight, W₂ of rank r, shapes from PEFT's factorisation (``decompose_factor=-1``), s = alpha/r.
It reads each weight's own input, as LoRA does, and takes LoRA's targets."""

from __future__ import annotations

from .base import register
from .weights import WeightUpdate


class LoKrForm(WeightUpdate):
    name, title = "lokr", "LoKr"
    keys = ("targets", "init")
    composition, init = "scaled", "lora"
    dimensions = ("composition", "rank", "scale", "lora_targets", "blocks")
    size_dimension = "rank"
    zero_start_inits = ("lora",)  # W₁ starts at 0

    def place(self, spec, at) -> None:
        from ..modules import LoKr

        for layer, _, site, key in self.weights(spec, at):
            at.modules[key] = LoKr(spec, *at.features(layer, site), at.causal)
            at.edit(layer, site.path, "lora", at.modules[key], at.out_slice(layer, site))

    def spec_fields(self, site, values):
        return {"size": int(values["rank"]), "targets": self.space_targets(site, values)}

    def space_values(self, spec):
        return {"rank": spec.size, **self.targets_value(spec)}

    def describe(self, spec):
        return ["on " + ",".join(spec.targets)]

    def peft_refusal(self, spec, where):
        if spec.gate:
            return f"{where}: PEFT's LoKr has no gate"
        if spec.learn_scale:
            return f"{where}: PEFT's LoKr has no learned scale"
        return None

    peft_type = "LOKR"

    def peft_fields(self, spec, target_modules):
        alpha = spec.size * (spec.scale if spec.composition == "scaled" else 1.0)
        return {
            "target_modules": target_modules,
            "r": spec.size,
            "alpha": alpha,
            "decompose_both": False,
            "decompose_factor": -1,
            "rank_dropout": 0.0,
            "module_dropout": 0.0,
        }

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():
            layer.lokr_w1[adapter].copy_(module.W1)
            if module.low_rank:
                layer.lokr_w2_a[adapter].copy_(module.W2_a)
                layer.lokr_w2_b[adapter].copy_(module.W2_b)
            else:
                layer.lokr_w2[adapter].copy_(module.W2)


LOKR = register(LoKrForm())
