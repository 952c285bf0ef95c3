"""The task head as part of the configuration: how a classifier pools the sequence, its dropout.

A sequence classifier reads one vector per example. transformers' BERT head reads [CLS] through
``bert.pooler`` (a dense layer + tanh trained by next-sentence prediction); RoBERTa, DistilBERT,
ELECTRA and DeBERTa read the first token into their own (new, trained) head; ModernBERT pools as
its config's ``classifier_pooling`` says (``cls`` or ``mean``). Sentence-transformers
checkpoints were trained to be read by *mean pooling* instead, and their pooler may never have
been trained at all (all-MiniLM-L6-v2's has an all-zero bias and Gaussian weights): frozen, it
feeds the classifier noise. ``pooling`` chooses:

- ``auto``: what the checkpoint says: a sentence-transformers ``1_Pooling/config.json`` (mean or
  [CLS]) when there is one, else the architecture's own head (``pooler`` on BERT-likes, the
  config's ``classifier_pooling`` on ModernBERT, ``cls`` on the others);
- ``cls``: the last hidden state of the first token, straight into the classifier;
- ``mean``: the mean of the last hidden states over the example's real tokens;
- ``pooler``: [CLS] through the frozen pretrained pooler (BERT-likes only);
- ``pooler_trained``: the same pooler, trained with the head (its parameters count as head).

Implemented as a forward hook on the base model that replaces what the head reads (its
``pooler_output``, or the first position of ``last_hidden_state`` for first-token heads), or, for a
head that pools by its config, by setting that field while PETL is applied; so no head is rewritten
and the classifier's pretrained or new weights stay where transformers put them.
Decoder-only and encoder-decoder models keep their own head: the setting does not apply to them.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError, PetlWarning
from .config import POOLINGS

_WARNED: set[str] = set()


def checkpoint_pooling(path) -> str | None:
    """``mean`` or ``cls`` from a sentence-transformers ``1_Pooling/config.json`` under ``path``."""
    if not path:
        return None
    config = Path(str(path)) / "1_Pooling" / "config.json"
    if not config.is_file():
        return None
    try:
        modes = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if modes.get("pooling_mode_mean_tokens"):
        return "mean"
    if modes.get("pooling_mode_cls_token"):
        return "cls"
    return None  # max / weighted pooling: not offered here


def _pooler(model: nn.Module) -> nn.Module | None:
    return getattr(model.base_model, "pooler", None)


def _configured_pooling(model: nn.Module) -> str | None:
    """``cls`` or ``mean`` for a head that pools by its config (ModernBERT's ``classifier_pooling``)."""
    mode = getattr(model.config, "classifier_pooling", None)
    return mode if mode in ("cls", "mean") else None


def native_pooling(model: nn.Module) -> str:
    """What the architecture's own classification head reads: its pooler, the pooling its config
    names, or the first token."""
    return "pooler" if _pooler(model) is not None else _configured_pooling(model) or "cls"


def resolve_pooling(requested: str, model: nn.Module, sequence_model: bool = True) -> str:
    """The concrete pooling ``requested`` means on ``model`` (``auto`` looks at the checkpoint).

    ``sequence_model``: the backbone pools a sequence for a classifier (encoder-only). Other
    families keep their own head (the last token of a decoder, an LM head for generation), so
    one space can serve every backbone: the setting does not apply to them.
    """
    if not sequence_model:
        return "native"
    if requested == "auto":
        return checkpoint_pooling(getattr(model, "name_or_path", None)) or native_pooling(model)
    if requested in ("pooler", "pooler_trained") and _pooler(model) is None:
        raise ConfigError(f"pooling: the {model.config.model_type} classifier has no pooler; accepted: auto, cls, mean")
    return requested


def pooler_parameters(model: nn.Module, pooling: str) -> list[nn.Parameter]:
    """The pooler's parameters when they train with the head (``pooler_trained``), else none."""
    pooler = _pooler(model)
    return list(pooler.parameters()) if pooling == "pooler_trained" and pooler is not None else []


def untrained_pooler(model: nn.Module) -> bool:
    """A pooler whose bias is exactly zero was never trained (or was missing from the checkpoint)."""
    pooler = _pooler(model)
    dense = getattr(pooler, "dense", None)
    bias = getattr(dense, "bias", None)
    return bias is not None and bias.device.type != "meta" and not bool(bias.detach().any())


class _ConfigField:
    """A config field set for as long as PETL is applied; ``remove()`` (as a hook handle) restores it."""

    def __init__(self, config, name: str, value):
        self.config, self.name, self.previous = config, name, getattr(config, name)
        setattr(config, name, value)

    def remove(self) -> None:
        setattr(self.config, self.name, self.previous)


def install_pooling(model: nn.Module, pooling: str, pad_mask, handles: list) -> None:
    """Make the classifier read ``pooling`` (resolved); ``pad_mask()`` gives this forward's mask."""
    if pooling in ("native", "pooler", "pooler_trained"):
        name = getattr(model, "name_or_path", "") or model.config.model_type
        if pooling == "pooler" and name not in _WARNED and untrained_pooler(model):
            _WARNED.add(name)  # once per process and checkpoint
            warnings.warn(
                f"{name}: the frozen pooler looks "
                f"untrained (its bias is all zeros), so the classifier reads noise; set pooling: "
                f"mean (or cls, pooler_trained)",
                PetlWarning,
                stacklevel=3,
            )
        return
    if _configured_pooling(model) is not None:  # the head pools as its config says: say ours
        handles.append(_ConfigField(model.config, "classifier_pooling", pooling))
        return
    reads_pooler = _pooler(model) is not None
    if pooling == "cls" and not reads_pooler:
        return  # first-token heads already read [CLS]
    pool = functools.partial(_pool, pooling, pad_mask, reads_pooler)  # no closure: a deep copy rebinds it
    handles.append(model.base_model.register_forward_hook(pool, with_kwargs=True))


def _pool(pooling: str, pad_mask, reads_pooler: bool, mod, args, kwargs, out):
    """The base model's forward hook: what the classifier reads, pooled as ``pooling`` says."""
    h = out["last_hidden_state"]  # [B, L, d]
    if pooling == "mean":
        mask = pad_mask()
        if mask is None or mask.shape != h.shape[:2]:
            vector = h.mean(dim=1)
        else:
            m = mask.to(h.dtype).unsqueeze(-1)
            vector = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
    else:
        vector = h[:, 0]
    if reads_pooler:
        out["pooler_output"] = vector
    else:  # first-token heads read position 0
        out["last_hidden_state"] = torch.cat([vector.unsqueeze(1), h[:, 1:]], dim=1)
    return out


def stock_head_fields(model: nn.Module, pooling: str) -> dict | None:
    """The config fields under which the architecture's own head reads ``pooling`` (resolved) with
    no petl-nas hook: ``{}`` when it already does, ``{"classifier_pooling": ...}`` for a head that
    pools by its config; None when only the hook can (mean or [CLS] into a pooler head, mean into a
    first-token head). A model saved for other tools reads what it was trained on only if not None."""
    if pooling in ("native", "pooler", "pooler_trained"):
        return {}
    if _configured_pooling(model) is not None:
        return {"classifier_pooling": pooling}
    if pooling == "cls" and _pooler(model) is None:
        return {}
    return None


def head_parameters(model: nn.Module, pooling: str) -> list[nn.Parameter]:
    """The trained head: trainable tensors outside the base model and PETL, plus a trained pooler."""
    base = {id(p) for p in model.base_model.parameters()}
    pooler = {id(p) for p in pooler_parameters(model, pooling)}
    return [
        p
        for n, p in model.named_parameters()
        if p.requires_grad and not n.startswith("petl.") and (id(p) not in base or id(p) in pooler)
    ]


def set_head_dropout(model: nn.Module, p: float | None) -> None:
    """Set the dropout of the classification head (every dropout outside the base model)."""
    if p is None:
        return
    base = {id(m) for m in model.base_model.modules()}
    for m in model.modules():
        if isinstance(m, nn.Dropout) and id(m) not in base:
            m.p = p


def start_regression_at_mean(model: nn.Module, mean: float) -> bool:
    """Start a new regression head at the training mean: the output layer's bias set to ``mean``.

    A new head predicts about 0 and AdamW moves a bias by about one learning rate per step, so on
    labels far from 0 (STS-B's 0-5) a short trial spends itself walking toward the mean and its
    correlation says nothing. Only a head whose output bias is still all zero (as transformers
    initialises it) is changed; one without a bias (GPT-2's ``score``) is left as it is. Returns
    whether the bias was set.
    """
    inside = {id(m) for m in model.base_model.modules()}
    if isinstance(getattr(model, "petl", None), nn.Module):
        inside |= {id(m) for m in model.petl.modules()}
    outputs = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside and m.out_features == 1]
    if not outputs or outputs[-1].bias is None:
        return False
    bias = outputs[-1].bias
    if bias.detach().any():  # trained already: not a new head
        return False
    with torch.no_grad():
        bias.fill_(float(mean))
    return True


__all__ = [
    "POOLINGS",
    "checkpoint_pooling",
    "native_pooling",
    "resolve_pooling",
    "pooler_parameters",
    "untrained_pooler",
    "install_pooling",
    "stock_head_fields",
    "head_parameters",
    "set_head_dropout",
    "start_regression_at_mean",
]
