"""How a module's output Δh joins the representation: add, scaled (fixed or learned s), UniPELT gate.

Shared by every form, so composition is one dimension with one implementation.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from ..config import ModuleSpec
from .shared_read import read

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "swish": nn.SiLU,
    "identity": nn.Identity,
}


def as_param_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` ready for parameters of ``dtype``: cast outside autocast (fp32 masters reading a
    half-precision body's activations); unchanged under autocast, which casts each matmul's operands
    itself, so a cast here would be a kernel (and one more in backward) whose result autocast undoes."""
    if x.dtype == dtype or torch.is_autocast_enabled(x.device.type):
        return x
    return x.to(dtype)


class Gate(nn.Module):
    """UniPELT's gate σ(W·x + b) from the module's input x.

    ``per="example"`` is UniPELT's (and AdapterHub's) gate: the mean of σ(W·x_t + b) over an example's
    tokens, one scalar per example; padding tokens are left out of the mean when the padding mask is
    known, so a padded row is gated as the same row alone. ``per="token"`` keeps one scalar per token.
    Parameters stay in their own (fp32) dtype; the result has the input's dtype.
    """

    def __init__(self, dim: int, per: str = "example"):
        super().__init__()
        self.proj = nn.Linear(dim, 1)
        self.per = per

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, L, ..., d] -> [B, L, ..., 1] per token, or [B, 1, ..., 1] per example; computed with
        the other gates reading x where `inject` grouped them (`shared_read`)."""
        return read(self, as_param_dtype(x, self.proj.weight.dtype), mask)[1].to(x.dtype)

    def read_rows(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What x is projected with besides the gate (`shared_read.read`): nothing."""
        return [], []

    def read_gate(self) -> Gate:
        return self

    def from_logit(self, logit: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The gate from its logit W·x + b ([..., n] for n gates that compute alike: each column alone)."""
        g = torch.sigmoid(logit)
        return sequence_mean(g, mask) if self.per == "example" else g

    def log(self, x: torch.Tensor) -> torch.Tensor:
        """log g(x) per token, stable for closed gates (the per-token prefix gate's logit bias)."""
        return nn.functional.logsigmoid(self.proj(as_param_dtype(x, self.proj.weight.dtype))).to(x.dtype)


def sequence_mean(g: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``g`` [B, L, ...] over dim 1, keeping dims; only where ``mask`` [B, L] is 1 if it fits."""
    if mask is None or mask.shape != g.shape[:2]:
        return g.mean(dim=1, keepdim=True)
    return (g * mean_weights(mask, g.dtype, g.ndim)).sum(dim=1, keepdim=True)


_LAST_WEIGHTS: tuple = (None, None, None)


def mean_weights(mask: torch.Tensor, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    """``mask`` [B, L] as weights that sum to 1 over each row's real tokens, shaped [B, L, 1, ...]
    to ``ndim`` dims. Every per-example gate of one forward reads the same mask, so the weights are
    computed once and reused while the same (unmodified) mask tensor comes back: 4 kernels, and 4
    more in backward, saved per gate after the first. Under ``torch.compile`` the weights are
    computed inline instead: the compiler cannot trace the cache (it would break the graph at every
    gate) and removes the repeats itself."""
    global _LAST_WEIGHTS
    if torch.compiler.is_compiling():
        m = mask.to(dtype)
        return (m / m.sum(dim=1, keepdim=True).clamp(min=1)).view(*mask.shape, *([1] * (ndim - 2)))
    ref, key, weights = _LAST_WEIGHTS
    if ref is None or ref() is not mask or key != (mask._version, dtype, ndim):
        m = mask.to(dtype)
        weights = (m / m.sum(dim=1, keepdim=True).clamp(min=1)).view(*mask.shape, *([1] * (ndim - 2)))
        _LAST_WEIGHTS = (weakref.ref(mask), (mask._version, dtype, ndim), weights)
    return weights


class Composition(nn.Module):
    """Multiplies Δh by s (fixed, or a learned scalar) and by the gate g(x) when the spec has one.

    ``causal``: the module sits in a causal block, where a per-example gate would read later
    tokens, so its gate is per token. ``gate_mix`` (the one-shot supernet's, None otherwise)
    returns z in [0, 1] and makes the factor (1 − z) + z·g(x): the ungated module at z = 0, the
    gated one at z = 1.
    """

    def __init__(self, spec: ModuleSpec, gate_dim: int, causal: bool = False):
        super().__init__()
        self.fixed_scale = spec.scale if spec.composition == "scaled" and not spec.learn_scale else 1.0
        self.scale = nn.Parameter(torch.tensor(float(spec.scale))) if spec.learn_scale else None
        per = "token" if causal else spec.gate_per
        self.gate = Gate(gate_dim, per) if spec.gate else None
        self.gate_mix = None

    def forward(
        self,
        delta: torch.Tensor,
        gate_input: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        gate_value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """s·g·Δh; the gate from ``gate_input``, or ``gate_value`` when the caller read it with its own
        projection (`shared_read.read`)."""
        if self.scale is not None:
            delta = delta * self.scale
        elif self.fixed_scale != 1.0:
            delta = delta * self.fixed_scale
        return self.gated(delta, gate_input, mask, gate_value)

    def gated(
        self,
        delta: torch.Tensor,
        gate_input: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        gate_value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """g·Δh (Δh itself without a gate): the gate alone, for a module that applies s itself."""
        if self.gate is not None:
            g = gate_value if gate_value is not None else self.gate(gate_input, mask)
            if self.gate_mix is not None:
                z = self.gate_mix()
                g = (1 - z) + z * g
            delta = delta * g.to(delta.dtype)
        return delta


def init_bert_(linear: nn.Linear) -> None:
    nn.init.normal_(linear.weight, std=0.02)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def init_zero_(linear: nn.Linear) -> None:
    nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
