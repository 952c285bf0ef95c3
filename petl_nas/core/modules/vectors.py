"""Modules that rescale or renormalise what the backbone computes, adding no projection of their own:
(IA)³'s learned vectors (Liu et al., 2022) and LN-tuning's trained LayerNorm copies (Qi et al., 2022).

Each starts as the identity (vectors of ones; a copy of the norm as the backbone holds it), so the
model is unchanged until a step moves them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..backbones import OutSlice


class ScaleOutput(nn.Module):
    """h ⊙ l on a linear's output, written as the update h·(l − 1) that a ``sequential`` edit adds;
    on a fused projection, on its slice only (``out_slice``)."""

    def __init__(self, width: int, out_slice: OutSlice | None = None):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.out_slice = out_slice

    def forward(self, out: torch.Tensor, mask=None) -> torch.Tensor:
        s = self.out_slice
        if s is None:
            return out * (self.scale - 1)
        part = out.unflatten(-1, (s.groups, s.size))[..., s.start : s.start + s.width].flatten(-2)
        return s.pad(part * (self.scale - 1))


class ScaleInput(nn.Module):
    """x ⊙ l on a linear's input (an ``input`` edit): (IA)³'s scaled FFN activations before W2."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class NormCopy(nn.Module):
    """A trained copy of one of the backbone's norms that computes its output in its place (a
    ``replace`` edit); the backbone's own stays frozen, so switching PETL off gives it back."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = copy.deepcopy(norm)
        for hooks in (self.norm._forward_hooks, self.norm._forward_pre_hooks):
            hooks.clear()

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        return self.norm(x)


__all__ = ["ScaleOutput", "ScaleInput", "NormCopy"]
