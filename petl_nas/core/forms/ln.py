"""LN-tuning (Qi et al., 2022): the γ and β of chosen LayerNorms trained, nothing added, as PEFT's
``LNTuningConfig`` does it: a trained copy of each targeted norm computes its output in its place
(so switching PETL off gives the backbone's own back). At ``attn`` it is the norm that belongs to
the attention sublayer, at ``ffn`` the FFN's, per layer: 2·d per norm with a bias (d without), as
the backbone spec names them (``attn_norm``, ``ffn_norm``); a spec that does not say is refused.
A norm without parameters (ModernBERT's first attention norm) has nothing to tune and is skipped.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Form, register
from .ia3 import check_plain

NORMS = {"attn": "attn_norm", "ffn": "ffn_norm"}


class LNForm(Form):
    name, title = "ln", "LN"
    keys = ("targets",)
    sized = False  # as wide as the norm it copies
    takes_gate = False
    dimensions = ("blocks",)

    def targets(self, position):
        return (NORMS[position],)

    def default_targets(self, position):
        return self.targets(position)

    def check(self, spec, where):
        check_plain(self, spec, where)

    def place(self, spec, at) -> None:
        from ..modules import NormCopy

        if at.root.config.train_layernorms:
            raise ConfigError("ln: train_layernorms already trains every LayerNorm in place; use one of the two")
        for target in spec.targets:
            if getattr(at.block, target) is None:
                raise ConfigError(
                    f"ln: the {at.model_config.model_type} backbone spec does not say which norm "
                    f"belongs to the {at.block_name} block's {spec.position} sublayer ({target})"
                )
        for layer in at.covered:
            for target in spec.targets:
                (site,) = at.block.sites(target)
                norm = at.linear(layer, site)
                if not any(True for _ in norm.parameters()):
                    continue  # nn.Identity: nothing to tune
                at.modules[f"{layer}_{target}"] = NormCopy(norm)
                at.edit(layer, site.path, "replace", at.modules[f"{layer}_{target}"])

    def spec_fields(self, site, values):
        return {"targets": self.default_targets(site)}

    # ---- PEFT: LNTuningConfig -----------------------------------------------------------------
    peft_type = "LN_TUNING"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        return {"target_modules": target_modules}

    def peft_weights(self, module, layer, adapter="default"):
        layer.ln_tuning_layers[adapter].load_state_dict(module.norm.state_dict())


LN = register(LNForm())
