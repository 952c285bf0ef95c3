"""How a module's output Δh joins the representation: add, scaled (fixed or learned s), UniPELT gate.

Shared by every form, so composition is one dimension with one implementation.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModuleSpec

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "swish": nn.SiLU,
    "identity": nn.Identity,
}


class Gate(nn.Module):
    """UniPELT's gate g(x) = σ(W·x + b), one scalar per token, computed from the module's input."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., 1]
        return torch.sigmoid(self.proj(x))

    def log(self, x: torch.Tensor) -> torch.Tensor:
        """log g(x), stable for closed gates (used as an attention-logit bias)."""
        return nn.functional.logsigmoid(self.proj(x))


class Composition(nn.Module):
    """Multiplies Δh by s (fixed, or a learned scalar) and by the gate g(x) when the spec has one."""

    def __init__(self, spec: ModuleSpec, gate_dim: int):
        super().__init__()
        self.fixed_scale = spec.scale if spec.composition == "scaled" and not spec.learn_scale else 1.0
        self.scale = nn.Parameter(torch.tensor(float(spec.scale))) if spec.learn_scale else None
        self.gate = Gate(gate_dim) if spec.gate else None

    def forward(self, delta: torch.Tensor, gate_input: torch.Tensor | None = None) -> torch.Tensor:
        if self.scale is not None:
            delta = delta * self.scale
        elif self.fixed_scale != 1.0:
            delta = delta * self.fixed_scale
        if self.gate is not None:
            delta = delta * self.gate(gate_input)
        return delta


def init_bert_(linear: nn.Linear) -> None:
    nn.init.normal_(linear.weight, std=0.02)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def init_zero_(linear: nn.Linear) -> None:
    nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
