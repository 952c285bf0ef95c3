"""Reading configurations off a trained supernet, one per budget, each an exact count.

For a budget, the components (LoRA rank rows, adapter units, Compacter columns, prefix positions,
BitFit's biases) are taken most-likely-open first while the deployable count stays within the
budget (S3Delta's greedy hard selection, with our exact per-unit costs); the order, not a
threshold, decides: a short supernet run may leave every gate's chance low while still ranking
them. ``min_open`` leaves out components below a chance of opening. A module instance keeps the
units taken; its layers are grouped by the size they kept into ordinary ModuleSpecs (each
Compacter spec with its own shared rule, counted as it appears), so the result is a plain
PetlConfig, and `budget.count_parameters` checks its count against the one computed here.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import torch

from ..budget import count_parameters
from ..config import ModuleSpec, PetlConfig
from .supernet import BITFIT


def ladder(low: int, high: int, n: int = 10) -> list[int]:
    """``n`` budgets spaced evenly in log from ``low`` to ``high`` (both kept, no repeats)."""
    if n <= 1 or high <= low:
        return [high]
    out = [round(math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / (n - 1))) for i in range(n)]
    return sorted(set(out))


def derive(net, model_config, budget: int, head: PetlConfig | None = None, min_open: float = 0.0,
           num_labels: int | None = None) -> tuple[PetlConfig, int]:
    """The configuration ``net`` suggests within ``budget``, and its exact deployable count."""
    with torch.no_grad():
        probs = [u.gate.p_open().tolist() for u in net.units]
    order = sorted(((p, i, j) for i, ps in enumerate(probs) for j, p in enumerate(ps) if p > min_open),
                   key=lambda x: (-x[0], net.units[x[1]].unit_cost))
    kept: dict[int, int] = defaultdict(int)
    total = 0
    for _, i, _ in order:
        u = net.units[i]
        cost = u.unit_cost + (u.fixed_cost if kept[i] == 0 else 0) + _group_change(net, kept, i)
        if total + cost <= budget:
            kept[i] += 1
            total += cost
    bitfit = any(net.units[i].candidate == BITFIT and k for i, k in kept.items())
    config = dataclasses.replace(head or PetlConfig(), modules=_modules(net, kept), bitfit=bitfit)
    exact = count_parameters(model_config, config, num_labels=num_labels).deployable
    if exact != total:
        raise RuntimeError(f"derived count {total:,} differs from budget.py's {exact:,}: a unit cost is wrong")
    return config, exact


def _group_change(net, kept: dict[int, int], i: int) -> int:
    """What one more unit of instance ``i`` adds in shared tensors: a candidate with a group cost
    (Compacter's rule) becomes one derived spec per distinct kept size, each with its own copy."""
    u = net.units[i]
    if not u.group_cost:
        return 0
    sizes = [kept[j] for j, v in enumerate(net.units) if v.candidate == u.candidate and kept[j]]
    after = list(sizes)
    if kept[i]:
        after.remove(kept[i])
    after.append(kept[i] + 1)
    return u.group_cost * (len(set(after)) - len(set(sizes)))


def _modules(net, kept: dict[int, int]) -> tuple[ModuleSpec, ...]:
    layers_by = defaultdict(list)                 # (candidate, target, size) -> layers
    for i, k in kept.items():
        u = net.units[i]
        if k == 0 or u.candidate == BITFIT:
            continue
        layers_by[(u.candidate, u.target, k)].append(u.layer)
    out = []
    for (c, target, k), layers in sorted(layers_by.items(), key=lambda x: (x[0][0], x[0][1] or "", x[0][2])):
        spec = net.specs[c]
        extra = {"targets": (target,)} if spec.form == "lora" else {}
        out.append(dataclasses.replace(spec, size=k * _unit_size(net, c), layers=tuple(sorted(layers)), **extra))
    return tuple(out)


def _unit_size(net, candidate: int) -> int:
    return next(u.unit_size for u in net.units if u.candidate == candidate)


__all__ = ["derive", "ladder"]
