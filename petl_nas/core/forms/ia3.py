"""(IA)³ (Liu et al., 2022, T-Few): learned vectors that rescale what the attention and the FFN
compute, as PEFT's ``IA3Config`` places them: at ``attn`` the outputs of the named projections
(keys and values by default), at ``ffn`` the input of W2 (the FFN's activations, PEFT's
``feedforward_modules``). Every vector starts at one, so the model is unchanged at the start; a
module adds one trained number per scaled feature, L·(d_k + d_v + d_ff) on an encoder.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Form, register

WEIGHTS = {"attn": ("q", "k", "v", "o"), "ffn": ("ffn_out",)}


def check_plain(form: Form, spec, where: str) -> None:
    """Refuse what a rescaling or renormalising form has no use for: a gate, a scale, a size, an insertion."""
    if spec.gate:
        raise ConfigError(f"{where}.gate: {form.name} has no gate (it rescales, it adds no update to gate)")
    if spec.composition != "add" or spec.learn_scale:
        raise ConfigError(f"{where}.composition: {form.name} takes only 'add' (its vectors are its scale)")
    if spec.size != type(spec).__dataclass_fields__["size"].default:  # one design, one spelling
        raise ConfigError(f"{where}.size: {form.name} does not use it (as wide as what it edits)")
    if spec.insertion != "parallel":
        raise ConfigError(f"{where}.insertion: {form.name} edits the weights it names; leave insertion out")


class IA3Form(Form):
    name, title = "ia3", "IA3"
    keys = ("targets",)
    sized = False  # a vector is as wide as what it scales
    takes_gate = False
    dimensions = ("blocks",)  # where it goes: the slot's site, the layers, the blocks

    def targets(self, position):
        return WEIGHTS[position]

    def default_targets(self, position):
        return ("k", "v") if position == "attn" else WEIGHTS["ffn"]

    def check(self, spec, where):
        check_plain(self, spec, where)
        if not spec.targets:
            raise ConfigError(f"{where}.targets: IA3 needs at least one weight")

    def place(self, spec, at) -> None:
        from ..modules import ScaleInput, ScaleOutput

        for layer in at.covered:
            for target in spec.targets:
                sites = at.block.sites(target)
                for j, site in enumerate(sites):
                    fan_in, fan_out = at.features(layer, site)
                    key = f"{layer}_{target}" if len(sites) == 1 else f"{layer}_{target}_{j}"
                    if target == "ffn_out":  # the activations W2 reads
                        at.modules[key] = ScaleInput(fan_in)
                        at.edit(layer, site.path, "input", at.modules[key])
                    else:
                        at.modules[key] = ScaleOutput(fan_out, at.out_slice(layer, site))
                        at.edit(layer, site.path, "sequential", at.modules[key])

    def spec_fields(self, site, values):
        return {"targets": self.default_targets(site)}

    def describe(self, spec):
        return ["on " + ",".join(spec.targets)]

    def short_words(self, spec):
        return [",".join(spec.targets)]

    # ---- PEFT: IA3Config ----------------------------------------------------------------------
    peft_type = "IA3"

    def peft_refusal(self, spec, where):
        return None

    def peft_fields(self, spec, target_modules):
        # An ffn module's weights are all feed-forward (their inputs scaled); one PEFT config holding
        # several IA3 modules joins their target_modules, and their feedforward_modules, with "|".
        return {
            "target_modules": target_modules,
            "feedforward_modules": target_modules if spec.position == "ffn" else [],
            "init_ia3_weights": True,
        }

    def peft_weights(self, module, layer, adapter="default"):
        held = layer.ia3_l[adapter]  # [out, 1], or [1, in] on a feed-forward module
        held.data.copy_(module.scale.detach().reshape(held.shape))


IA3 = register(IA3Form())
