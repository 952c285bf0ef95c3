"""He et al.'s multi-head parallel adapter: per head, Δhᵢ = relu(qᵢ·Pₖᵢᵀ)·Pᵥᵢ added to the head output.

It is prefix tuning with relu instead of a softmax, composed by addition rather than the λ gate;
2·l·d parameters per layer. Pᵥ starts at zero, so the model is unchanged at the start.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModuleSpec
from .compose import Composition, as_param_dtype


class MultiHeadAdapter(nn.Module):
    def __init__(self, spec: ModuleSpec, heads: int, head_dim: int, causal: bool = False):
        super().__init__()
        self.keys = nn.Parameter(torch.randn(heads, spec.size, head_dim) * head_dim**-0.5)
        self.values = nn.Parameter(torch.zeros(heads, spec.size, head_dim))
        self.compose = Composition(spec, heads * head_dim, causal)
        self.position_gate = None  # the one-shot supernet's: one gate in [0, 1] per position

    def forward(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        # query [B, H, Lq, D] -> Δ [B, H, Lq, D]. The scaling goes on the l keys, not on the B·Lq
        # queries; under autocast the query is not cast either (`as_param_dtype`): on a GPU both
        # were full-size passes (and a strided copy) forward and backward, at every layer.
        q = as_param_dtype(query, self.keys.dtype)
        values = self.values
        if self.position_gate is not None:  # relu attention has no normaliser: a zero value row is no position
            values = values * self.position_gate().to(values.dtype)[None, :, None]
        return torch.relu(q @ (self.keys * scaling).transpose(-1, -2)) @ values
