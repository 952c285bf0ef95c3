"""Which wave of PEFT methods a configuration draws on, and the name of its families.

The space first held the 2021–22 methods (the head, adapters, prefix tuning, LoRA, Compacter, soft
prompts, BitFit, the multi-head adapter, UniPELT's gates, the backbone's LayerNorms). Today's
small-budget methods came later: (IA)³, LN-tuning, VeRA, FourierFT, LoKr and LoRA as DoRA. A
suite compares its pick with the best baseline of each wave (`uses_recent_method`), and names the
families that won (`family_name`).
"""

from __future__ import annotations

from .config import ModuleSpec, PetlConfig

RECENT_FORMS = frozenset({"ia3", "ln", "vera", "fourierft", "lokr"})  # forms added in 2023–24


def _module_family(m: ModuleSpec) -> str:
    return "dora" if m.form == "lora" and m.dora else m.form


def uses_recent_method(config: PetlConfig) -> bool:
    """Does ``config`` use a method added in 2023–24 (a form of `RECENT_FORMS`, or LoRA as DoRA)?"""
    return any(_module_family(m) in RECENT_FORMS | {"dora"} for m in config.modules)


def family_name(config: PetlConfig) -> str:
    """Its trained families in a few words: the modules' forms in order (LoRA as DoRA: ``dora``),
    then ``prompt``, ``bitfit`` and ``layernorms`` where trained, joined by `` + ``; ``head only``
    where nothing else trains.

    Example:
        >>> family_name(PetlConfig(modules=(ModuleSpec(form="lora", dora=True),), prompt_length=4))
        'dora + prompt'
    """
    names = [_module_family(m) for m in config.modules]
    names += ["prompt"] * bool(config.prompt_length) + ["bitfit"] * bool(config.bitfit)
    names += ["layernorms"] * bool(config.train_layernorms)
    return " + ".join(dict.fromkeys(names)) or "head only"


__all__ = ["RECENT_FORMS", "family_name", "uses_recent_method"]
