"""The ``transformers-remote-code`` target of `convert`: a trained encoder classifier as a plain
transformers folder that ``AutoModelForSequenceClassification.from_pretrained(folder,
trust_remote_code=True)`` loads without petl-nas, for the picks no standard library holds
(bottleneck and parallel adapters, Compacter, prefix tuning, multi-head adapters, UniPELT's gates,
a prompt after [CLS], and their mixes).

The folder holds ``modeling_petl.py`` (this package's file of that name, which imports only torch
and transformers), a ``config.json`` whose ``auto_map`` names its classes, with the backbone's
config (``base``) and a JSON description of the pick's modules and where they sit (``petl``), and
one safetensors file: the backbone's weights as trained (biases, LayerNorms, head) under
``model.``, each module's under ``petl.`` (prefixes flattened), Compacter's shared rules under
``rules.``. `describe` reads the description off a model with petl-nas applied; what the file
cannot rebuild exactly is a refusal naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ..core.backbones import spec_for, stacks
from ..core.head import stock_head_fields
from ..core.inject import attention_edits, output_edits, remove_petl
from ..core.modules import Bottleneck, CompacterAdapter, LoRA
from ..errors import ConfigError

TARGET = "transformers-remote-code"
MODELING = Path(__file__).with_name("modeling_petl.py")
AUTO_CLASS = "AutoModelForSequenceClassification"


def _compose(c, where: str, reasons: list[str]) -> tuple[dict, dict]:
    """A `Composition`'s description and tensors."""
    if c.gate_mix is not None:
        reasons.append(f"{where}: a one-shot supernet's gate mix")
    out = {"scale": float(c.fixed_scale), "learned": c.scale is not None, "gate": c.gate.per if c.gate else None}
    tensors = {"compose.scale": c.scale} if c.scale is not None else {}
    if c.gate is not None:
        tensors |= {"compose.gate.weight": c.gate.proj.weight, "compose.gate.bias": c.gate.proj.bias}
    return out, tensors


def _module(module, where: str, rules: dict, reasons: list[str]) -> tuple[dict, dict]:
    """The description and tensors of one module that edits a weight's output, or a reason."""
    if isinstance(module, LoRA):
        compose, tensors = _compose(module.compose, where, reasons)
        size, d_in = module.A.shape
        m = {"kind": "lora", "size": size, "in": d_in, "out": module.B.shape[0], "compose": compose}
        return m, {"A": module.A, "B": module.B, **tensors}
    if isinstance(module, (Bottleneck, CompacterAdapter)):
        compose, tensors = _compose(module.compose, where, reasons)
        act = {"ReLU": "relu", "GELU": "gelu", "Tanh": "tanh", "SiLU": "swish", "Identity": "identity"}
        m = {"kind": "bottleneck", "act": act[type(module.act).__name__], "compose": compose}
        if isinstance(module, Bottleneck):
            m |= {"dim": module.down.in_features, "size": module.down.out_features}
            for part in ("down", "up"):
                tensors |= {f"{part}.{k}": v for k, v in getattr(module, part).named_parameters()}
            return m, tensors
        rule = module.down.rule[0]
        key = rules.setdefault(id(rule), (f"r{len(rules)}", rule.A))[0]
        n, rank = module.down.n, module.down.s.shape[-1]
        m |= {
            "dim": module.down.in_features,
            "size": module.down.out_features,
            "phm": {"rule": key, "n": n, "rank": rank},
        }
        for part in ("down", "up"):
            layer = getattr(module, part)
            tensors |= {f"{part}.s": layer.s, f"{part}.t": layer.t, f"{part}.bias": layer.bias}
        return m, tensors
    reasons.append(f"{where}: {type(module).__name__} (the carrier rebuilds adapters, Compacter, LoRA)")
    return {}, {}


def _sublayer_inputs(model) -> dict[str, tuple[str, str]]:
    """Each layer's name -> (the path whose input is its attention sublayer's x, its FFN's x)."""
    spec, layer_lists = stacks(model)
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for block in spec.blocks:
        for layer in layer_lists[block.name]:
            name = names[id(layer)]
            ffn = f"{name}.{block.sites('ffn_in')[0].path}" if block.ffn_in else None
            out[name] = (f"{name}.{block.sites('q')[0].path}", ffn)
    return out


def _layer_of(path: str, inputs: dict) -> tuple[str, str]:
    return next(v for k, v in inputs.items() if path.startswith(k + "."))


def describe(model, task) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the ``petl`` description, the tensors under ``petl.``/``rules.``) of ``model``; a
    `ConfigError` naming every part the carrier cannot rebuild exactly."""
    reasons = []
    spec = spec_for(model.config)
    if task.kind not in ("classification", "regression") or spec.decoder_only or spec.encoder_decoder:
        reasons.append(f"a {task.kind} task on a {model.config.model_type} (the carrier holds encoder classifiers)")
    inputs = _sublayer_inputs(model) if not reasons else {}
    modules, edits, attention, tensors, rules, keys = {}, [], [], {}, {}, {}
    for path, kind, module, extra in [] if reasons else output_edits(model):
        where = f"{path} ({kind})"
        if kind not in ("lora", "sequential", "parallel") or extra not in (None, "attn", "ffn"):
            reasons.append(f"{where}: a {kind} edit{' of a fused slice' if kind == 'lora' else ''}")
            continue
        if id(module) not in keys:
            m, t = _module(module, where, rules, reasons)
            keys[id(module)] = key = f"m{len(modules)}"
            modules[key] = m
            tensors |= {f"petl.{key}.{k}": v for k, v in t.items()}
        edit = {"at": path, "kind": kind, "module": keys[id(module)]}
        if kind == "parallel":
            edit["reads"] = _layer_of(path, inputs)[0 if extra == "attn" else 1]
        edits.append(edit)
    for path, head in [] if reasons else attention_edits(model):
        entry = {"at": path}
        if head.prefix_gate is not None or head.key_gate is not None:
            reasons.append(f"{path}: a one-shot supernet's position gates")
        if head.prefix is not None:
            gate = head.prefix_compose.gate if head.prefix_compose is not None else None
            if head.prefix_composition != "gated" or (gate is not None and gate.per != "example"):
                per_token = ", gated per token" if gate is not None and gate.per != "example" else ""
                reasons.append(f"{path}: a prefix composed by {head.prefix_composition}{per_token}")
            with torch.no_grad():
                kv = head.prefix.all_kv()[head.prefix_index]
            key = entry["prefix"] = f"m{len(modules)}"
            _, kv_heads, size, head_dim = kv.shape
            modules[key] = {"kind": "prefix", "kv_heads": kv_heads, "size": size, "head_dim": head_dim}
            tensors[f"petl.{key}.kv"] = kv
            if gate is not None:
                modules[key] |= {"gate": "example", "dim": gate.proj.in_features}
                tensors |= {f"petl.{key}.gate.weight": gate.proj.weight, f"petl.{key}.gate.bias": gate.proj.bias}
                entry["reads"] = _layer_of(path, inputs)[0]
        if head.mh is not None:
            entry["mh"] = _mh_adapter(head.mh, path, modules, tensors, reasons)
        attention.append(entry)
    prompt = model.petl.prompt
    if prompt is not None and (prompt.position_gate is not None or prompt.at != 1):
        reasons.append("a soft prompt gated per position, or not after the first token")
    pooling = model.petl.pooling
    if reasons:
        raise ConfigError("the carrier cannot rebuild " + "; ".join(reasons))
    reads_pooler = getattr(model.base_model, "pooler", None) is not None
    head_config = stock_head_fields(model, pooling) or {}  # a head that pools by its config (ModernBERT)
    description = {
        "pooling": "native" if head_config else pooling,
        "head_config": head_config,
        "reads_pooler": reads_pooler,
        "rules": {key: int(a.shape[0]) for key, a in rules.values()},
        "modules": modules,
        "edits": edits,
        "attention": attention,
        "prompt": {"length": prompt.embeddings.shape[0], "dim": prompt.embeddings.shape[1], "at": 1}
        if prompt
        else None,
    }
    tensors |= {f"rules.{key}": a for key, a in rules.values()}
    if prompt is not None:
        tensors["prompt"] = prompt.embeddings
    return description, {k: v.detach().float().contiguous() for k, v in tensors.items()}


def _mh_adapter(mh, path: str, modules: dict, tensors: dict, reasons: list[str]) -> str:
    """Describe the multi-head adapter ``mh`` at ``path`` into ``modules`` and ``tensors`` (a gated
    one is a reason the carrier cannot rebuild it); returns its key."""
    heads, size, head_dim = mh.keys.shape
    compose, t = _compose(mh.compose, path, reasons)
    if compose["gate"] or mh.position_gate is not None:
        reasons.append(f"{path}: a gated multi-head adapter")
    key = f"m{len(modules)}"
    modules[key] = {"kind": "mh_adapter", "heads": heads, "size": size, "head_dim": head_dim, "compose": compose}
    tensors |= {f"petl.{key}.keys": mh.keys, f"petl.{key}.values": mh.values}
    tensors |= {f"petl.{key}.{k}": v for k, v in t.items()}
    return key


def write_remote_code(model, directory: Path, task, staging: Path, base_name: None = None) -> dict:
    """The folder: modeling_petl.py, config.json (``auto_map``, ``base``, ``petl``), the weights."""
    from . import modeling_petl

    try:
        description, tensors = describe(model, task)
    except ConfigError as e:
        raise ConfigError(f"{directory}: {e}") from None
    labels = model.petl.info.get("labels")
    plain = remove_petl(model, warn=False)  # the backbone with its trained biases, LayerNorms and head
    base = plain.config.to_dict() | description["head_config"]
    base.pop("_attn_implementation_autoset", None)
    if task.kind == "classification" and labels:
        base |= {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}
    config = modeling_petl.PetlCarrierConfig(base=base, petl=description)
    config.auto_map = {
        "AutoConfig": "modeling_petl.PetlCarrierConfig",
        AUTO_CLASS: "modeling_petl.PetlForSequenceClassification",
    }
    carrier = modeling_petl.PetlForSequenceClassification(config)
    state = {f"model.{k}": v.detach().float() for k, v in plain.state_dict().items()} | tensors
    missing, unexpected = carrier.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{directory}: {TARGET}: the carrier's weights differ ({missing[:3]} {unexpected[:3]})")
    carrier.save_pretrained(str(staging))
    shutil.copyfile(MODELING, staging / MODELING.name)
    return {"modules": len(description["modules"]), "pooling": description["pooling"], "code": MODELING.name}


# Run in a new process by the check: the folder loaded as a user loads it, the logits of a batch.
_CHECK = f"""import json, sys, torch
from transformers import {AUTO_CLASS}
batch = {{k: torch.tensor(v) for k, v in json.loads(sys.stdin.read()).items()}}
model = {AUTO_CLASS}.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    print(json.dumps(model(**batch).logits.float().tolist()))
"""


class FreshProcess(nn.Module):
    """The check's view of a written folder: loaded and run in a new Python process, as a user
    loads it, with no petl-nas imported and no module state shared with this one (an in-process
    load once passed a folder that a fresh process computed otherwise)."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self.device_anchor = nn.Parameter(torch.zeros(()), requires_grad=False)  # where the check puts inputs

    def forward(self, **batch):
        result = subprocess.run(
            [sys.executable, "-c", _CHECK, str(self.folder)],
            input=json.dumps({k: v.tolist() for k, v in batch.items()}),
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=600,
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise ConfigError(f"{TARGET}: the written folder does not load in a new process: {last}")
        return SimpleNamespace(logits=torch.tensor(json.loads(result.stdout.strip().splitlines()[-1])))


def reload_remote_code(staging: Path, directory: Path, backbone, task, overrides: dict):
    """As the printed lines load it, in a new process (`FreshProcess`)."""
    return FreshProcess(staging)


def remote_code_load_lines(out: str, max_length: int) -> str:
    """The lines that load the folder and give the logits of a list of ``texts``."""
    return "\n".join(
        [
            f"from transformers import {AUTO_CLASS}, AutoTokenizer",
            f"model = {AUTO_CLASS}.from_pretrained({out!r}, trust_remote_code=True).eval()  "
            f"# runs {MODELING.name} from the folder: read it first",
            f"tok = AutoTokenizer.from_pretrained({out!r}, trust_remote_code=True)  # its config's class is there too",
            f"logits = model(**tok(texts, padding=True, truncation=True, max_length={max_length}, "
            "return_tensors='pt')).logits",
        ]
    )


__all__ = ["TARGET", "describe", "write_remote_code", "reload_remote_code", "remote_code_load_lines"]
