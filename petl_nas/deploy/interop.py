"""The same configuration for AdapterHub (`adapters` ConfigUnion JSON) and HF PEFT, where it is
expressible there; where it is not, `NotExpressible` lists the dimensions instead of writing
something different.

Both are written as plain JSON in the libraries' own config vocabulary (neither library is
imported): ``adapters.ConfigUnion.load(d)`` / ``peft.get_peft_config(d)`` read them.
AdapterHub reference: its ``adapter_config.py`` (bottleneck, lora, prefix_tuning, prompt_tuning,
union). PEFT: each form says its own tuner (`Form.peft_type`, `Form.peft_fields`); this file names no form, only
what PEFT's tuners share (target patterns, per-module ranks, bias, head). PEFT's prefix tuning is not this
prefix on any family under transformers 5 (measured with peft 0.21, `tests/deploy/test_peft_export.py`):
BERT-style encoders take no past key values, so it cannot run there; on decoders it moves the real tokens'
positions by the prefix length, a different model (equal to this prefix with the positions shifted).
"""

from __future__ import annotations

import re

from torch import nn

from ..core.backbones import spec_for
from ..core.budget import meta_model
from ..core.config import ModuleSpec, PetlConfig
from ..core.forms import form_named
from ..core.head import checkpoint_pooling, native_pooling


class NotExpressible(ValueError):
    """The configuration has dimensions the target library cannot express."""

    def __init__(self, library: str, reasons: list[str]):
        self.library, self.reasons = library, reasons
        super().__init__(f"not expressible in {library}: " + "; ".join(reasons))


def _leave_out(m: ModuleSpec, n_layers: int) -> list[int]:
    return [] if m.layers is None else [i for i in range(n_layers) if i not in m.layers]


def _scaling(m: ModuleSpec):
    if m.learn_scale:
        return "learned"
    return m.scale if m.composition == "scaled" else 1.0


def to_adapters(config: PetlConfig, hidden_size: int, n_layers: int, task_kind: str = "classification") -> dict:
    """An AdapterHub config dict (``{"architecture": "union", "configs": [...]}`` when several)."""
    reasons, out = [], []
    if config.bitfit:
        reasons.append("bitfit (AdapterHub has no BitFit)")
    if config.train_layernorms:
        reasons.append("train_layernorms (AdapterHub trains no backbone LayerNorms)")
    if config.prompt_length:
        reasons.append("prompt tokens after the first token (AdapterHub's prompt tuning prepends them)")
    if config.pooling in ("mean", "pooler", "pooler_trained") and task_kind in ("classification", "regression"):
        reasons.append(
            f"pooling: {config.pooling} (AdapterHub's classification heads read [CLS] into a new dense layer)"
        )
    for i, m in enumerate(config.modules):
        where = f"modules[{i}] ({m.form} at {m.position})"
        if m.blocks is not None:
            reasons.append(f"{where}: restricted to the {'+'.join(m.blocks)} blocks")
        if m.gate and m.gate_per == "token":
            reasons.append(f"{where}: a per-token gate (AdapterHub's gates are UniPELT's, one per example)")
        c = form_named(m.form).adapters_config(m, hidden_size, _leave_out(m, n_layers), _scaling(m), where, reasons)
        if c is not None:
            out.append(c)
    archs = [c["architecture"] for c in out]
    for a in set(archs):
        if archs.count(a) > 1 and a != "bottleneck":
            reasons.append(f"two {a} modules (ConfigUnion takes one per architecture)")
    if reasons:
        raise NotExpressible("AdapterHub adapters", reasons)
    return out[0] if len(out) == 1 else {"architecture": "union", "configs": out}


def _head_modules(config: PetlConfig, model: nn.Module, task_kind: str) -> dict:
    """What trains beside the tuner, as PEFT's ``modules_to_save``: every module of a sequence
    classifier's head outside the base model that has weights (BERT's ``classifier``, DeBERTa's
    ``pooler`` and ``classifier``, ModernBERT's ``head`` and ``classifier``, DistilBERT's
    ``pre_classifier``, a decoder's ``score``), and a trained pooler inside it (``pooler_trained``).
    PEFT's own default for SEQ_CLS is only ``classifier`` and ``score``."""
    if task_kind not in ("classification", "regression"):
        return {}
    head = [
        name
        for name, child in model.named_children()
        if child is not model.base_model and any(True for _ in child.parameters())
    ]
    if config.pooling == "pooler_trained":
        head.append("pooler")
    return {"modules_to_save": sorted(set(head))}


def _resolved_pooling(config: PetlConfig, model_config) -> tuple[str, str]:
    """(what the configuration's head reads, what the stock model's head reads)."""
    model = meta_model(model_config)
    native = native_pooling(model)
    if config.pooling != "auto":
        return config.pooling, native
    return checkpoint_pooling(getattr(model_config, "_name_or_path", None)) or native, native


def _target_pattern(
    spec, model, m: ModuleSpec, where: str, reasons: list[str]
) -> tuple[str, list[str], list[nn.Module]]:
    """A regular expression naming exactly the weights ``m`` adapts (its layers written in), their
    names without the layer (to check overlaps) and their layer-0 modules; a fused slice is a reason
    instead."""
    names, alternatives, modules = [], [], []
    blocks = [b for b in spec.blocks if m.blocks is None or b.name in m.blocks]
    for block in blocks:
        if m.position == "ffn" and not block.ffn_in:
            continue
        depth = len(model.base_model.get_submodule(block.layers))
        layers = "|".join(str(i) for i in (m.layers if m.layers is not None else range(depth)))
        for t in m.targets:
            for site in block.sites(t):
                if site.parts > 1:
                    reasons.append(
                        f"{where}: {t} is one of {site.parts} slices of the fused {site.path} "
                        f"(PEFT adapts whole modules)"
                    )
                    continue
                alternatives.append(rf"{re.escape(block.layers)}\.(?:{layers})\.{re.escape(site.path)}")
                names.append(f"{block.layers}.{site.path}")
                modules.append(model.base_model.get_submodule(block.layers)[0].get_submodule(site.path))
    return r"(?:.*\.)?(?:" + "|".join(alternatives) + ")", names, modules


def _peft_task_type(spec, task_kind: str, head_apart: bool) -> str:
    if task_kind in ("classification", "regression"):
        return "FEATURE_EXTRACTION" if head_apart else "SEQ_CLS"
    return "SEQ_2_SEQ_LM" if spec.encoder_decoder else "CAUSAL_LM"


# PEFT tuner types whose implementation passes past key values (PEFT's prefix tuning).
_PAST_KEY_VALUES = ("PREFIX_TUNING",)
# The tuner types `peft.PeftMixedModel` mixes (peft 0.21: tuners/mixed/model.py).
MIXABLE = ("LORA", "LOHA", "LOKR", "ADALORA", "OFT", "SHIRA")
# A field that may differ between modules of one tuner type, and the PEFT field that maps it per module.
_PER_MODULE = {"r": "rank_pattern", "lora_alpha": "alpha_pattern", "alpha": "alpha_pattern"}


# PEFT fields that name modules (a regular expression, or [] for none): several modules of one tuner
# type join theirs (IA3's feed-forward modules are those of its ffn modules).
_JOINED = ("target_modules", "feedforward_modules")


def _joined(a, b):
    """Two values of a `_JOINED` field as one: either one where the other names nothing."""
    if not a or not b:
        return a or b
    return rf"(?:{a}|{b})"


def _common_reasons(config: PetlConfig, model_config, spec, task_kind: str, head_apart: bool) -> list[str]:
    """What no PEFT tuner expresses, whatever the forms: gates, learned scales, a pooling the stock
    head cannot read (unless the head is written apart), a prompt PEFT would put elsewhere."""
    reasons, model_type = [], model_config.model_type
    for i, m in enumerate(config.modules):
        where = f"modules[{i}] ({m.form} at {m.position})"
        form = form_named(m.form)
        if (refusal := form.peft_refusal(m, where)) is not None:
            reasons.append(refusal)
        if m.gate:
            reasons.append(f"{where}: UniPELT gate")
        if m.learn_scale:
            reasons.append(f"{where}: learned scale")
        if form.peft_type in _PAST_KEY_VALUES:
            reasons.append(
                f"{where}: PEFT's prefix tuning passes past key values, which transformers' "
                f"{model_type} models do not take"
                if not (spec.decoder_only or spec.encoder_decoder)
                else f"{where}: PEFT's prefix tuning on the {model_type} backbone moves the real tokens' "
                f"positions by the prefix length (a different model)"
            )
    if config.train_layernorms:
        reasons.append("train_layernorms")
    if (
        task_kind in ("classification", "regression")
        and not (spec.decoder_only or spec.encoder_decoder)
        and not head_apart
    ):
        pooling, native = _resolved_pooling(config, model_config)
        if pooling not in {native} | ({"pooler_trained"} if native == "pooler" else set()):
            reasons.append(
                f"pooling: {pooling} (PEFT trains the model's own head, which reads "
                f"{'[CLS] through the pooler' if native == 'pooler' else native}; a space or "
                f"configuration with pooling: {'pooler_trained' if native == 'pooler' else native} "
                f"exports); convert --to peft writes a trained run with its head apart"
            )
    prompt_as_peft = spec.decoder_only and task_kind == "causal_lm"  # both prepend: the same model
    if config.prompt_length and not prompt_as_peft:
        reasons.append(
            "a prompt on a decoder-only classifier (PEFT's classifier then reads the last position, "
            "a pad token wherever a row is right-padded)"
            if spec.decoder_only
            else "prompt tokens after the first token (PEFT prepends them)"
        )
    return reasons


def _tuner(group: list[tuple[int, ModuleSpec]], spec, model, reasons: list[str]) -> tuple[dict, list[nn.Module]]:
    """One PEFT config's fields for the modules of one tuner type: the first module's fields, and
    per-module ranks and alphas (``rank_pattern``, ``alpha_pattern``) where the others differ."""
    out, adapted, seen = {}, [], []
    for i, m in group:
        form = form_named(m.form)
        where = f"modules[{i}] ({m.form} at {m.position})"
        pattern, names, modules = _target_pattern(spec, model, m, where, reasons)
        adapted += modules
        layers = set(m.layers) if m.layers is not None else None
        for name in names:
            for other_layers, other in seen:
                if other == name and (layers is None or other_layers is None or layers & other_layers):
                    reasons.append(f"{where}: a second {form.title} on {name} (PEFT puts one {form.title} on a weight)")
        seen += [(frozenset(layers) if layers is not None else None, n) for n in names]
        fields = form.peft_fields(m, pattern)
        if not out:
            out = fields
            continue
        for key, value in fields.items():
            if key in _JOINED:
                out[key] = _joined(out.get(key), value)
                continue
            if out.get(key) == value:
                continue
            if key in _PER_MODULE:
                out.setdefault(_PER_MODULE[key], {})[pattern] = value
            else:
                reasons.append(
                    f"{where}: its {key} differs from modules[{group[0][0]}]'s (PEFT takes one {key} per tuner)"
                )
    return out, adapted


def peft_configs(
    config: PetlConfig, model_config, task_kind: str = "classification", head_apart: bool = False
) -> dict[str, dict]:
    """The PEFT config dicts of ``config`` on the backbone ``model_config``, by adapter name:
    ``{"default": ...}`` for one tuner type, one entry per type (named by it, lowercase) for a mix
    that `peft.PeftMixedModel` holds. Each form PEFT expresses writes its own fields (`Form.peft_fields`);
    ``target_modules`` is a regular expression over the backbone's own module names with the layers
    written in. ``head_apart``: a classifier's head is saved beside the adapter, not by PEFT (its
    pooling is one the stock head cannot read): the adapter is for the base model (``AutoModel``)."""
    spec = spec_for(model_config)
    model = meta_model(model_config)
    reasons = _common_reasons(config, model_config, spec, task_kind, head_apart)
    groups: dict[str, list[tuple[int, ModuleSpec]]] = {}
    for i, m in enumerate(config.modules):
        form = form_named(m.form)
        if form.peft_refusal(m, "") is None and form.peft_type not in _PAST_KEY_VALUES:
            groups.setdefault(form.peft_type, []).append((i, m))
    if config.prompt_length and groups:
        reasons.append(
            "several methods at once (a soft prompt and a tuner: PEFT's prompt tuning is a config of its own)"
        )
    if len(groups) > 1 and (blocking := [t for t in groups if t not in MIXABLE]):
        reasons.append(
            f"a mix of PEFT tuners ({' + '.join(groups)}): PeftMixedModel mixes only "
            f"{', '.join(MIXABLE)}, not {', '.join(blocking)}"
        )
    tuners = {t: _tuner(g, spec, model, reasons) for t, g in groups.items()}
    if config.bitfit and not any("bias" in fields for fields, _ in tuners.values()):
        reasons.append("bitfit without LoRA (PEFT trains biases only beside a tuner that takes bias='all')")
    if reasons:
        raise NotExpressible("HF PEFT", reasons)
    base = {"task_type": _peft_task_type(spec, task_kind, head_apart), "inference_mode": False}
    head = {} if head_apart else _head_modules(config, model, task_kind)
    out = {}
    for n, (peft_type, (fields, adapted)) in enumerate(tuners.items()):
        if "bias" in fields and config.bitfit:
            fields["bias"] = "all"
        if "fan_in_fan_out" in fields and not all(isinstance(module, nn.Linear) for module in adapted):
            fields["fan_in_fan_out"] = True  # GPT-2's Conv1D keeps its weight as [in, out]
        out["default" if len(tuners) == 1 else peft_type.lower()] = {
            **base,
            "peft_type": peft_type,
            **fields,
            **(head if n == 0 else {}),
        }
    if out:
        return out
    if config.prompt_length:  # PEFT's logits begin with the prompt positions'
        return {
            "default": {
                **base,
                "peft_type": "PROMPT_TUNING",
                "num_virtual_tokens": config.prompt_length,
                "token_dim": model.get_input_embeddings().embedding_dim,
            }
        }
    raise NotExpressible("HF PEFT", ["an empty configuration"])


def to_peft(config: PetlConfig, model_config, task_kind: str = "classification", head_apart: bool = False) -> dict:
    """The one PEFT config dict of ``config`` (`peft_configs`); a mix of tuner types, which one
    config cannot hold, is `NotExpressible` naming them (``convert --to peft`` writes it as a
    `peft.PeftMixedModel`'s adapters). A decoder-only language model's soft prompt is PEFT's prompt
    tuning (both prepend it)."""
    configs = peft_configs(config, model_config, task_kind, head_apart)
    if len(configs) > 1:
        raise NotExpressible(
            "HF PEFT",
            [
                f"a mix of PEFT tuners ({' + '.join(c['peft_type'] for c in configs.values())}"
                f"): one config holds one (petl-nas convert --to peft writes a PeftMixedModel)"
            ],
        )
    return configs["default"]


__all__ = ["to_adapters", "to_peft", "peft_configs", "NotExpressible", "MIXABLE"]
