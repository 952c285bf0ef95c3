"""VeRA (Kopiczko et al., ICLR 2024): frozen random A, B shared by every weight one module spec
adapts, drawn from its ``seed``; per weight, trained vectors d (r) and b (out): Δh = b ⊙ B(d ⊙ A x),
L_t·(out + r) parameters. PEFT's `VeraConfig` is the same model (``projection_prng_key`` = seed)."""

from __future__ import annotations

from .base import Form, register
from .lora import SPACE_TARGETS, WEIGHTS


class VeRAForm(Form):
    name, title = "vera", "VeRA"
    keys = ("targets", "dropout", "seed")
    parallel_only = True
    composition, init = "add", "lora"          # b starts at 0: Δh = 0 (``init`` is not VeRA's to choose)
    dimensions = ("vera_rank", "lora_targets", "blocks")
    size_dimension = "vera_rank"
    zero_start_inits = ("lora",)

    def targets(self, position):
        return WEIGHTS[position]

    def default_targets(self, position):
        return ("q", "v") if position == "attn" else WEIGHTS["ffn"]

    def check(self, spec, where):
        from ...errors import ConfigError

        if not spec.targets:
            raise ConfigError(f"{where}.targets: VeRA needs at least one weight")

    def shared(self, spec):
        from ..modules import VeraBases

        return VeraBases(spec.size, spec.seed)

    def place(self, spec, at) -> None:
        from ..modules import VeRA

        for layer in at.covered:
            for target in spec.targets:
                sites = at.block.sites(target)
                for j, site in enumerate(sites):
                    fan_in, fan_out = at.features(layer, site)
                    key = f"{layer}_{target}" if len(sites) == 1 else f"{layer}_{target}_{j}"
                    vera = at.modules[key] = VeRA(spec, at.shared, fan_in, fan_out, at.causal)
                    at.edit(layer, site.path, "lora", vera, at.out_slice(layer, site))

    def spec_fields(self, site, values):
        targets = values["lora_targets"] if site == "attn" else "ffn"
        return {"size": int(values["vera_rank"]), "targets": SPACE_TARGETS[targets]}

    def space_values(self, spec):
        out = {"vera_rank": spec.size}
        if spec.position == "attn":
            out["lora_targets"] = next((k for k, t in SPACE_TARGETS.items() if t == spec.targets), None)
        return out

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
        return {"r": spec.size, "target_modules": target_modules, "projection_prng_key": spec.seed,
                "vera_dropout": spec.dropout, "d_initial": D_INITIAL, "save_projection": True}

    def peft_weights(self, module, layer, adapter="default"):
        import torch

        with torch.no_grad():                       # PEFT has no s: b carries it (Δh is linear in b)
            layer.vera_lambda_d[adapter].copy_(module.d)
            layer.vera_lambda_b[adapter].copy_(module.b * module.scale())


VERA = register(VeRAForm())
