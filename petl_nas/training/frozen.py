"""Frozen computation reused: the hidden states below a configuration's lowest trainable layer.

When nothing a trial trains sits in (or below) the first k layers of an encoder, those layers
compute the same function in every epoch and every trial: their output for a row depends only on
the backbone and the row. `FrozenReuse` computes it once per process for each split it sees
(train, search-dev, test), keeps it in memory up to a bound, and feeds it to layer k in place of
running layers 0..k-1; every epoch and every later trial with the same lowest layer reuses it.

The rule that makes a cache exact: **the embeddings and the layers below the lowest trainable one
run in eval mode** (no dropout) whenever reuse is on, cached or not. Dropout there is noise on the input of a trained
module, not learning; with it, a row's hidden state differs at every step and cannot be reused.
A split whose states would overflow the bound is recomputed every step under the same rule, so
a run's result does not depend on the bound (tested).

Where it applies: encoder-only backbones (one ``encoder`` block in `backbones`) trained for
classification or regression, whose layers return their hidden states. The lowest trainable
layer is found by a probe, not read off the configuration: one forward pass of two rows, in
eval mode and under a forked random state, records which layer's output first depends on a
trainable parameter. BitFit, trained LayerNorms and prompt tuning make the embeddings trainable
(k = 0: nothing to reuse); a head-only configuration has k = L (every layer reused).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from ..core.backbones import stacks
from ..core.precision import autocast_for

_STORE: OrderedDict[tuple, list[torch.Tensor]] = OrderedDict()  # (split id, fingerprint) -> per-row states
_SPLITS: dict[int, object] = {}  # keeps each cached split alive while its states are stored


class _StopForward(Exception):
    """Raised by the capture hook once layer k-1 has run: the layers above are not needed."""


@dataclass
class ReuseInfo:
    """What reuse did in one run: the first trainable layer, and per split whether it was cached."""

    layer: int
    cached: dict
    fill_s: float = 0.0

    def to_dict(self) -> dict:
        return {"layer": self.layer, "cached": dict(self.cached), "fill_s": round(self.fill_s, 3)}


def stored_mb() -> float:
    """Memory held by the process's cached states, in MiB."""
    return sum(t.numel() * t.element_size() for rows in _STORE.values() for t in rows) / 2**20


def clear() -> None:
    """Drop every cached state (tests; a worker switching backbones frees memory this way)."""
    _STORE.clear()
    _SPLITS.clear()


def encoder_layers(model: nn.Module, task_kind: str) -> nn.ModuleList | None:
    """The layer list reuse can skip, or None where it does not apply (generation, encoder-decoder,
    a model without an ``embeddings`` module below its layers)."""
    if task_kind not in ("classification", "regression") or not hasattr(model.base_model, "embeddings"):
        return None
    try:
        spec, layers = stacks(model)
    except Exception:  # a model without a backbone spec
        return None
    if [b.name for b in spec.blocks] != ["encoder"]:
        return None
    return layers["encoder"]


def lowest_trainable_layer(model: nn.Module, layers: nn.ModuleList, batch: dict, device) -> int | None:
    """The index of the first layer whose output depends on a trainable parameter (``len(layers)``
    when none does), or None when a layer's output is not a tensor (reuse cannot feed it)."""
    depends: list[bool] = []
    enters = []
    kinds_ok = [True]

    def before(module, args, kwargs):
        h = args[0] if args else kwargs.get("hidden_states")
        enters.append(bool(getattr(h, "requires_grad", False)))

    def after(module, args, output):
        kinds_ok[0] &= isinstance(output, torch.Tensor)
        h = output if isinstance(output, torch.Tensor) else output[0]
        depends.append(bool(h.requires_grad))

    handles = [layers[0].register_forward_pre_hook(before, with_kwargs=True)]
    handles += [layer.register_forward_hook(after) for layer in layers]
    was_training = model.training
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    try:
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), autocast_for(model, device):
            model(**{k: v[:2].to(device) for k, v in batch.items() if k != "labels"})
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if not kinds_ok[0]:
        return None
    if enters and enters[0]:
        return 0
    return next((i for i, d in enumerate(depends) if d), len(layers))


def _fingerprint(model: nn.Module, layers: nn.ModuleList, k: int, device) -> tuple:
    """Identifies what layers 0..k-1 compute: the embeddings' and those layers' weights (sums of
    values and squares, in float64), the backbone's name, the compute dtype and the device."""
    tensors = [t for m in (model.base_model.embeddings, *layers[:k]) for t in (*m.parameters(), *m.buffers())]
    sums = tuple(round(float(t.detach().double().sum()), 6) for t in tensors)
    squares = round(float(sum(t.detach().double().pow(2).sum() for t in tensors if t.is_floating_point())), 6)
    autocast = autocast_for(model, device)
    dtype = getattr(autocast, "fast_dtype", None)
    return (
        getattr(model.config, "name_or_path", ""),
        model.config.model_type,
        k,
        str(dtype),
        torch.device(device).type,
        len(tensors),
        sums,
        squares,
    )


class FrozenReuse:
    """Feeds layer k of one training run the cached output of layer k-1 (see the module docstring).

    Use: `FrozenReuse.prepare` (None where reuse does not apply), `train_mode` instead of
    ``model.train()``, `feeding(split, rows)` around each forward pass, `close` at the end.
    """

    def __init__(self, model: nn.Module, layers: nn.ModuleList, k: int, limit_mb: float, device):
        self.model, self.layers, self.k, self.limit_mb = model, layers, k, limit_mb
        self.device = torch.device(device)
        self.key = _fingerprint(model, layers, k, device)
        self.info = ReuseInfo(layer=k, cached={})
        self._current: list[torch.Tensor] | None = None
        self._rows: list[int] | None = None
        self._patched = False

    @classmethod
    def prepare(cls, model: nn.Module, task_kind: str, sample_split, limit_mb: float, device) -> FrozenReuse | None:
        """Reuse for ``model`` (PETL applied), or None where it does not apply or nothing is frozen."""
        layers = encoder_layers(model, task_kind)
        if layers is None or not len(sample_split):
            return None
        batch = next(sample_split.batches(2))
        k = lowest_trainable_layer(model, layers, batch, device)
        if not k:
            return None
        return cls(model, layers, k, limit_mb, device)

    # -- modes -----------------------------------------------------------------------------------
    def train_mode(self) -> None:
        """``model.train()``, with the embeddings and the layers below the lowest trainable one in
        eval mode (no dropout)."""
        self.model.train()
        self.model.base_model.embeddings.eval()
        for layer in self.layers[: self.k]:
            layer.eval()

    # -- the cache -------------------------------------------------------------------------------
    def cache(self, split, name: str, batch_size: int = 128) -> bool:
        """Compute (or find) the states of every row of ``split``; False when over the memory bound."""
        key = (id(split), self.key)
        if key in _STORE:
            _STORE.move_to_end(key)
            self.info.cached[name] = True
            return True
        need_mb = self._estimate_mb(split)
        if need_mb > self.limit_mb:
            self.info.cached[name] = False
            return False
        while _STORE and stored_mb() + need_mb > self.limit_mb:  # least recently used first
            old, _ = _STORE.popitem(last=False)
            if not any(k[0] == old[0] for k in _STORE):
                _SPLITS.pop(old[0], None)
        start = time.perf_counter()
        _STORE[key] = self._compute(split, batch_size)
        _SPLITS[id(split)] = split
        self.info.fill_s += time.perf_counter() - start
        self.info.cached[name] = True
        return True

    def _estimate_mb(self, split) -> float:
        tokens = sum(len(ids) for ids in split.input_ids)
        width = self.model.config.hidden_size
        return tokens * width * 4 / 2**20  # fp32 states (autocast keeps LayerNorm outputs fp32)

    def _compute(self, split, batch_size: int) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [None] * len(split)
        captured = []

        def grab(module, args, output):
            captured.append(output)
            raise _StopForward

        handle = self.layers[self.k - 1].register_forward_hook(grab)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), autocast_for(self.model, self.device):
                for rows, batch in split.row_batches(batch_size, order=split.by_length()):
                    captured.clear()
                    with contextlib.suppress(_StopForward):
                        self.model(**{k: v.to(self.device) for k, v in batch.items() if k != "labels"})
                    states = captured[0]
                    for j, i in enumerate(rows):
                        n = len(split.input_ids[i])
                        out[i] = states[j, :n].detach().clone()
        finally:
            handle.remove()
            self.model.train(was_training)
        return out

    # -- feeding ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def feeding(self, split, rows: list[int]):
        """Within this context a forward pass of ``rows`` of ``split`` starts at layer k from the
        cache; a split with no cached states (over the bound, or a subset) runs every layer."""
        states = _STORE.get((id(split), self.key))
        if states is not None:
            self._attach()
            self._current, self._rows = states, rows
        try:
            yield
        finally:
            self._current, self._rows = None, None

    def _attach(self) -> None:
        if self._patched:
            return
        for i, layer in enumerate(self.layers[: self.k]):
            original = layer.forward
            layer.forward = self._first(original) if i == 0 else self._passthrough(original)
        self._patched = True

    def close(self) -> None:
        """Give every layer its own forward back (the trained model is used as usual afterwards)."""
        if self._patched:
            for layer in self.layers[: self.k]:
                del layer.forward
            self._patched = False

    def _first(self, original):
        def forward(hidden_states, *args, **kwargs):
            if self._current is None:
                return original(hidden_states, *args, **kwargs)
            width = hidden_states.shape[1]
            states = hidden_states.new_zeros(
                (len(self._rows), width, self._current[self._rows[0]].shape[-1]),
                dtype=self._current[self._rows[0]].dtype,
            )
            for j, i in enumerate(self._rows):
                row = self._current[i]
                states[j, : row.shape[0]] = row
            return states

        return forward

    def _passthrough(self, original):
        def forward(hidden_states, *args, **kwargs):
            if self._current is None:
                return original(hidden_states, *args, **kwargs)
            return hidden_states

        return forward


__all__ = ["FrozenReuse", "ReuseInfo", "lowest_trainable_layer", "encoder_layers", "stored_mb", "clear"]
