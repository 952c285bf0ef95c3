"""One matmul for the modules of a layer that read the same input: LoRA's A, a gate's row, a parallel
adapter's down-projection; one sigmoid and one pooling for the UniPELT gates among them.

At one layer LoRA on q, k and v, UniPELT's prefix gate and a parallel adapter at the attention all
read the attention sublayer's input x. Each alone reads x in its own narrow matmul, and in backward
each sends x its own full-width gradient to be summed, and its weights their own. A `SharedRead`
computes x·[W₁; W₂; …; w_g1; w_g2; …]ᵀ + b once, when the first of its readers asks, and hands
every other reader its columns when it asks with the same x: one matmul forward; backward, one
for x's gradient and one for the stacked weights'. The gates' logits sit side by side in the last
columns, so UniPELT's gates of one input (per example: σ, then the mean over real tokens) are
computed as one [B, L, n] → [B, 1, n] instead of n times (forward and backward).

A reader is a module with ``read_rows()`` → (weight blocks [rᵢ, in], their biases [rᵢ] or None),
the rows it projects x with, and ``read_gate()`` → the `compose.Gate` whose logit it takes from x
too (or None); `read` returns (the reader's columns, its gate's value). Each reader's share is
handed out once, and only for the tensor (and version, and weights' versions, and padding mask)
it was computed from. A reader asking with another x computes its own (as in a half-precision
body run without autocast, where each reader gets its own fp32 copy of x), as does every reader
under ``torch.compile`` (which would otherwise trace the cache) or with parametrized weights (the
one-shot supernet's gates). `clear` (at every model forward, with the other per-forward caches)
drops what was not taken.

On a GPU a product whose width is not a multiple of 8 (LoRA's 8 + 8 rows and three gates: 19;
an adapter's 48 rows and its gate: 49) falls off cuBLAS's fast kernels onto an unaligned one, forward
and backward; such a product gets zero rows up to the next multiple of 8 (`align_rows`), whose
columns are dropped (on one H200 a 768 -> 19 projection, forward and backward: 55.8 µs, padded to
24: 43.6 µs, `bench/results/gpu_kernels_ab_h200.md`).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn.utils import parametrize


def read(
    reader: nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(x projected by ``reader``'s rows, its gate's value from x and the [B, L] padding ``mask``):
    a share of its group's product when it has a group; None for what it lacks."""
    group = reader.__dict__.get("shared_read")
    return group.project(reader, x, mask) if group is not None else _own(reader, x, mask)


def align_rows(width: int, x: torch.Tensor) -> int:
    """Zero rows that bring a joined product of ``width`` columns of ``x`` to a multiple of 8 on a
    GPU; none on a CPU, where they would only be more work. (A lone block is never padded.)"""
    return -width % 8 if x.is_cuda else 0


def _own(reader: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> tuple:
    """A reader alone: its rows and its gate's row still in one product (on one CPU core a separate
    d -> 1 gate cost about half of a 48-wide down-projection, reading and back-propagating through
    all of x; joined, about nothing)."""
    weights, biases = reader.read_rows()
    gate = reader.read_gate()
    if gate is None:
        return nn.functional.linear(x, *_joined(weights, biases)), None
    dtype = weights[0].dtype if weights else gate.proj.weight.dtype
    width = sum(w.shape[0] for w in weights)
    pad = align_rows(width + 1, x) if weights else 0
    y = nn.functional.linear(
        x, *_joined([*weights, gate.proj.weight.to(dtype)], [*biases, gate.proj.bias.to(dtype)], pad)
    )
    if not weights:
        return None, gate.from_logit(y, mask)
    u, logit, *_ = y.split([width, 1, pad] if pad else [width, 1], dim=-1)  # backward: one cat
    return u, gate.from_logit(logit, mask)


def _joined(weights: list[torch.Tensor], biases: list[torch.Tensor | None], pad: int = 0) -> tuple:
    """One weight and one bias (None when no block has one) from row blocks and ``pad`` zero rows: a
    ``cat`` only where there are several; zeros for the blocks without a bias (LoRA's A)."""
    if pad:
        weights = [*weights, weights[0].new_zeros(pad, weights[0].shape[1])]
        biases = [*biases, None]
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    if all(b is None for b in biases):
        return weight, None
    if len(biases) == 1:
        return weight, biases[0]
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])


def _gate_values(gates: list, logits: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Each gate's value from the [..., n] logits of n gates: in one σ (and one pooling) when they
    compute alike (`Gate.from_logit` is per column), one at a time otherwise."""
    if len(gates) > 1 and all(g.per == gates[0].per for g in gates):
        return gates[0].from_logit(logits, mask).split(1, dim=-1)
    return tuple(g.from_logit(logit, mask) for g, logit in zip(gates, logits.split(1, dim=-1)))


class SharedRead:
    """The readers of one input at one layer (see the module docstring)."""

    def __init__(self):
        self.readers: list[nn.Module] = []
        self._x = None  # weakref to the input the waiting shares came from
        self._key: tuple = ()
        self._parts: dict[int, tuple] = {}

    def add(self, reader: nn.Module) -> None:
        self.readers.append(reader)
        reader.__dict__["shared_read"] = self  # a plain attribute: not a submodule, not saved

    def remove(self, reader: nn.Module) -> None:
        """Take ``reader`` out (`inject.merge_lora` folds it into the weight it updated)."""
        self.readers = [r for r in self.readers if r is not reader]
        reader.__dict__.pop("shared_read", None)
        self.clear()

    def clear(self) -> None:
        self._x, self._key, self._parts = None, (), {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_x": None, "_key": (), "_parts": {}}  # this forward's: not copied or pickled

    def _shared(self) -> bool:
        return (
            len(self.readers) > 1
            and not torch.compiler.is_compiling()
            and not any(parametrize.is_parametrized(r) for r in self.readers)
        )

    def _versions(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple:
        return (
            x._version,
            torch.is_grad_enabled(),
            id(mask),
            None if mask is None else mask._version,
            *(p._version for r in self.readers for p in r.parameters()),
        )

    def project(self, reader: nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple:
        if not self._shared():
            return _own(reader, x, mask)
        waiting = self._x() if self._x is not None else None
        if waiting is not None and self._parts:
            if waiting is x and self._key == self._versions(x, mask) and id(reader) in self._parts:
                return self._parts.pop(id(reader))
            return _own(reader, x, mask)  # another input's shares wait: leave them be
        rows = [r.read_rows() for r in self.readers]
        gates = [(i, g) for i, g in enumerate(r.read_gate() for r in self.readers) if g is not None]
        dtype = next((ws[0].dtype for ws, _ in rows if ws), gates[0][1].proj.weight.dtype if gates else None)
        sizes = [sum(w.shape[0] for w in ws) for ws, _ in rows]
        pad = align_rows(sum(sizes) + len(gates), x)
        weight, bias = _joined(
            [w for ws, _ in rows for w in ws] + [g.proj.weight.to(dtype) for _, g in gates],
            [b for _, bs in rows for b in bs] + [g.proj.bias.to(dtype) for _, g in gates],
            pad,
        )
        split = [*sizes, len(gates)] if gates else sizes
        parts = nn.functional.linear(x, weight, bias).split([*split, pad] if pad else split, dim=-1)
        values = dict.fromkeys(range(len(self.readers)))  # reader's index -> its gate's value
        if gates:
            values.update(zip((i for i, _ in gates), _gate_values([g for _, g in gates], parts[len(sizes)], mask)))
        self._parts = {
            id(r): (p if n else None, values[i]) for i, (r, p, n) in enumerate(zip(self.readers, parts, sizes))
        }
        own = self._parts.pop(id(reader))
        self._x, self._key = weakref.ref(x), self._versions(x, mask)
        return own


__all__ = ["SharedRead", "read"]
