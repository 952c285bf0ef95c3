"""Bottleneck adapter Δh = f(z·W_down)·W_up (Houlsby, Pfeiffer, parallel and scaled parallel adapters).

Sequential insertion reads z = h (the sublayer output); parallel reads z = x (the sublayer input).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModuleSpec
from .compose import ACTIVATIONS, Composition, Gate, init_bert_, init_zero_
from .shared_read import read


class Bottleneck(nn.Module):
    """d -> r -> d with a nonlinearity; ``init='lora'`` makes Δh = 0 at the start."""

    def __init__(self, spec: ModuleSpec, dim: int, causal: bool = False):
        super().__init__()
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        self.down = nn.Linear(dim, spec.size)
        self.act = ACTIVATIONS[spec.nonlinearity]()
        self.up = nn.Linear(spec.size, dim)
        self.compose = Composition(spec, dim, causal)
        if spec.init == "lora":
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.down.bias)
            init_zero_(self.up)
        else:
            init_bert_(self.down)
            init_bert_(self.up)

    def read_rows(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What z is projected with (`shared_read.read`): W_down."""
        return [self.down.weight], [self.down.bias]

    def read_gate(self) -> Gate | None:
        return self.compose.gate

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(self.dropout, nn.Identity):
            return self.compose(self.up(self.act(self.down(self.dropout(z)))), z, mask)
        h, g = read(self, z, mask)  # maybe shared with LoRA and gates reading the same x
        return self.compose(self.up(self.act(h)), mask=mask, gate_value=g)
