"""DoRA: LoRA whose updated weight W + s·B·A is split into a direction and a trained magnitude m per
output row, the row norms of W + s·B·A treated as constants (Liu et al. 2024, §4.3; as PEFT does)."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModuleSpec
from .lora import LoRA
from .shared_read import read


class DoRA(LoRA):
    """Δh = (m/n − 1)·x·Wᵀ + (m/n)·s·x·Aᵀ·Bᵀ with n = ‖W + s·B·A‖ per row, detached, so that
    h + Δh = x·(m/n·(W + s·B·A))ᵀ + bias. m starts at n, so the model starts as LoRA's: unchanged
    under init ``lora`` (B = 0).

    A UniPELT gate g(x) multiplies the whole Δh. It is a ``weight`` edit (`petl_nas.core.inject`):
    the forward reads the linear's weight W and its output without bias x·Wᵀ beside x.
    """

    def __init__(self, spec: ModuleSpec, weight: torch.Tensor, causal: bool = False):
        out_features, in_features = weight.shape
        super().__init__(spec, in_features, out_features, causal)
        with torch.no_grad():
            self.magnitude = nn.Parameter(self.row_norms(weight.to(self.A.dtype)))

    def scale_value(self) -> torch.Tensor | float:
        return self.compose.scale if self.compose.scale is not None else self.compose.fixed_scale

    def row_norms(self, weight: torch.Tensor) -> torch.Tensor:
        """‖W + s·B·A‖ per output row, outside the graph."""
        with torch.no_grad():
            s = self.scale_value()
            s = s.detach() if torch.is_tensor(s) else s
            return torch.linalg.vector_norm(weight + s * (self.B @ self.A), dim=1)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
        base: torch.Tensor | None = None,
    ) -> torch.Tensor:
        gate_input = x
        if isinstance(self.dropout, nn.Identity):
            u, g = read(self, x, mask)  # x·Aᵀ and the gate, maybe shared with q, k, v's
        else:
            if self.training:  # as PEFT: both terms read the dropped-out x
                x = self.dropout(x)
                base = nn.functional.linear(x, weight)
            u, g = x @ self.A.t(), None
        lora = (u * self.scale_value()) @ self.B.t()
        factor = self.magnitude / self.row_norms(weight)
        return self.compose.gated((factor - 1) * base + factor * lora, gate_input, mask, g)

    def delta_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """m/‖W + s·B·A‖·(W + s·B·A) − W, the update to merge into ``weight`` W ([out, in])."""
        weight = weight.to(self.A.dtype)
        updated = weight + self.scale_value() * (self.B @ self.A)
        return (self.magnitude / self.row_norms(weight))[:, None] * updated - weight
