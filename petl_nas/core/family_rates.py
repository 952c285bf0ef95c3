"""A configuration at measured per-family learning rates: which families it trains, the recipe rate
and `PetlConfig.lr_mults` that give each its own rate (`petl_nas.search.rates` measures them), and
the scale its modules train at.

A fixed scale is a learning rate in disguise. A module whose output is s·F(U, θ), F linear in a
group U that starts at zero (LoRA's B, an adapter's or a Compacter's up projection with its bias:
`Form.zero_start_inits`), computes at scale s with U what it computes at scale 1 with s·U, so
every other parameter sees the same gradients, and Adam, whose step does not see a gradient's
scale, moves s·U s times as fast as it moves U: training at scale s is training at scale 1 with
U's rate s times higher (exactly, without weight decay or clipping: `tests/core/test_scale_rate.py`).
He et al.'s s = 4 for the parallel adapter is such a rate, as is LoRA's alpha/r. A family's rate is
measured on one of its presets at that preset's scale, its reference scale, so a study that trains
at measured rates trains every such module at its family's reference scale (`at_reference_scales`):
a scale the sampler drew or a preset named would otherwise move that module's rate away from the
one measured for it, by up to 16x over the unified space's range of s, and the rate, not the
structure, would decide again. A learned scale, a bert-style (random) initialisation or a gated
prefix keep theirs: there s changes the function, not only its speed.
"""

from __future__ import annotations

import dataclasses

from .config import PetlConfig
from .forms import form_named, form_names


def families_of(config: PetlConfig) -> list[str]:
    """The families of ``config``'s trained parameters that have rates of their own, in order: its
    modules' forms, then a soft prompt and BitFit's biases (LayerNorms follow their module, the
    head the first family)."""
    out = [m.form for m in config.modules]
    out += ["prompt"] * bool(config.prompt_length) + ["bitfit"] * bool(config.bitfit)
    return list(dict.fromkeys(out))


def at_reference_scales(config: PetlConfig, scales: dict[str, float]) -> PetlConfig:
    """``config`` with every module whose scale is only a rate (`Form.scale_is_a_rate`) at its
    family's reference scale ``scales[form]`` (``add`` for 1, else ``scaled``); modules of a family
    without one keep theirs. ``config`` itself when nothing changes.

    Example:
        >>> pa = PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=8, init="lora",
        ...                                     composition="scaled", scale=4.0),))
        >>> at_reference_scales(pa, {"adapter": 1.0}).modules[0].composition
        'add'
    """
    modules = []
    for m in config.modules:
        ref = scales.get(m.form)
        if ref is None or not form_named(m.form).scale_is_a_rate(m) or _scale(m) == ref:
            modules.append(m)
        else:
            modules.append(dataclasses.replace(m, composition="add" if ref == 1.0 else "scaled", scale=float(ref)))
    if all(a is b for a, b in zip(modules, config.modules)):
        return config
    return dataclasses.replace(config, modules=tuple(modules))


def scale_can_be_a_rate(family: str) -> bool:
    """Can a module of ``family`` have a scale that is only a rate (some init starts its output at
    zero)? A family that cannot has no reference scale to train at: its scale is structure."""
    return family in form_names() and bool(form_named(family).zero_start_inits)  # prompt, bitfit: no form


def _scale(spec) -> float:
    return spec.scale if spec.composition == "scaled" else 1.0


def reference_scale(config: PetlConfig, family: str) -> float | None:
    """The fixed scale of the first module of ``family`` in ``config`` (``add``: 1), whatever its
    initialisation: on the family's probe, the scale its rate is measured at; None when the family
    has no module with a fixed scale there (a learned one, prefix tuning's gate)."""
    for m in config.modules:
        if m.form == family and m.composition in ("add", "scaled") and not m.learn_scale:
            return _scale(m)
    return None


def at_rates(
    rates: dict[str, float], config: PetlConfig, scale: float, scales: dict[str, float] | None = None
) -> tuple[PetlConfig, float]:
    """(``config`` with its ``lr_mults``, the recipe's rate) that train each family of ``config`` at
    ``rates[family]`` times ``scale``. The first family with a rate sets the recipe's rate and the
    others are multiples of it; a family without one trains at the recipe's rate, and a
    configuration of none of them (the head alone) at the first rate of ``rates``. With ``scales``
    (the reference scales the rates were measured at), modules whose scale is only a rate train at
    their family's (`at_reference_scales`)."""
    if scales:
        config = at_reference_scales(config, scales)
    own = [f for f in families_of(config) if f in rates]
    base = rates[own[0]] if own else rates[next(iter(rates))]
    mults = {f: rates[f] / base for f in own[1:] if rates[f] != base}
    return dataclasses.replace(config, lr_mults=tuple(sorted(mults.items()))), scale * base


__all__ = ["families_of", "at_rates", "at_reference_scales", "reference_scale", "scale_can_be_a_rate"]
