"""A configuration at measured per-family learning rates: which families it trains, and the
recipe rate and `PetlConfig.lr_mults` that give each its own rate (`petl_nas.search.rates`
measures them)."""

from __future__ import annotations

import dataclasses

from .config import PetlConfig


def families_of(config: PetlConfig) -> list[str]:
    """The families of ``config``'s trained parameters that have rates of their own, in order: its
    modules' forms, then a soft prompt and BitFit's biases (LayerNorms follow their module, the
    head the first family)."""
    out = [m.form for m in config.modules]
    out += ["prompt"] * bool(config.prompt_length) + ["bitfit"] * bool(config.bitfit)
    return list(dict.fromkeys(out))


def at_rates(rates: dict[str, float], config: PetlConfig, scale: float) -> tuple[PetlConfig, float]:
    """(``config`` with its ``lr_mults``, the recipe's rate) that train each family of ``config`` at
    ``rates[family]`` times ``scale``. The first family with a rate sets the recipe's rate and the
    others are multiples of it; a family without one trains at the recipe's rate, and a
    configuration of none of them (the head alone) at the first rate of ``rates``."""
    own = [f for f in families_of(config) if f in rates]
    base = rates[own[0]] if own else rates[next(iter(rates))]
    mults = {f: rates[f] / base for f in own[1:] if rates[f] != base}
    return dataclasses.replace(config, lr_mults=tuple(sorted(mults.items()))), scale * base


__all__ = ["families_of", "at_rates"]
