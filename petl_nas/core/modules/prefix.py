"""Prefix tuning's parameters: per-layer prefix keys/values, flat or through a reparameterisation MLP.

With ``reparam = b > 0`` one MLP (Li & Liang) maps l learned embeddings to every covered layer's keys
and values: l·d + (d·b + b) + (b·2·L·d_kv + 2·L·d_kv) trainable parameters. For deployment the MLP
is evaluated once and the result kept as flat vectors: 2·l·d_kv per layer (`deploy_numel`).
The attention-side use of the prefix lives in `head_attention.py`.
"""

from __future__ import annotations

import torch
from torch import nn


class PrefixEncoder(nn.Module):
    """Produces [n_layers, 2, H_kv, l, D] prefix keys/values, computed once per model forward."""

    def __init__(
        self, n_layers: int, kv_heads: int, head_dim: int, length: int, reparam: int, hidden: int, flat: bool = False
    ):
        super().__init__()
        self.shape = (n_layers, 2, kv_heads, length, head_dim)
        self.reparam = reparam
        self._cache: tuple[torch.Tensor, ...] | None = None  # per layer, this forward
        if reparam and not flat:
            self.embedding = nn.Parameter(torch.randn(length, hidden))
            self.mlp = nn.Sequential(
                nn.Linear(hidden, reparam), nn.Tanh(), nn.Linear(reparam, n_layers * 2 * kv_heads * head_dim)
            )
            self.flat = None
        else:
            self.flat = nn.Parameter(torch.randn(*self.shape) * 0.5)

    def deploy_numel(self) -> int:
        n, two, h, l, d = self.shape
        return n * two * h * l * d

    def clear(self) -> None:
        self._cache = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_cache": None}  # this forward's: not copied or pickled

    def all_kv(self) -> torch.Tensor:
        """Every covered layer's prefix keys and values, [n_layers, 2, H_kv, l, D]."""
        if self.flat is not None:
            return self.flat
        n, two, h, l, d = self.shape
        out = self.mlp(self.embedding)  # [l, n·2·h·d]
        return out.view(l, n, two, h, d).permute(1, 2, 3, 0, 4)

    @torch.no_grad()
    def flattened(self) -> torch.Tensor:
        """The deployable flat tensor (what the MLP currently produces)."""
        self.clear()
        kv = self.all_kv().detach().contiguous().clone()
        self.clear()
        return kv

    def layer_pair(self, index: int) -> torch.Tensor:
        """One layer's keys and values stacked, [2, H_kv, l, D]. All layers' are made once per model
        forward by one ``unbind`` (the MLP runs once; in backward one stack gathers every layer's
        gradient, where indexing each layer would build a zero-filled copy of the whole tensor per
        layer and add them up)."""
        if self._cache is None:
            self._cache = self.all_kv().unbind(0)
        return self._cache[index]

    def layer_kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.layer_pair(index)
        return kv[0], kv[1]  # each [H_kv, l, D]
