"""A `PetlConfig` as one line of text: the trial attribute ``config_text`` the dashboard shows and
the report's tables (`describe_config`), and a few words for a console line (`short_name`).

Example:
    >>> from petl_nas.core.config import ModuleSpec, PetlConfig
    >>> describe_config(PetlConfig(modules=(ModuleSpec(form="lora", size=8, scale=2.0),)))
    'attn LoRA r=8 on q,v scaled s=2'
    >>> describe_config(PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=16, blocks=("decoder",)),)))
    'ffn adapter r=16 parallel relu in decoder'
    >>> short_name(PetlConfig(modules=(ModuleSpec(form="lora", size=2, layers=(3, 4, 5)),), prompt_length=4))
    'LoRA r=2 q,v L3-5 + prompt 4'
"""

from __future__ import annotations

from .config import ModuleSpec, PetlConfig
from .forms import form_named


def _layers(layers: tuple[int, ...] | None) -> str:
    if layers is None:
        return ""
    if len(layers) > 1 and layers == tuple(range(layers[0], layers[-1] + 1)):
        return f" layers {layers[0]}-{layers[-1]}"
    return " layers " + ",".join(map(str, layers))


def describe_module(m: ModuleSpec) -> str:
    """E.g. ``ffn Compacter r=52 n=4 sequential relu σ-gate layers 0,3,4`` (σ-gate: UniPELT's
    learned gate; λ-gated: prefix tuning's own gate)."""
    form = form_named(m.form)
    parts = [m.position, form.title, *([f"{form.size_letter}={m.size}"] if form.sized else []), *form.describe(m)]
    if m.composition == "scaled":
        parts.append(f"scaled s={m.scale:.3g}" + (" learned" if m.learn_scale else ""))
    if m.gate:
        parts.append("σ-gate" if m.gate_per == "example" else "σ-gate per token")
    blocks = f" in {'+'.join(m.blocks)}" if m.blocks is not None else ""
    return " ".join(parts) + blocks + _layers(m.layers)


def describe_config(config: PetlConfig | dict) -> str:
    """The modules joined by `` + ``, then BitFit / prompt / LayerNorm switches."""
    if isinstance(config, dict):
        config = PetlConfig.from_dict(config)
    parts = [describe_module(m) for m in config.modules]
    if config.bitfit:
        parts.append("BitFit")
    if config.prompt_length:
        parts.append(f"prompt {config.prompt_length} tokens")
    if config.train_layernorms:
        parts.append("LayerNorms")
    return " + ".join(parts) or "no PETL module (head only)"


def _short_layers(layers: tuple[int, ...] | None) -> list[str]:
    if layers is None:
        return []
    if len(layers) > 1 and layers == tuple(range(layers[0], layers[-1] + 1)):
        return [f"L{layers[0]}-{layers[-1]}"]
    return ["L" + ",".join(map(str, layers))]


def short_name(config: PetlConfig | dict) -> str:
    """A few words per module (``LoRA r=2 q,v L3-5``: form, size, where each form says it sits,
    layers), joined by `` + ``, then BitFit / prompt / LayerNorm switches; the rest is in
    `describe_config`."""
    if isinstance(config, dict):
        config = PetlConfig.from_dict(config)
    parts = []
    for m in config.modules:
        form = form_named(m.form)
        parts.append(
            " ".join(
                [
                    form.title,
                    *([f"{form.size_letter}={m.size}"] if form.sized else []),
                    *form.short_words(m),
                    *_short_layers(m.layers),
                ]
            )
        )
    parts += ["BitFit"] * bool(config.bitfit) + [f"prompt {config.prompt_length}"] * bool(config.prompt_length)
    parts += ["LN"] * bool(config.train_layernorms)
    return " + ".join(parts) or "head only"


__all__ = ["describe_config", "describe_module", "short_name"]
