"""FourierFT (Gao et al., ICML 2024): per adapted weight, n trained spectral coefficients at fixed
random frequencies drawn from the spec's ``seed``; ΔW = s·real(ifft2(S)), n·L_t parameters. PEFT's
`FourierFTConfig` is the same model (``random_loc_seed`` = seed, ``scaling`` = s)."""

from __future__ import annotations

from .base import Form, register
from .lora import SPACE_TARGETS, WEIGHTS

# s where the space places it: the paper's RoBERTa-base SST-2 value (Table 9; 29 to 141 across GLUE,
# PEFT's default 150), as the `fourierft` preset; at zero start it is a rate (`Form.scale_is_a_rate`).
PAPER_SCALE = 140.0


class FourierFTForm(Form):
    name, title = "fourierft", "FourierFT"
    keys = ("targets", "init", "seed")
    parallel_only = True
    composition, init = "scaled", "bert"       # PEFT's default: N(0, 1) coefficients (init_weights false)
    size_letter = "n"
    dimensions = ("frequencies", "lora_targets", "init", "blocks")
    size_dimension = "frequencies"
    zero_start_inits = ("lora",)               # init: lora is PEFT's init_weights: true (ΔW = 0)

    def targets(self, position):
        return WEIGHTS[position]

    def default_targets(self, position):
        return ("q", "v") if position == "attn" else WEIGHTS["ffn"]

    def check(self, spec, where):
        from ...errors import ConfigError

        if not spec.targets:
            raise ConfigError(f"{where}.targets: FourierFT needs at least one weight")

    def place(self, spec, at) -> None:
        from ..modules import FourierFT

        for layer in at.covered:
            for target in spec.targets:
                sites = at.block.sites(target)
                for j, site in enumerate(sites):
                    fan_in, fan_out = at.features(layer, site)
                    key = f"{layer}_{target}" if len(sites) == 1 else f"{layer}_{target}_{j}"
                    module = at.modules[key] = FourierFT(spec, fan_in, fan_out, at.causal)
                    at.edit(layer, site.path, "lora", module, at.out_slice(layer, site))

    def spec_fields(self, site, values):
        targets = values["lora_targets"] if site == "attn" else "ffn"
        return {"size": int(values["frequencies"]), "targets": SPACE_TARGETS[targets], "init": values["init"],
                "composition": "scaled", "scale": PAPER_SCALE}

    def space_values(self, spec):
        out = {"frequencies": spec.size}
        if spec.position == "attn":
            out["lora_targets"] = next((k for k, t in SPACE_TARGETS.items() if t == spec.targets), None)
        return out

    def describe(self, spec):
        return ["on " + ",".join(spec.targets), *(["zero start"] if spec.init == "lora" else []),
                *([f"seed {spec.seed}"] if spec.seed else [])]

    # ---- HF PEFT: `FourierFTConfig` ------------------------------------------------------------
    peft_type = "FOURIERFT"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        return {"n_frequency": spec.size, "target_modules": target_modules, "random_loc_seed": spec.seed,
                "scaling": spec.scale if spec.composition == "scaled" else 1.0, "init_weights": spec.init == "lora"}

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():                       # a learned s folds into the coefficients
            layer.fourierft_spectrum[adapter].copy_(module.spectrum * (module.scale() / module.peft_scaling))


FOURIERFT = register(FourierFTForm())
