"""FourierFT (Gao et al., ICML 2024): per adapted weight, n trained spectral coefficients at fixed
random frequencies drawn from the spec's ``seed``; ΔW = s·real(ifft2(S)), n·L_t parameters. PEFT's
`FourierFTConfig` is the same model (``random_loc_seed`` = seed, ``scaling`` = s)."""

from __future__ import annotations

from .base import register
from .weights import WeightUpdate

# s where the space places it: the paper's RoBERTa-base SST-2 value (Table 9; 29 to 141 across GLUE,
# PEFT's default 150), as the `fourierft` preset; at zero start it is a rate (`Form.scale_is_a_rate`).
PAPER_SCALE = 140.0


class FourierFTForm(WeightUpdate):
    name, title = "fourierft", "FourierFT"
    keys = ("targets", "init", "seed")
    composition, init = "scaled", "bert"  # PEFT's default: N(0, 1) coefficients (init_weights false)
    size_letter = "n"
    dimensions = ("frequencies", "lora_targets", "init", "blocks")
    size_dimension = "frequencies"
    zero_start_inits = ("lora",)  # init: lora is PEFT's init_weights: true (ΔW = 0)

    def place(self, spec, at) -> None:
        from ..modules import FourierFT

        for layer, _, site, key in self.weights(spec, at):
            module = at.modules[key] = FourierFT(spec, *at.features(layer, site), at.causal)
            at.edit(layer, site.path, "lora", module, at.out_slice(layer, site))

    def spec_fields(self, site, values):
        return {
            "size": int(values["frequencies"]),
            "targets": self.space_targets(site, values),
            "init": values["init"],
            "composition": "scaled",
            "scale": PAPER_SCALE,
        }

    def space_values(self, spec):
        return {"frequencies": spec.size, **self.targets_value(spec)}

    def describe(self, spec):
        return [
            "on " + ",".join(spec.targets),
            *(["zero start"] if spec.init == "lora" else []),
            *([f"seed {spec.seed}"] if spec.seed else []),
        ]

    # ---- HF PEFT: `FourierFTConfig` ------------------------------------------------------------
    peft_type = "FOURIERFT"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        return {
            "n_frequency": spec.size,
            "target_modules": target_modules,
            "random_loc_seed": spec.seed,
            "scaling": spec.scale if spec.composition == "scaled" else 1.0,
            "init_weights": spec.init == "lora",
        }

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():  # a learned s folds into the coefficients
            layer.fourierft_spectrum[adapter].copy_(module.spectrum * (module.scale() / module.peft_scaling))


FOURIERFT = register(FourierFTForm())
