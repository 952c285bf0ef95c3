"""Backbone specs: where a model family keeps its layers, attention, q/k/v/o and FFN weights.

A new architecture is one `BackboneSpec` and one `register` call; nothing in the injection code
names a model family. Paths are attribute paths relative to ``model.base_model``'s layer list.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..config import ConfigError, _suggest


@dataclass(frozen=True)
class BackboneSpec:
    """Attribute paths of one model family (relative to one layer unless said otherwise).

    Attributes:
        model_types: ``config.model_type`` values this spec serves.
        layers: path from ``model.base_model`` to the list of transformer layers.
        attention: the module that calls transformers' attention interface (it sees q, k, v, mask);
            its first input is the attention sublayer's input x.
        q, k, v, o: the attention projections.
        ffn_in, ffn_out: the FFN's W1 and W2; ffn_in's input is the FFN sublayer's input x.
    """

    model_types: tuple[str, ...]
    layers: str
    attention: str
    q: str
    k: str
    v: str
    o: str
    ffn_in: str
    ffn_out: str

    def site(self, name: str) -> str:
        return getattr(self, name)


_REGISTRY: dict[str, BackboneSpec] = {}


def register(spec: BackboneSpec) -> BackboneSpec:
    for t in spec.model_types:
        _REGISTRY[t] = spec
    return spec


def supported_model_types() -> list[str]:
    return sorted(_REGISTRY)


def spec_for(model_type: str) -> BackboneSpec:
    """The spec serving ``model_type``; an unknown type gets the supported list."""
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise ConfigError(f"backbone: model type {model_type!r} has no backbone spec"
                          f"{_suggest(model_type, supported_model_types())}") from None


def layer_list(model: nn.Module) -> tuple[BackboneSpec, nn.ModuleList]:
    """The spec and the transformer layers of a transformers model."""
    spec = spec_for(getattr(model.config, "model_type", type(model).__name__))
    return spec, model.base_model.get_submodule(spec.layers)


from . import bert, distilbert  # noqa: E402,F401  (registration)

__all__ = ["BackboneSpec", "register", "spec_for", "supported_model_types", "layer_list"]
