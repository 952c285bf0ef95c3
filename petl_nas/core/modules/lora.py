"""LoRA: a low-rank update W + s·B·A on one linear weight, computed beside it (never merged in training)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModuleSpec
from .compose import Composition, Gate
from .shared_read import read


class LoRA(nn.Module):
    """Δh = s·(x·Aᵀ)·Bᵀ with A: r×in (Kaiming) and B: out×r (zeros), so Δh = 0 at the start.

    With a gate, Δh = g(x)·s·(x·Aᵀ)·Bᵀ; UniPELT's gated LoRA has s = 1 (the gate replaces alpha/r).
    """

    def __init__(self, spec: ModuleSpec, in_features: int, out_features: int, causal: bool = False):
        super().__init__()
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        self.A = nn.Parameter(torch.empty(spec.size, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, spec.size))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        if spec.init == "bert":
            nn.init.normal_(self.B, std=0.02)
        self.compose = Composition(spec, in_features, causal)

    def read_rows(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """What x is projected with (`shared_read.read`): A."""
        return [self.A], [None]

    def read_gate(self) -> Gate | None:
        return self.compose.gate

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # s and the gate are per-token (or per-example) scalars: applying them to the rank-r
        # intermediate is exact and r/out times cheaper than scaling the full-width output.
        if not isinstance(self.dropout, nn.Identity):
            return self.compose(self.dropout(x) @ self.A.t(), x, mask) @ self.B.t()
        u, g = read(self, x, mask)  # x·Aᵀ and the gate, maybe shared with q, k, v's
        return self.compose(u, mask=mask, gate_value=g) @ self.B.t()

    def delta_weight(self) -> torch.Tensor:
        """s·B·A, the update to merge into W (ungated, fixed-or-learned s)."""
        s = self.compose.scale if self.compose.scale is not None else self.compose.fixed_scale
        return s * (self.B @ self.A)
