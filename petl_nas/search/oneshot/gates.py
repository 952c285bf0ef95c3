"""Hard-concrete gates (Louizos et al., 2018): L0 gates that are exactly 0 or 1 most of the time.

Why these: a gate's chance of being open, P(z > 0), is a smooth function of its parameter, so the
expected deployable count Σ P(open)·cost is differentiable and can be held to a budget; the
samples are exactly 0 (the component is off, its parameters get no gradient through it) or
exactly 1 much of the time, so what trains is close to what is read off. S3Delta's shifted
sigmoid needs a bi-level search with a held-out split instead; these train on one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

BETA, LOW, HIGH = 2 / 3, -0.1, 1.1  # temperature and stretch interval (the paper's values)
SHIFT = math.log(-LOW / HIGH)
CLOSED = -20.0  # log α of a gate that is shut for good


class HardConcrete(nn.Module):
    """``n`` gates. `sample` draws z (training) or sets the deterministic z (eval); `z` reads it.

    log α is stored divided by ``speed``: with Adam, whose steps do not depend on a gradient's
    scale, the gates then move ``speed`` times as fast as the weights they gate. ``temperature``
    (β) sets how sharply a sample falls to 0 or 1: lower is closer to a coin flip of 0 and 1.
    """

    def __init__(self, n: int, init_open: float = 0.9, speed: float = 1.0, temperature: float = BETA):
        super().__init__()
        p = min(max(init_open, 1e-4), 1 - 1e-4)
        self.speed, self.temperature = float(speed), float(temperature)
        self.raw = nn.Parameter(torch.full((n,), (math.log(p / (1 - p)) + self.temperature * SHIFT) / self.speed))
        self._z: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_z": None}  # this forward's draw: not copied or pickled

    @property
    def log_alpha(self) -> torch.Tensor:
        return self.raw * self.speed

    def set_log_alpha(self, value) -> None:
        with torch.no_grad():
            self.raw.copy_(torch.as_tensor(value, dtype=self.raw.dtype).expand_as(self.raw) / self.speed)
        self._z = None

    def load_raw(self, raw: torch.Tensor) -> None:
        """Stored parameters back exactly (as `raw` held them); the next forward draws anew."""
        with torch.no_grad():
            self.raw.copy_(raw)
        self._z = None

    def retune(self, speed: float | None = None, temperature: float | None = None) -> None:
        """A new speed or temperature, each gate keeping its chance of being open."""
        value = self.log_alpha.detach().clone()
        if temperature is not None:  # P(open) = σ(log α − β·shift): shift log α with β
            value += (float(temperature) - self.temperature) * SHIFT
            self.temperature = float(temperature)
        if speed is not None:
            self.speed = float(speed)
        self.set_log_alpha(value)

    def sample(self) -> None:
        if self.training:
            u = torch.rand_like(self.log_alpha).clamp(1e-6, 1 - 1e-6)
            s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / self.temperature)
        else:
            s = torch.sigmoid(self.log_alpha)
        self._z = (s * (HIGH - LOW) + LOW).clamp(0.0, 1.0)

    def z(self) -> torch.Tensor:
        if self._z is None:
            self.sample()
        return self._z

    def p_open(self) -> torch.Tensor:
        """P(z > 0) of each gate: differentiable in log α."""
        return torch.sigmoid(self.log_alpha - self.temperature * SHIFT)

    def close(self) -> None:
        self.set_log_alpha(CLOSED)


__all__ = ["HardConcrete", "CLOSED"]
