"""FourierFT (Gao et al., ICML 2024): ΔW = s·real(ifft2(S)), S an out × in spectrum that is zero
except at n fixed random frequencies, where it holds the n trained coefficients.

The rule it keeps: the frequencies are a buffer drawn from the spec's ``seed`` exactly as PEFT's
`FourierFTConfig` draws them from ``random_loc_seed`` (the first n of a seeded permutation of the
out·in entries), so they are rebuilt wherever the seed is known and never saved or counted. The
coefficients start as PEFT's do: N(0, 1) (``init: bert``, its default and the paper's), or zero
(``init: lora``, PEFT's ``init_weights: true``: ΔW = 0 at the start).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import ConfigError
from ..config import ModuleSpec
from .compose import Composition


@functools.lru_cache(maxsize=16)
def _locations(seed: int, out_features: int, in_features: int, n: int) -> torch.Tensor:
    entries = torch.randperm(out_features * in_features, generator=torch.Generator().manual_seed(seed))[:n]
    return torch.stack([entries // in_features, entries % in_features])


def frequencies(seed: int, out_features: int, in_features: int, n: int) -> torch.Tensor:
    """[2, n]: the rows and columns of the n trained entries of an out × in spectrum (PEFT's ``indices``).
    Every weight of one shape gets the same ones, as in PEFT (one seed for all)."""
    return _locations(seed, out_features, in_features, n).clone()


class FourierFT(nn.Module):
    """Δh = s·x·ΔWᵀ with ΔW = real(ifft2(S)) [out, in]; s (fixed or learned) and UniPELT's gate scale Δh."""

    def __init__(self, spec: ModuleSpec, in_features: int, out_features: int, causal: bool = False):
        super().__init__()
        n = spec.size
        if n > in_features * out_features:
            raise ConfigError(
                f"module {spec.key}: fourierft size n={n} exceeds the {out_features}×{in_features} "
                f"entries of the weight it adapts"
            )
        self.in_features, self.out_features = in_features, out_features
        device = torch.get_default_device()
        where = (
            torch.empty(2, n, dtype=torch.long, device=device)
            if device.type == "meta"
            else frequencies(spec.seed, out_features, in_features, n).to(device)
        )
        self.register_buffer("where", where, persistent=False)
        self.spectrum = nn.Parameter(torch.zeros(n) if spec.init == "lora" else torch.randn(n))
        self.compose = Composition(spec, in_features, causal)
        self.peft_scaling = spec.scale if spec.composition == "scaled" else 1.0  # PEFT's ``scaling``

    def unscaled_delta(self) -> torch.Tensor:
        """real(ifft2(S)) [out, in], in the coefficients' dtype (the transform itself in fp32)."""
        dense = torch.zeros(self.out_features, self.in_features, device=self.spectrum.device)
        dense[self.where[0], self.where[1]] = self.spectrum.float()
        return torch.fft.ifft2(dense).real.to(self.spectrum.dtype)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.compose(F.linear(x, self.unscaled_delta()), x, mask)

    def scale(self) -> torch.Tensor | float:
        """s: the learned scalar, or the fixed one (PEFT's ``scaling``)."""
        return self.compose.scale if self.compose.scale is not None else self.compose.fixed_scale

    def delta_weight(self) -> torch.Tensor:
        """s·real(ifft2(S)), the update to merge into W [out, in] (ungated)."""
        return self.scale() * self.unscaled_delta()
