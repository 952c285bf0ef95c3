"""One matmul for the modules of a layer that read the same input: LoRA's A, a gate's row, a parallel
adapter's down-projection.

At one layer LoRA on q, k and v, UniPELT's prefix gate and a parallel adapter at the attention all
read the attention sublayer's input x. Each alone reads x in its own narrow matmul, and in backward
each sends x its own full-width gradient to be summed, and its weights their own. A `SharedRead`
computes x·[W₁; W₂; …]ᵀ + [b₁; b₂; …] once, when the first of its readers asks, and hands every
other reader its columns when it asks with the same x: one matmul forward; backward, one for x's
gradient and one for the stacked weights'.

A reader is a module with ``read_rows()`` → (weight blocks [rᵢ, in], their biases [rᵢ] or None),
the rows it projects x with; all blocks of all readers are joined by one ``cat`` per forward.
Each reader's columns are handed out once, and only for the tensor (and version, and weights'
versions) they were computed from. A reader asking with another x computes its own columns (as in
a half-precision body run without autocast, where each reader gets its own fp32 copy of x), as
does every reader under ``torch.compile`` (which would otherwise trace the cache) or with
parametrized weights (the one-shot supernet's gates). `clear` (at every model forward, with the
other per-forward caches) drops what was not taken.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn.utils import parametrize


def read(reader: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x projected by ``reader``'s rows: its columns of a shared product when it has a group."""
    group = reader.__dict__.get("shared_read")
    return group.project(reader, x) if group is not None else _own(reader, x)


def _own(reader: nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight, bias = _joined(*reader.read_rows())
    return nn.functional.linear(x, weight, bias)


def _joined(weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> tuple:
    """One weight and one bias (None when no block has one) from row blocks: a ``cat`` only where
    there are several; zeros for the blocks without a bias (LoRA's A)."""
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    if all(b is None for b in biases):
        return weight, None
    if len(biases) == 1:
        return weight, biases[0]
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])


class SharedRead:
    """The readers of one input at one layer (see the module docstring)."""

    def __init__(self):
        self.readers: list[nn.Module] = []
        self._x = None                          # weakref to the input the waiting columns came from
        self._key: tuple = ()
        self._parts: dict[int, torch.Tensor] = {}

    def add(self, reader: nn.Module) -> None:
        self.readers.append(reader)
        reader.__dict__["shared_read"] = self   # a plain attribute: not a submodule, not saved

    def remove(self, reader: nn.Module) -> None:
        """Take ``reader`` out (`inject.merge_lora` folds it into the weight it updated)."""
        self.readers = [r for r in self.readers if r is not reader]
        reader.__dict__.pop("shared_read", None)
        self.clear()

    def clear(self) -> None:
        self._x, self._key, self._parts = None, (), {}

    def _shared(self) -> bool:
        return (len(self.readers) > 1 and not torch.compiler.is_compiling()
                and not any(parametrize.is_parametrized(r) for r in self.readers))

    def _versions(self, x: torch.Tensor) -> tuple:
        return (x._version, torch.is_grad_enabled(),
                *(p._version for r in self.readers for p in r.parameters()))

    def project(self, reader: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self._shared():
            return _own(reader, x)
        waiting = self._x() if self._x is not None else None
        if waiting is not None and self._parts:
            if waiting is x and self._key == self._versions(x) and id(reader) in self._parts:
                return self._parts.pop(id(reader))
            return _own(reader, x)              # another input's columns wait: leave them be
        rows = [r.read_rows() for r in self.readers]
        weight, bias = _joined([w for ws, _ in rows for w in ws], [b for _, bs in rows for b in bs])
        sizes = [sum(w.shape[0] for w in ws) for ws, _ in rows]
        parts = nn.functional.linear(x, weight, bias).split(sizes, dim=-1)
        self._parts = {id(r): p for r, p in zip(self.readers, parts)}
        own = self._parts.pop(id(reader))
        self._x, self._key = weakref.ref(x), self._versions(x)
        return own


__all__ = ["SharedRead", "read"]
