"""Backbone specs: where a model family keeps its layers, attention, q/k/v/o and FFN weights.

A spec is a tuple of *blocks*, one per kind of attention (He et al.'s N_attn): ``encoder``
(encoder self-attention), ``decoder`` (decoder self-attention; the one block of a decoder-only
model) and ``cross`` (the decoder's cross-attention). Each block names its layer list (relative to
``model.base_model``), and relative to one layer: the module that calls transformers' attention
interface, the q/k/v/o projections and, except for ``cross``, the FFN of the same layers.

A new architecture is one file in this package holding a `BackboneSpec` and its `register` call
(every module here is imported at start-up); nothing in the injection code names a model family.
Two spellings cover the odd layers:
- a fused projection is ``"attn.c_attn[0/3]"``: output slice 0 of 3 equal slices (GPT-2's qkv), or
  ``"qkv_proj[1/num_attention_heads+num_key_value_heads+num_key_value_heads]"``: slices in the ratio
  of those config values (Phi-3's q, k and v under grouped-query attention), or
  ``"attention.query_key_value[0/3 per num_attention_heads]"``: the output is one group per head,
  each holding its q, k and v rows in turn (GPT-NeoX), and the slice is part 0 of every group;
- a gated FFN lists several W1 paths: ``ffn_in=("mlp.gate_proj", "mlp.up_proj")``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn

from ...errors import ConfigError, suggest

_SLICE = re.compile(r"^(?P<path>[\w.]+)\[(?P<part>\d+)/(?P<parts>\d+|\w+(?:\+\w+)+)(?: per (?P<groups>\w+))?\]$")


class OutSlice(NamedTuple):
    """Where a slice of a fused projection sits in its output: rows ``start`` to ``start + width``
    of each of ``groups`` consecutive groups of ``size`` rows (one group unless interleaved)."""

    groups: int
    start: int
    width: int
    size: int

    def pad(self, delta: torch.Tensor) -> torch.Tensor:
        """[..., groups·width] -> [..., groups·size]: the slice's update, zero elsewhere."""
        edges = (self.start, self.size - self.start - self.width)
        if self.groups == 1:
            return nn.functional.pad(delta, edges)
        return nn.functional.pad(delta.unflatten(-1, (self.groups, self.width)), edges).flatten(-2)

    def rows(self, weight: torch.Tensor) -> torch.Tensor:
        """A view of the slice's rows of a [groups·size, in] weight, shaped [groups, width, in]."""
        return weight.unflatten(0, (self.groups, self.size))[:, self.start : self.start + self.width]


class Site(NamedTuple):
    """One weight a module edits: a submodule path, and for a fused projection its output slice.

    ``sizes`` names the config attributes whose ratio splits the output when the slices are unequal
    (Phi-3's q/k/v under grouped-query attention: ``num_attention_heads+num_key_value_heads+...``).
    ``groups`` names the config attribute counting the groups the output is made of, each split
    alike (GPT-NeoX's per-head q, k, v: ``num_attention_heads``); empty for one group.
    """

    path: str
    part: int = 0
    parts: int = 1
    sizes: tuple[str, ...] = ()
    groups: str = ""

    @classmethod
    def parse(cls, text: str) -> Site:
        m = _SLICE.match(text)
        if not m:
            return cls(text)
        groups = m["groups"] or ""
        if m["parts"].isdigit():
            return cls(m["path"], int(m["part"]), int(m["parts"]), groups=groups)
        sizes = tuple(m["parts"].split("+"))
        return cls(m["path"], int(m["part"]), len(sizes), sizes, groups)

    def layout(self, total: int, config=None) -> tuple[int, int, int]:
        """(groups, start, width) of this slice within an output of ``total`` features: the slice is
        rows ``start`` to ``start + width`` of each of ``groups`` consecutive groups of equal size."""
        groups = getattr(config, self.groups) if self.groups else 1
        weights = [getattr(config, a) for a in self.sizes] if self.sizes else [1] * self.parts
        unit = total // groups // sum(weights)
        return groups, sum(weights[: self.part]) * unit, weights[self.part] * unit

    def out_slice(self, total: int, config=None) -> OutSlice | None:
        """Where this slice sits in an output of ``total`` features; None for a whole projection."""
        if self.parts == 1:
            return None
        groups, start, width = self.layout(total, config)
        return OutSlice(groups, start, width, total // groups)


def features(linear: nn.Module, site: Site = Site(""), config=None) -> tuple[int, int]:
    """(in, out) widths of a linear layer, or of its ``site`` slice (nn.Linear or transformers' Conv1D);
    ``config`` (the model's) resolves a slice given by config sizes."""
    if hasattr(linear, "in_features"):
        fan_in, fan_out = linear.in_features, linear.out_features
    else:  # Conv1D keeps weight as [in, out]: nx, nf
        fan_in, fan_out = linear.nx, linear.nf
    groups, _, width = site.layout(fan_out, config)
    return fan_in, groups * width


@dataclass(frozen=True)
class Block:
    """One kind of attention and, for encoder/decoder blocks, the FFN of the same layers.

    Attributes:
        name: ``encoder``, ``decoder`` or ``cross``.
        layers: path from ``model.base_model`` to the layer list.
        attention: the module that calls the attention interface (sees q, k, v and the mask);
            None where the family computes attention in its own code (no prefix, no multi-head adapter).
        q, k, v, o: the attention projections (a fused one as ``path[i/n]``).
        ffn_in: W1, whose input is the FFN sublayer's input x (two paths for a gated FFN).
        ffn_out: W2.
        heads: config attribute holding this block's number of query heads.
        attn_norm, ffn_norm: the LayerNorm (or RMSNorm) that belongs to the attention sublayer and
            the one that belongs to the FFN, before it (pre-LN) or after it (post-LN, BERT); None
            where the spec does not say (forms that edit a norm refuse such a backbone).
    """

    name: str
    layers: str
    attention: str | None
    q: str
    k: str
    v: str
    o: str
    ffn_in: tuple[str, ...] = ()
    ffn_out: str | None = None
    heads: str = "num_attention_heads"
    attn_norm: str | None = None
    ffn_norm: str | None = None

    def sites(self, role: str) -> tuple[Site, ...]:
        """The modules behind a role: q, k, v, o, ffn_in, ffn_out, attn_norm or ffn_norm."""
        value = getattr(self, role)
        return tuple(Site.parse(p) for p in (value if isinstance(value, tuple) else (value,)))

    @property
    def stack(self) -> str:
        """Path of the stack module that owns the layer list (``encoder.layers`` -> ``encoder``)."""
        return self.layers.rpartition(".")[0]


@dataclass(frozen=True)
class BackboneSpec:
    """Where one model family keeps what PETL modules edit.

    Attributes:
        model_types: ``config.model_type`` values this spec serves.
        blocks: its attention kinds, encoder first.
        when: for a family with variants, the config predicate that selects this one
            (T5 v1.1's gated FFN); specs are tried in registration order.
        scales_ids_in_stack: the stack that takes the prompt multiplies token embeddings by its
            ``embed_scale`` in its own forward, and only when it is given ids (Marian, Pegasus):
            a prompted input, handed over as embeddings, gets that scale on its tokens here.
    """

    model_types: tuple[str, ...]
    blocks: tuple[Block, ...]
    when: Callable[[object], bool] | None = None
    scales_ids_in_stack: bool = False

    def block(self, name: str) -> Block:
        return next(b for b in self.blocks if b.name == name)

    @property
    def encoder_decoder(self) -> bool:
        return {"encoder", "decoder"} <= {b.name for b in self.blocks}

    @property
    def decoder_only(self) -> bool:
        return [b.name for b in self.blocks] == ["decoder"]


_REGISTRY: dict[str, list[BackboneSpec]] = {}


def register(spec: BackboneSpec) -> BackboneSpec:
    for t in spec.model_types:
        _REGISTRY.setdefault(t, []).append(spec)
    return spec


def supported_model_types() -> list[str]:
    return sorted(_REGISTRY)


def spec_for(model_config) -> BackboneSpec:
    """The spec serving a transformers config (or a model type); an unknown type gets the supported list."""
    model_type = model_config if isinstance(model_config, str) else getattr(model_config, "model_type", None)
    if model_type not in _REGISTRY:
        raise ConfigError(
            f"backbone: model type {model_type!r} has no backbone spec{suggest(model_type, supported_model_types())}"
        )
    specs = _REGISTRY[model_type]
    if isinstance(model_config, str):  # no config to choose a variant by: the plain one
        return next((s for s in specs if s.when is None), specs[0])
    return next(s for s in specs if s.when is None or s.when(model_config))


def stacks(model: nn.Module) -> tuple[BackboneSpec, dict[str, nn.ModuleList]]:
    """The spec of a transformers model and each block's layer list."""
    spec = spec_for(model.config)
    return spec, {b.name: model.base_model.get_submodule(b.layers) for b in spec.blocks}


def depths(spec: BackboneSpec, layers: dict[str, nn.ModuleList]) -> dict[str, dict[str, int]]:
    """Blocks and their depths per position, as `PetlConfig.check_backbone` takes them."""
    return {
        "attn": {b.name: len(layers[b.name]) for b in spec.blocks},
        "ffn": {b.name: len(layers[b.name]) for b in spec.blocks if b.ffn_in},
    }


def _register_all() -> None:
    """Import every module of this package: a new backbone is a new file here, nothing else."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_register_all()

__all__ = [
    "BackboneSpec",
    "Block",
    "OutSlice",
    "Site",
    "features",
    "register",
    "spec_for",
    "supported_model_types",
    "stacks",
    "depths",
]
