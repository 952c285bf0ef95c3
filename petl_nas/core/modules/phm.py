"""Compacter's PHM layer: W = Σᵢ Aᵢ ⊗ Bᵢ with shared "slow" Aᵢ (n×n) and per-layer rank-k "fast" Bᵢ = sᵢ·tᵢᵀ.

A Compacter module is the bottleneck adapter of `adapter.py` with both projections made PHM layers;
one rule tensor A (n×n×n) is shared by every PHM layer of the module, as in Mahabadi et al.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from ...errors import ConfigError
from ..config import ModuleSpec
from .compose import ACTIVATIONS, Composition


class SharedRule(nn.Module):
    """The slow weights A: n matrices of n×n, shared across layers and projections.

    The rule also builds the weights of every PHM layer that uses it, all of one shape in one
    batched product, when the first of them is needed in a forward (`weight_of`): 2 products for a
    Compacter module on every layer instead of 2 per layer and projection, and their backward alike.
    On a GPU, where a PETL step costs what its kernels cost, Compacter's per-layer products were
    most of its excess over the plain adapter (`bench/ops_per_step.py`)."""

    def __init__(self, n: int):
        super().__init__()
        self.A = nn.Parameter(torch.empty(n, n, n))
        nn.init.xavier_uniform_(self.A.view(n * n, n))
        self.users: list[PHMLinear] = []  # a plain list: the layers are not submodules of the rule
        self._built: dict[int, tuple[tuple, torch.Tensor]] = {}  # id(layer) -> (versions, W), each used once

    def clear(self) -> None:
        """Drop weights built but not used (the model's forward starts: `inject` calls this)."""
        self._built = {}

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_built": {}}  # this forward's: not copied or pickled

    def weight_of(self, layer: PHMLinear) -> torch.Tensor:
        """``layer``'s W, built with every layer of its shape the first time one of them asks. A
        weight is handed out once (a second forward builds again, with the graph autograd needs) and
        only while its tensors are unchanged since it was built."""
        entry = self._built.pop(id(layer), None)
        if entry is None or entry[0] != _versions(self, layer):
            self._build(layer)
            entry = self._built.pop(id(layer))
        return entry[1]

    def _build(self, layer: PHMLinear) -> None:
        group = [
            u
            for u in self.users
            if u.s.shape == layer.s.shape and u.t.shape == layer.t.shape and not parametrize.is_parametrized(u)
        ]  # a gated layer builds its own
        with torch.autocast(self.A.device.type, enabled=False):
            fast = torch.stack([u.s for u in group]) @ torch.stack([u.t for u in group])  # [G, n, in/n, out/n]
            w = torch.einsum("iab,gipq->gapbq", self.A, fast)  # [G, n, in/n, n, out/n]
            w = w.reshape(len(group), layer.in_features, layer.out_features)
        for u, weight in zip(group, w.unbind(0)):
            self._built[id(u)] = (_versions(self, u), weight)


def _versions(rule: SharedRule, layer: PHMLinear) -> tuple:
    return rule.A._version, layer.s._version, layer.t._version


class PHMLinear(nn.Module):
    """y = x·W + b with W = Σᵢ kron(Aᵢ, sᵢ·tᵢᵀ) of shape in×out; needs n | in and n | out."""

    def __init__(self, rule: SharedRule, in_features: int, out_features: int, n: int, rank: int, zero: bool = False):
        super().__init__()
        self.rule = [rule]  # a reference, not a submodule: the shared A is counted once
        rule.users.append(self)
        self.n, self.in_features, self.out_features = n, in_features, out_features
        self.s = nn.Parameter(torch.empty(n, in_features // n, rank))
        self.t = nn.Parameter(torch.empty(n, rank, out_features // n))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.normal_(self.s, std=0.02)
        nn.init.normal_(self.t, std=0.02) if not zero else nn.init.zeros_(self.t)

    def weight(self) -> torch.Tensor:
        """W in the parameters' dtype, built by the rule with its other layers (`SharedRule.weight_of`)
        except under ``torch.compile`` (which fuses the products itself) or one-shot gating (a
        parametrised s or t). Under autocast it is built outside it: the products are tiny, and s,
        t and A then need no casts (3 kernels, 3 more in backward), only W does, once."""
        if not (torch.compiler.is_compiling() or parametrize.is_parametrized(self)):
            return self.rule[0].weight_of(self)
        with torch.autocast(self.s.device.type, enabled=False):
            fast = self.s @ self.t  # [n, in/n, out/n]
            A = self.rule[0].A  # [n, n, n]
            w = torch.einsum("iab,ipq->apbq", A, fast)  # [n, in/n, n, out/n]
            return w.reshape(self.in_features, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused matmul-and-bias (addmm), in the compute dtype under autocast; ``x @ W + b`` took
        # two kernels and promoted a half-precision product back to fp32 through the fp32 bias
        return nn.functional.linear(x, self.weight().t(), self.bias)


class CompacterAdapter(nn.Module):
    """The bottleneck adapter with PHM projections (Compacter; FFN-only placement is Compacter++)."""

    def __init__(self, spec: ModuleSpec, dim: int, rule: SharedRule, causal: bool = False):
        super().__init__()
        n = spec.phm_n
        for what, value in (("hidden size", dim), ("size", spec.size)):
            if value % n:
                raise ConfigError(f"module {spec.key}: compacter needs the {what} ({value}) divisible by phm_n={n}")
        self.down = PHMLinear(rule, dim, spec.size, n, spec.phm_rank)
        self.act = ACTIVATIONS[spec.nonlinearity]()
        self.up = PHMLinear(rule, spec.size, dim, n, spec.phm_rank, zero=spec.init == "lora")
        self.compose = Composition(spec, dim, causal)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.compose(self.up(self.act(self.down(z))), z, mask)
