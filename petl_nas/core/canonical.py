"""One canonical point per function: `canonical` merges modules that compute one module's function.

The space can put two LoRAs of ranks 1 and 5 on one sublayer; they compute
W·x + s·B₁A₁x + s·B₂A₂x = W·x + s·[B₁ B₂][A₁; A₂]x, one LoRA of rank 6, with the same parameters
(r·(in + out) per weight, linear in r) drawn from the same initialisation (A's Kaiming bound reads
its fan-in, not r). Training both is training one point twice, so a search maps a configuration to
its canonical form before it counts, deduplicates or trains it.

Two modules merge only where that holds exactly: a form that says so (`Form.sums`; LoRA, not DoRA,
whose magnitudes rescale each module's own W + s·B·A),
every field equal but ``size``, and nothing per module beyond its size:
- no gate: g₁·Δ₁ + g₂·Δ₂ with two gates is not one gated module, and each gate has d + 1 parameters;
- no learned scale: two learned scalars per weight are not one;
- no dropout: two modules draw two masks on x where one module draws one.
The merged module takes the first one's place; a LoRA's update reads x beside the weight whatever
the modules' order, so the order does not change the function. The bottleneck adapter does not
merge: two parallel adapters are one of the summed bottleneck except that their two output biases
become one, d parameters fewer per layer, so the merged point would count differently.

Example:
    >>> two = PetlConfig(modules=(ModuleSpec(form="lora", size=1, layers=(5,)),
    ...                           ModuleSpec(form="lora", size=5, layers=(5,))))
    >>> [m.size for m in canonical(two).modules]
    [6]
"""

from __future__ import annotations

import dataclasses

from .config import ModuleSpec, PetlConfig
from .forms import form_named


def canonical(config: PetlConfig) -> PetlConfig:
    """``config`` with every group of modules that sum to one module merged into one (sizes added,
    in the first one's place); ``config`` itself when nothing merges. Idempotent."""
    merged: list[ModuleSpec] = []
    for spec in config.modules:
        partner = next((i for i, kept in enumerate(merged) if sums_with(kept, spec)), None)
        if partner is None:
            merged.append(spec)
        else:
            merged[partner] = dataclasses.replace(merged[partner], size=merged[partner].size + spec.size)
    if len(merged) == len(config.modules):
        return config
    return dataclasses.replace(config, modules=tuple(merged))


def sums_with(a: ModuleSpec, b: ModuleSpec) -> bool:
    """Do ``a`` and ``b`` together compute exactly one module of size ``a.size + b.size``?"""
    key = _sum_key(a)
    return key is not None and key == _sum_key(b)


def _sum_key(spec: ModuleSpec) -> tuple | None:
    """Every field but ``size``, or None when ``spec`` carries something of its own beyond its size."""
    if not form_named(spec.form).sums(spec) or spec.gate or spec.learn_scale or spec.dropout:
        return None
    return tuple(getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "size")


__all__ = ["canonical", "sums_with"]
