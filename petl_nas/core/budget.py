"""Exact parameter counts of a configuration, before any weight is allocated.

The count runs the real injection code (`apply_petl`) on a backbone built on the ``meta`` device,
so it is exact by construction and costs milliseconds. Two figures:

- **trainable**: what the optimiser updates during training (the prefix reparameterisation MLP,
  not its output);
- **deployable**: what is shipped after training (prefixes flattened to 2·l·d per layer). Budgets
  apply to this one by default, as the papers count.

Both exclude the task head, which every method trains (with a trained pooler, when the
configuration's pooling is ``pooler_trained``); it is counted separately, shown beside them, and no
budget applies to it.

Example:
    >>> count = count_parameters(BertConfig(), preset("lora"))   # doctest: +SKIP
    >>> count.deployable                                          # doctest: +SKIP
    294912
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.initialization import no_init_weights

from ..errors import ConfigError
from .config import PetlConfig
from .head import pooler_parameters
from .inject import PetlRoot, apply_petl, petl_root, remove_petl
from .modules import PrefixEncoder


@dataclass(frozen=True)
class CountRow:
    name: str
    trainable: int
    deployable: int


@dataclass(frozen=True)
class ParameterCount:
    """Counts of one configuration on one backbone."""

    trainable: int
    deployable: int
    backbone: int
    head: int
    rows: tuple[CountRow, ...] = field(default=())

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable / self.backbone

    @property
    def deployable_pct(self) -> float:
        return 100.0 * self.deployable / self.backbone

    def table(self) -> str:
        """The per-module table as aligned text."""
        lines = [f"{'module':<28}{'trainable':>14}{'deployable':>14}"]
        for r in self.rows:
            lines.append(f"{r.name:<28}{r.trainable:>14,}{r.deployable:>14,}")
        lines.append(f"{'total (PETL)':<28}{self.trainable:>14,}{self.deployable:>14,}")
        lines.append(f"{'% of backbone':<28}{self.trainable_pct:>13.3f}%{self.deployable_pct:>13.3f}%")
        lines.append(f"{'task head (no budget)':<28}{self.head:>14,}")
        lines.append(f"{'backbone':<28}{self.backbone:>14,}")
        return "\n".join(lines)


def _numel(params) -> int:
    return sum(p.numel() for p in params)


def _group_rows(root: PetlRoot) -> list[CountRow]:
    rows = []
    for name, group in root.groups.items():
        trainable = _numel(group.parameters())
        deployable = trainable
        for enc in (m for m in group.modules() if isinstance(m, PrefixEncoder)):
            deployable += enc.deploy_numel() - _numel(enc.parameters())
        rows.append(CountRow(name, trainable, deployable))
    if root.prompt is not None:
        n = _numel(root.prompt.parameters())
        rows.append(CountRow("prompt", n, n))
    return rows


def count_model(model: nn.Module) -> ParameterCount:
    """Counts for a model that already has PETL modules applied."""
    root = petl_root(model, "count_model")
    petl_ids = {id(p) for p in root.parameters()}
    base_ids = {id(p) for p in model.base_model.parameters()}
    # The backbone: the base model, whatever head sits on it (the denominator of every budget and
    # percentage, as `count_parameters` measures it). The head: what trains beside PETL outside it
    # (a classifier, a pooler); a frozen pretrained head (an untied LM head) is neither.
    backbone_params = [p for p in model.parameters() if id(p) not in petl_ids and id(p) in base_ids]
    backbone_ids = {id(p) for p in backbone_params}
    rows = _group_rows(root)
    cfg = root.config
    pooler_ids = {id(p) for p in pooler_parameters(model, root.pooling)}  # trained with the head
    bias_ids = set()
    if cfg.bitfit:
        named = [
            (n, p) for n, p in model.base_model.named_parameters() if id(p) in backbone_ids and id(p) not in pooler_ids
        ]
        biases = [p for n, p in named if n.endswith("bias")]
        bias_ids = {id(p) for p in biases}
        rows.append(CountRow("bitfit (biases)", _numel(biases), _numel(biases)))
    if cfg.train_layernorms:
        norms = [p for p in backbone_params if p.requires_grad and id(p) not in bias_ids | pooler_ids]
        rows.append(CountRow("layernorms", _numel(norms), _numel(norms)))
    head = _numel(
        p
        for p in model.parameters()
        if (id(p) not in backbone_ids and id(p) not in petl_ids and p.requires_grad) or id(p) in pooler_ids
    )
    return ParameterCount(
        trainable=sum(r.trainable for r in rows),
        deployable=sum(r.deployable for r in rows),
        backbone=_numel(backbone_params),
        head=head,
        rows=tuple(rows),
    )


_META_CACHE: dict[str, nn.Module] = {}


def meta_model(model_config, num_labels: int | None = None) -> nn.Module:
    """A sequence-classification model of ``model_config`` on the meta device (cached per config).

    A family without a classification head is built bare; PETL counts do not depend on the head.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    cfg = copy.deepcopy(model_config)
    if num_labels is not None:
        cfg.num_labels = num_labels
    key = cfg.to_json_string(use_diff=False)
    if key not in _META_CACHE:
        with torch.device("meta"), no_init_weights():
            try:
                _META_CACHE[key] = AutoModelForSequenceClassification.from_config(cfg)
            except ValueError:  # no classification head for this family
                _META_CACHE[key] = AutoModel.from_config(cfg)
        # no_init_weights also skips tying: tie shared embeddings (BART, T5) so they count once.
        _META_CACHE[key].tie_weights()
    return _META_CACHE[key]


_POSITION_TABLE = re.compile(r"(^|\.)(position_embeddings|wpe|embed_positions)$")


def position_limit(model_config) -> int | None:
    """The longest input the backbone's learned absolute positions cover (BERT 512, BART 1024), read
    off its position tables on the meta device; None where positions are relative or rotary (T5,
    Llama), which have no such table. A table's first rows may be reserved: RoBERTa's up to its
    padding index, BART's and OPT's ``offset`` of 2."""
    limits = []
    for name, module in meta_model(model_config).named_modules():
        if isinstance(module, nn.Embedding) and _POSITION_TABLE.search(name):
            reserved = getattr(module, "offset", 0) + (0 if module.padding_idx is None else module.padding_idx + 1)
            limits.append(module.num_embeddings - reserved)
    return min(limits) if limits else None


def check_positions(model_config, max_length: int, where: str = "max_length") -> None:
    """Refuse a ``max_length`` beyond the backbone's positions before anything trains (every batch
    of a longer text would fail inside the model)."""
    limit = position_limit(model_config)
    if limit is not None and max_length > limit:
        raise ConfigError(
            f"{where} {max_length:,} is more than the {limit:,} positions this backbone "
            f"({model_config.model_type}) can read: give at most {limit:,}"
        )


def count_parameters(model_config, config: PetlConfig, num_labels: int | None = None) -> ParameterCount:
    """Exact counts of ``config`` on the backbone described by ``model_config`` (a transformers config).

    Builds nothing in memory: the backbone lives on the meta device and is reused across calls.
    """
    model = meta_model(model_config, num_labels)
    apply_petl(model, config)
    try:
        return count_model(model)
    finally:
        remove_petl(model, warn=False)  # the meta model is only counted


def refusal(model_config, config: PetlConfig) -> str | None:
    """Why this backbone cannot take ``config`` at all (its `ConfigError`: BitFit without biases, a
    prefix where attention is not reachable), or None when it can. A space may allow forms a
    backbone refuses; a search treats such draws as invalid, not as an error."""
    try:
        count_parameters(model_config, config)
    except ConfigError as e:
        return str(e)
    return None


def fits(model_config, config: PetlConfig, budget: int | None) -> bool:
    """Does ``config`` fit ``budget`` deployable parameters (None: no budget) on this backbone? A
    configuration the backbone refuses (`refusal`) fits no budget."""
    try:
        return budget is None or count_parameters(model_config, config).deployable <= budget
    except ConfigError:
        return False


def fitted(model_config, config: PetlConfig, budget: int | None, n_layers: int) -> PetlConfig | None:
    """The largest shape of ``config`` within ``budget``: itself when it fits; else its modules on the
    most top layers that fit at their smallest size (1, or the form's size step), then the largest
    size up to their own at which those layers still fit. None when no shape of it fits (or it has
    no module to shrink). The rule every per-budget baseline is built by (LoRA r=1 on q, v of the
    top layers; FourierFT on q, v with the n that fits)."""
    import dataclasses

    from .forms import form_named

    if fits(model_config, config, budget):
        return config
    if not config.modules:
        return None

    def shaped(size_of, top: int) -> PetlConfig:
        layers = tuple(range(n_layers - top, n_layers))
        return dataclasses.replace(
            config,
            modules=tuple(
                dataclasses.replace(m, size=size_of(m), layers=layers if top < n_layers else m.layers)
                for m in config.modules
            ),
        )

    def step(m) -> int:
        return form_named(m.form).size_step(dataclasses.asdict(m)) if form_named(m.form).sized else m.size

    top = next((k for k in range(n_layers, 0, -1) if fits(model_config, shaped(step, k), budget)), None)
    if top is None:
        return None
    lo, hi = 1, max(m.size // step(m) for m in config.modules)  # in units of each module's step
    while lo < hi:  # the largest multiple that fits
        mid = (lo + hi + 1) // 2
        if fits(model_config, shaped(lambda m: min(m.size, mid * step(m)), top), budget):
            lo = mid
        else:
            hi = mid - 1
    return shaped(lambda m: min(m.size, lo * step(m)), top)


def applies(model_config, config: PetlConfig) -> bool:
    """Can ``config`` be applied to this backbone (`refusal` is None)?"""
    return refusal(model_config, config) is None


__all__ = [
    "position_limit",
    "check_positions",
    "ParameterCount",
    "CountRow",
    "count_parameters",
    "count_model",
    "meta_model",
    "applies",
    "refusal",
    "fits",
    "fitted",
]
