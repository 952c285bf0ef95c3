"""The same configuration for AdapterHub (`adapters` ConfigUnion JSON) and HF PEFT, where it is
expressible there; where it is not, `NotExpressible` lists the dimensions instead of writing
something different.

Both are written as plain JSON in the libraries' own config vocabulary (neither library is
imported): ``adapters.ConfigUnion.load(d)`` / ``peft.get_peft_config(d)`` read them.
AdapterHub reference: its ``adapter_config.py`` (bottleneck, lora, prefix_tuning, prompt_tuning,
union); PEFT: LoraConfig, PrefixTuningConfig, PromptTuningConfig.
"""

from __future__ import annotations

from .config import ModuleSpec, PetlConfig

# BERT-family module names for PEFT's target_modules (PEFT matches names, not roles).
_BERT_NAMED = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
_PEFT_TARGETS = {"q": "query", "k": "key", "v": "value", "o": "attention.output.dense",
                 "ffn_in": "intermediate.dense", "ffn_out": r"\d+\.output\.dense"}


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


def to_adapters(config: PetlConfig, hidden_size: int, n_layers: int) -> dict:
    """An AdapterHub config dict (``{"architecture": "union", "configs": [...]}`` when several)."""
    reasons, out = [], []
    if config.bitfit:
        reasons.append("bitfit (AdapterHub has no BitFit)")
    if config.train_layernorms:
        reasons.append("train_layernorms (AdapterHub trains no backbone LayerNorms)")
    if config.prompt_length:
        reasons.append("prompt tokens after the first token (AdapterHub's prompt tuning prepends them)")
    if config.pooling in ("mean", "pooler", "pooler_trained"):
        reasons.append(f"pooling: {config.pooling} (AdapterHub's classification heads read [CLS] into a new "
                       f"dense layer)")
    for i, m in enumerate(config.modules):
        where = f"modules[{i}] ({m.form} at {m.position})"
        if m.blocks is not None:
            reasons.append(f"{where}: restricted to the {'+'.join(m.blocks)} blocks")
        if m.gate and m.gate_per == "token":
            reasons.append(f"{where}: a per-token gate (AdapterHub's gates are UniPELT's, one per example)")
        if m.form in ("adapter", "compacter"):
            c = {"architecture": "bottleneck", "mh_adapter": m.position == "attn",
                 "output_adapter": m.position == "ffn", "reduction_factor": hidden_size / m.size,
                 "non_linearity": m.nonlinearity, "is_parallel": m.insertion == "parallel",
                 "scaling": _scaling(m), "use_gating": m.gate,
                 "init_weights": "mam_adapter" if m.init == "lora" else "bert",
                 "original_ln_before": True, "original_ln_after": True, "residual_before_ln": True,
                 "leave_out": _leave_out(m, n_layers)}
            if m.form == "compacter":
                c.update(phm_layer=True, phm_dim=m.phm_n, phm_rank=m.phm_rank, shared_phm_rule=True,
                         factorized_phm_rule=False, learn_phm=True)
            if m.nonlinearity == "identity":
                reasons.append(f"{where}: identity nonlinearity")
            out.append(c)
        elif m.form == "lora":
            attn = [t for t in m.targets if t in ("q", "k", "v")]
            if "o" in m.targets:
                reasons.append(f"{where}: LoRA on the attention output weight o")
            if m.learn_scale:
                reasons.append(f"{where}: learned LoRA scale")
            out.append({"architecture": "lora", "selfattn_lora": bool(attn), "attn_matrices": attn,
                        "intermediate_lora": "ffn_in" in m.targets, "output_lora": "ffn_out" in m.targets,
                        "r": m.size, "alpha": m.size * (m.scale if m.composition == "scaled" else 1.0),
                        "use_gating": m.gate, "composition_mode": "add", "dropout": m.dropout,
                        "leave_out": _leave_out(m, n_layers)})
        elif m.form == "prefix":
            if m.composition != "gated":
                reasons.append(f"{where}: {m.composition} composition (AdapterHub's prefix is the "
                               f"concatenation, He et al.'s gated form)")
            out.append({"architecture": "prefix_tuning", "prefix_length": m.size, "flat": m.reparam == 0,
                        "bottleneck_size": m.reparam or 512, "non_linearity": "tanh",
                        "use_gating": m.gate, "shared_gating": True, "leave_out": _leave_out(m, n_layers)})
        elif m.form == "mh_adapter":
            reasons.append(f"{where}: the multi-head parallel adapter")
    archs = [c["architecture"] for c in out]
    for a in set(archs):
        if archs.count(a) > 1 and a != "bottleneck":
            reasons.append(f"two {a} modules (ConfigUnion takes one per architecture)")
    if reasons:
        raise NotExpressible("AdapterHub adapters", reasons)
    return out[0] if len(out) == 1 else {"architecture": "union", "configs": out}


def _head_modules(config: PetlConfig) -> dict:
    """A trained pooler trains beside PEFT's classifier (``modules_to_save``)."""
    return {"modules_to_save": ["classifier", "pooler"]} if config.pooling == "pooler_trained" else {}


def to_peft(config: PetlConfig, hidden_size: int, n_layers: int, model_type: str = "bert") -> dict:
    """A PEFT config dict (one tuner: LoRA, prefix tuning or prompt tuning). PEFT names target
    modules by the backbone's own layer names; those are written for the BERT family."""
    reasons = []
    if model_type not in _BERT_NAMED:
        reasons.append(f"a {model_type} backbone (target module names are written for the BERT family)")
    forms = [m.form for m in config.modules] + (["prompt"] if config.prompt_length else [])
    for i, m in enumerate(config.modules):
        where = f"modules[{i}] ({m.form} at {m.position})"
        if m.blocks is not None:
            reasons.append(f"{where}: restricted to the {'+'.join(m.blocks)} blocks")
        if m.form in ("adapter", "compacter", "mh_adapter"):
            reasons.append(f"{where}: PEFT has no {'bottleneck' if m.form != 'mh_adapter' else 'multi-head'} adapters")
        if m.gate:
            reasons.append(f"{where}: UniPELT gate")
        if m.learn_scale:
            reasons.append(f"{where}: learned scale")
        if m.form == "prefix" and m.composition != "gated":
            reasons.append(f"{where}: {m.composition} prefix composition")
        if m.form == "prefix" and m.layers is not None:
            reasons.append(f"{where}: prefix on a subset of layers")
    if config.train_layernorms:
        reasons.append("train_layernorms")
    if config.pooling in ("cls", "mean"):
        reasons.append(f"pooling: {config.pooling} (PEFT trains the model's own head: [CLS] through the pooler)")
    if config.prompt_length:
        reasons.append("prompt tokens after the first token (PEFT prepends them)")
    if len({f for f in forms if f in ("lora", "prefix", "prompt")}) > 1:
        reasons.append("several methods at once (a PEFT config holds one tuner)")
    lora = [m for m in config.modules if m.form == "lora"]
    if config.bitfit and not lora:
        reasons.append("bitfit alone (PEFT trains biases only beside a tuner, bias='all')")
    if len({(m.size, m.scale, m.layers) for m in lora}) > 1:
        reasons.append("LoRA modules with different ranks, scales or layers")
    if reasons:
        raise NotExpressible("HF PEFT", reasons)
    base = {"task_type": "SEQ_CLS", "inference_mode": False}
    if lora:
        m = lora[0]
        targets = sorted({_PEFT_TARGETS[t] for x in lora for t in x.targets})
        return {**base, "peft_type": "LORA", "r": m.size,
                "lora_alpha": m.size * (m.scale if m.composition == "scaled" else 1.0),
                "lora_dropout": m.dropout, "target_modules": "|".join(f".*{t}" for t in targets),
                "layers_to_transform": list(m.layers) if m.layers is not None else None,
                "bias": "all" if config.bitfit else "none", **_head_modules(config)}
    prefix = [m for m in config.modules if m.form == "prefix"]
    if prefix:
        m = prefix[0]
        return {**base, **_head_modules(config), "peft_type": "PREFIX_TUNING", "num_virtual_tokens": m.size,
                "prefix_projection": m.reparam > 0, "encoder_hidden_size": m.reparam or hidden_size,
                "token_dim": hidden_size, "num_layers": n_layers}
    raise NotExpressible("HF PEFT", ["an empty configuration"])


__all__ = ["to_adapters", "to_peft", "NotExpressible"]
