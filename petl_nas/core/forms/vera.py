"""VeRA (Kopiczko et al., ICLR 2024): frozen random A, B shared by every weight one module spec
adapts, drawn from its ``seed``; per weight, trained vectors d (r) and b (out): Δh = b ⊙ B(d ⊙ A x),
L_t·(out + r) parameters. PEFT's `VeraConfig` is the same model (``projection_prng_key`` = seed)."""

from __future__ import annotations

from .base import register
from .weights import WeightUpdate


class VeRAForm(WeightUpdate):
    name, title = "vera", "VeRA"
    keys = ("targets", "dropout", "seed")
    composition, init = "add", "lora"  # b starts at 0: Δh = 0 (``init`` is not VeRA's to choose)
    dimensions = ("vera_rank", "lora_targets", "blocks")
    size_dimension = "vera_rank"
    zero_start_inits = ("lora",)

    def shared(self, spec):
        from ..modules import VeraBases

        return VeraBases(spec.size, spec.seed)

    def place(self, spec, at) -> None:
        from ..modules import VeRA

        for layer, _, site, key in self.weights(spec, at):
            vera = at.modules[key] = VeRA(spec, at.shared, *at.features(layer, site), at.causal)
            at.edit(layer, site.path, "lora", vera, at.out_slice(layer, site))

    def spec_fields(self, site, values):
        return {"size": int(values["vera_rank"]), "targets": self.space_targets(site, values)}

    def space_values(self, spec):
        return {"vera_rank": spec.size, **self.targets_value(spec)}

    def describe(self, spec):
        return ["on " + ",".join(spec.targets), *([f"seed {spec.seed}"] if spec.seed else [])]

    # ---- HF PEFT: `VeraConfig` -----------------------------------------------------------------
    peft_type = "VERA"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        from ..modules.vera import D_INITIAL

        # PEFT saves the projections beside d and b by default (save_projection): drawn from the
        # same seed, they are the ones this model uses, and the adapter loads without relying on it.
        return {
            "r": spec.size,
            "target_modules": target_modules,
            "projection_prng_key": spec.seed,
            "vera_dropout": spec.dropout,
            "d_initial": D_INITIAL,
            "save_projection": True,
        }

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():  # PEFT has no s: b carries it (Δh is linear in b)
            layer.vera_lambda_d[adapter].copy_(module.d)
            layer.vera_lambda_b[adapter].copy_(module.b * module.scale())


VERA = register(VeRAForm())
