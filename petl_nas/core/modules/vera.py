"""VeRA (Kopiczko et al., ICLR 2024): frozen random A, B shared by every weight a module spec adapts,
and per weight two trained vectors, Δh = b ⊙ B(d ⊙ A x).

The rule it keeps: A and B are buffers drawn from the spec's ``seed`` exactly as PEFT's `VeraConfig`
draws them from ``projection_prng_key`` (one CPU generator, A then B, Kaiming uniform, sized to the
largest weight adapted), so they are rebuilt wherever the seed is known and never saved or counted.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModuleSpec
from .compose import Composition

D_INITIAL = 0.1  # d's start (the paper's and PEFT's ``d_initial``); b starts at 0, so Δh = 0


def kaiming_uniform(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """U(-√(6/fan_in), √(6/fan_in)) with fan_in = shape[1], drawn from ``generator`` on the CPU."""
    bound = math.sqrt(6.0 / shape[1])
    return torch.empty(shape, device="cpu").uniform_(-bound, bound, generator=generator)


class VeraBases(nn.Module):
    """The shared frozen projections of one module spec: A (r × in) and B (out × r), in and out the
    largest of every weight it adapts. A weight of another shape that needs more redraws both from
    the seed (its layers slice them at each forward, so they follow)."""

    def __init__(self, rank: int, seed: int):
        super().__init__()
        self.rank, self.seed = rank, seed
        self.register_buffer("A", torch.empty(rank, 0), persistent=False)
        self.register_buffer("B", torch.empty(0, rank), persistent=False)

    def need(self, in_features: int, out_features: int) -> None:
        """Make A and B wide enough for an in × out weight."""
        width, height = max(self.A.shape[1], in_features), max(self.B.shape[0], out_features)
        if (width, height) == (self.A.shape[1], self.B.shape[0]):
            return
        device = self.A.device
        if device.type == "meta":  # counting: shapes only
            self.A, self.B = torch.empty(self.rank, width, device=device), torch.empty(height, self.rank, device=device)
            return
        generator = torch.Generator(device="cpu").manual_seed(self.seed)
        a = kaiming_uniform((self.rank, width), generator)
        b = kaiming_uniform((height, self.rank), generator)
        self.A, self.B = a.to(device=device, dtype=self.A.dtype), b.to(device=device, dtype=self.B.dtype)


class VeRA(nn.Module):
    """Δh = b ⊙ B[:out] (s·d ⊙ A[:, :in] x): d (r) starts at `D_INITIAL`, b (out) at 0. A fixed or
    learned s and UniPELT's gate act on the r-wide intermediate (scalars: exact, and cheaper)."""

    def __init__(self, spec: ModuleSpec, bases: VeraBases, in_features: int, out_features: int, causal: bool = False):
        super().__init__()
        bases.need(in_features, out_features)
        self.bases = [bases]  # a reference, not a submodule: the group holds it once
        self.in_features, self.out_features = in_features, out_features
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        self.d = nn.Parameter(torch.full((spec.size,), D_INITIAL))
        self.b = nn.Parameter(torch.zeros(out_features))
        self.compose = Composition(spec, in_features, causal)

    def projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This weight's slices of the shared A (r × in) and B (out × r)."""
        bases = self.bases[0]
        return bases.A[:, : self.in_features], bases.B[: self.out_features]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        a, b = self.projections()
        u = F.linear(self.dropout(x), a.to(self.d.dtype)) * self.d  # [..., r]
        return F.linear(self.compose(u, x, mask), b.to(self.d.dtype)) * self.b

    def scale(self) -> torch.Tensor | float:
        """s: the learned scalar, or the fixed one."""
        return self.compose.scale if self.compose.scale is not None else self.compose.fixed_scale

    def delta_weight(self) -> torch.Tensor:
        """s·diag(b)·B·diag(d)·A, the update to merge into W [out, in] (ungated)."""
        a, b = self.projections()
        return self.scale() * ((self.b[:, None] * b) @ (self.d[:, None] * a))
