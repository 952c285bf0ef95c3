"""What the forms that update linear weights share (LoRA with DoRA, LoKr, VeRA, FourierFT): the
weights they may name (q, k, v, o of the attention; W1, W2 of the FFN; q and v by default, at
least one), the walk over each named weight of the covered layers that their `place` builds a
module on, and the space's ``lora_targets`` choice that names those weights. No form is
registered here."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Form

WEIGHTS = {"attn": ("q", "k", "v", "o"), "ffn": ("ffn_in", "ffn_out")}
# A space's `lora_targets` choices and the weights each names.
SPACE_TARGETS = {"qv": ("q", "v"), "qkvo": ("q", "k", "v", "o"), "q": ("q",), "v": ("v",), "ffn": ("ffn_in", "ffn_out")}


class WeightUpdate(Form):
    """A form whose module adds an update to a linear weight's output, reading that weight's input:
    parallel by construction; it names its weights in ``targets``."""

    parallel_only = True

    def targets(self, position):
        return WEIGHTS[position]

    def default_targets(self, position):
        return ("q", "v") if position == "attn" else WEIGHTS["ffn"]

    def short_words(self, spec):
        return [",".join(spec.targets)]

    def check(self, spec, where):
        from ...errors import ConfigError

        if not spec.targets:
            raise ConfigError(f"{where}.targets: {self.title} needs at least one weight")

    @staticmethod
    def weights(spec, at) -> Iterator[tuple[int, str, object, str]]:
        """(layer, target, site, module key) of each weight ``spec`` names on the layers ``at``
        covers; a fused projection's slices are sites of their own (``<layer>_<target>_<j>``)."""
        for layer in at.covered:
            for target in spec.targets:
                sites = at.block.sites(target)
                for j, site in enumerate(sites):
                    yield layer, target, site, f"{layer}_{target}" if len(sites) == 1 else f"{layer}_{target}_{j}"

    @staticmethod
    def space_targets(site: str, values: dict) -> tuple[str, ...]:
        """The weights a point of the space names at ``site`` (its ``lora_targets`` at attn)."""
        return SPACE_TARGETS[values["lora_targets"] if site == "attn" else "ffn"]

    @staticmethod
    def targets_value(spec) -> dict:
        """The inverse of `space_targets`: ``{"lora_targets": ...}`` at attn, nothing at the FFN."""
        if spec.position != "attn":
            return {}
        return {"lora_targets": next((k for k, t in SPACE_TARGETS.items() if t == spec.targets), None)}


__all__ = ["WeightUpdate", "WEIGHTS", "SPACE_TARGETS"]
