"""LoKr (LyCORIS): a weight update s·(W₁ ⊗ W₂), a Kronecker product of a small full factor W₁ and a
factor W₂ = W₂ₐ·W₂ᵦ of rank r (full when r is at least half its larger side), shaped as PEFT shapes it."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModuleSpec
from .compose import Composition


def factor_pair(dim: int) -> tuple[int, int]:
    """(m, n) with m·n = ``dim`` and m ≤ n as close as can be: m the largest divisor not above √dim
    (PEFT's ``factorization`` with ``decompose_factor=-1``; 384 -> (16, 24), a prime p -> (1, p))."""
    m = max(k for k in range(1, math.isqrt(dim) + 1) if dim % k == 0)
    return m, dim // m


def lokr_shapes(in_features: int, out_features: int, rank: int) -> tuple[tuple[int, int], tuple[int, int], bool]:
    """(W₁'s shape, W₂'s shape, whether W₂ is a rank-``rank`` product) of one [out, in] weight:
    W₁ is (out₁, in₁) and W₂ (out₂, in₂) with out = out₁·out₂, in = in₁·in₂ (`factor_pair`)."""
    (out1, out2), (in1, in2) = factor_pair(out_features), factor_pair(in_features)
    return (out1, in1), (out2, in2), rank < max(out2, in2) / 2


def lokr_count(in_features: int, out_features: int, rank: int) -> int:
    """Trained parameters of one LoKr weight: out₁·in₁ + (r·(out₂ + in₂) or out₂·in₂)."""
    (a, b), (c, d), low_rank = lokr_shapes(in_features, out_features, rank)
    return a * b + (rank * (c + d) if low_rank else c * d)


class LoKr(nn.Module):
    """Δh = s·x·(W₁ ⊗ W₂)ᵀ, computed without building W₁ ⊗ W₂: x as [in₁, in₂] gives W₁·X·W₂ᵀ.

    Init ``lora`` (PEFT's default): W₁ = 0 (so Δh = 0 at the start), W₂'s factors Kaiming-uniform;
    ``bert``: W₁ ~ N(0, 0.02) as well.
    """

    def __init__(self, spec: ModuleSpec, in_features: int, out_features: int, causal: bool = False):
        super().__init__()
        (a, b), (c, d), low_rank = lokr_shapes(in_features, out_features, spec.size)
        self.in_shape, self.low_rank = (b, d), low_rank
        self.W1 = nn.Parameter(torch.zeros(a, b))
        if spec.init == "bert":
            nn.init.normal_(self.W1, std=0.02)
        if low_rank:
            self.W2_a = nn.Parameter(torch.empty(c, spec.size))
            self.W2_b = nn.Parameter(torch.empty(spec.size, d))
            nn.init.kaiming_uniform_(self.W2_a, a=math.sqrt(5))
            nn.init.kaiming_uniform_(self.W2_b, a=math.sqrt(5))
        else:
            self.W2 = nn.Parameter(torch.empty(c, d))
            nn.init.kaiming_uniform_(self.W2, a=math.sqrt(5))
        self.compose = Composition(spec, in_features, causal)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W₁, W₂)."""
        w2 = self.W2_a @ self.W2_b if self.low_rank else self.W2
        return self.W1, w2

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        X = x.unflatten(-1, self.in_shape)  # [..., in₁, in₂]
        if self.low_rank:
            y = (X @ self.W2_b.t()) @ self.W2_a.t()  # [..., in₁, out₂]
        else:
            y = X @ self.W2.t()
        delta = (self.W1 @ y).flatten(-2)  # [..., out₁·out₂]
        return self.compose(delta, x, mask)

    def delta_weight(self) -> torch.Tensor:
        """s·(W₁ ⊗ W₂), [out, in] (fixed or learned s; ungated)."""
        s = self.compose.scale if self.compose.scale is not None else self.compose.fixed_scale
        return s * torch.kron(*self.factors())
