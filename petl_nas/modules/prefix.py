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

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, length: int, reparam: int,
                 hidden: int, flat: bool = False):
        super().__init__()
        self.shape = (n_layers, 2, kv_heads, length, head_dim)
        self.reparam = reparam
        self._cache: torch.Tensor | None = None
        if reparam and not flat:
            self.embedding = nn.Parameter(torch.randn(length, hidden))
            self.mlp = nn.Sequential(nn.Linear(hidden, reparam), nn.Tanh(),
                                     nn.Linear(reparam, n_layers * 2 * kv_heads * head_dim))
            self.flat = None
        else:
            self.flat = nn.Parameter(torch.randn(*self.shape) * 0.5)

    def deploy_numel(self) -> int:
        n, two, h, l, d = self.shape
        return n * two * h * l * d

    def clear(self) -> None:
        self._cache = None

    def all_kv(self) -> torch.Tensor:
        if self.flat is not None:
            return self.flat
        if self._cache is None:
            n, two, h, l, d = self.shape
            out = self.mlp(self.embedding)                            # [l, n·2·h·d]
            self._cache = out.view(l, n, two, h, d).permute(1, 2, 3, 0, 4)
        return self._cache

    @torch.no_grad()
    def flattened(self) -> torch.Tensor:
        """The deployable flat tensor (what the MLP currently produces)."""
        self.clear()
        kv = self.all_kv().detach().contiguous().clone()
        self.clear()
        return kv

    def layer_kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.all_kv()[index]
        return kv[0], kv[1]                                           # each [H_kv, l, D]
