"""Reading configurations off a trained supernet, one per budget, each an exact count.

For a budget, the components (LoRA rank rows, adapter units, Compacter columns, prefix and prompt
positions, BitFit's biases, trained LayerNorms) are taken most-likely-open first while the
deployable count stays within the budget (S3Delta's greedy hard selection, with our exact
per-unit costs); the order, not a threshold, decides: a short supernet run may leave every gate's
chance low while still ranking them. ``min_open`` leaves out components below a chance of
opening. A module instance keeps the units taken; its layers are grouped by the size they kept
into ordinary ModuleSpecs (each Compacter spec with its own shared rule, counted as it appears),
so the result is a plain PetlConfig, and `budget.count_parameters` checks its count against the
one computed here.

UniPELT's gates are read after the units: a kept instance is gated where its gate choice is more
likely open than not and the gate's parameters still fit (a gate chooses between two forms of a
module, not how much of it to keep, so the order-not-threshold rule above does not apply to it).

`anchored` reads a configuration around a given one (a baseline): the anchor's modules as they
are, and what the supernet keeps within the rest of the budget from the instances the anchor does
not touch (a LoRA anchored on q, v leaves the supernet k, o, the FFN and the other forms; a soft
prompt or BitFit anchor leaves it the modules), so no sublayer gets two modules of one form.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import torch

from ...core.budget import count_parameters
from ...core.config import ModuleSpec, PetlConfig
from .supernet import BITFIT, GLOBAL, LAYERNORMS, PROMPT


def ladder(low: int, high: int, n: int = 10) -> list[int]:
    """``n`` budgets spaced evenly in log from ``low`` to ``high`` (both kept, no repeats)."""
    if n <= 1 or high <= low:
        return [high]
    out = [round(math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / (n - 1))) for i in range(n)]
    return sorted(set(out))


@dataclasses.dataclass
class Selection:
    """What a budget keeps of a supernet: the unit indices kept per instance (an index into
    ``Supernet.units``), the instances derived with their UniPELT gate, and the exact count."""

    kept: dict[int, list[int]]
    gated: set[int]
    total: int

    def counts(self) -> dict[int, int]:
        return defaultdict(int, {i: len(js) for i, js in self.kept.items()})


def select(net, budget: int, min_open: float = 0.0, leave_out: frozenset = frozenset()) -> Selection:
    """The components ``net`` keeps within ``budget``, most likely open first (see the module);
    none of the instances in ``leave_out`` (indices into ``net.units``) nor their UniPELT gates."""
    with torch.no_grad():
        probs = [u.gate.p_open().tolist() for u in net.units]
    order = sorted(
        (
            (p, i, j)
            for i, ps in enumerate(probs)
            for j, p in enumerate(ps)
            if p > min_open and net.units[i].gate_of is None and i not in leave_out
        ),
        key=lambda x: (-x[0], net.units[x[1]].unit_cost),
    )
    kept: dict[int, int] = defaultdict(int)
    units: dict[int, list[int]] = defaultdict(list)
    total = 0
    for _, i, j in order:
        u = net.units[i]
        cost = u.unit_cost + (u.fixed_cost if kept[i] == 0 else 0) + _group_change(net, kept, i)
        if u.candidate in GLOBAL and not any(k for j_, k in kept.items() if net.units[j_].candidate in GLOBAL):
            cost += net.shared_cost  # the LayerNorm biases both BitFit and LayerNorms train
        if total + cost <= budget:
            kept[i] += 1
            units[i].append(j)
            total += cost
    gated = set()
    for p, i in sorted(((ps[0], i) for i, ps in enumerate(probs) if net.units[i].gate_of is not None), reverse=True):
        u = net.units[i]
        if p > 0.5 and kept[u.gate_of] and u.gate_of not in leave_out and total + u.unit_cost <= budget:
            gated.add(u.gate_of)
            total += u.unit_cost
    return Selection(dict(units), gated, total)


def derive(
    net, model_config, budget: int, head: PetlConfig | None = None, min_open: float = 0.0, num_labels: int | None = None
) -> tuple[PetlConfig, int]:
    """The configuration ``net`` suggests within ``budget``, and its exact deployable count."""
    return configuration(net, model_config, select(net, budget, min_open), head, num_labels)


def configuration(
    net, model_config, selection: Selection, head: PetlConfig | None = None, num_labels: int | None = None
) -> tuple[PetlConfig, int]:
    """The PetlConfig of a selection, checked against `budget.count_parameters`."""
    kept = selection.counts()
    taken = {net.units[i].candidate for i, k in kept.items() if k}
    prompt_length = sum(k for i, k in kept.items() if net.units[i].candidate == PROMPT)
    config = dataclasses.replace(
        head or PetlConfig(),
        modules=_modules(net, kept, selection.gated),
        bitfit=BITFIT in taken,
        train_layernorms=LAYERNORMS in taken,
        prompt_length=prompt_length,
    )
    exact = count_parameters(model_config, config, num_labels=num_labels).deployable
    if exact != selection.total:
        raise RuntimeError(
            f"derived count {selection.total:,} differs from budget.py's {exact:,}: a unit cost is wrong"
        )
    return config, exact


def anchored(
    net,
    model_config,
    budget: int,
    anchor: PetlConfig,
    head: PetlConfig | None = None,
    min_open: float = 0.0,
    num_labels: int | None = None,
) -> tuple[PetlConfig, int] | None:
    """``anchor`` (a configuration without a head) and what ``net`` keeps beside it within ``budget``
    (see the module), with its exact deployable count; None when the anchor alone does not fit or
    nothing fits beside it (the anchor alone is the baseline itself)."""
    base = dataclasses.replace(
        head or PetlConfig(),
        modules=anchor.modules,
        bitfit=anchor.bitfit,
        train_layernorms=anchor.train_layernorms,
        prompt_length=anchor.prompt_length,
    )
    own = count_parameters(model_config, base, num_labels=num_labels).deployable
    if own > budget:
        return None
    selection = select(net, budget - own, min_open, frozenset(touched(net, anchor)))
    if selection.total == 0:
        return None
    fill, _ = configuration(net, model_config, selection, head, num_labels)
    config = dataclasses.replace(
        base,
        modules=anchor.modules + fill.modules,
        bitfit=anchor.bitfit or fill.bitfit,
        train_layernorms=anchor.train_layernorms or fill.train_layernorms,
        prompt_length=anchor.prompt_length + fill.prompt_length,
    )
    exact = count_parameters(model_config, config, num_labels=num_labels).deployable
    if exact != own + selection.total:
        raise RuntimeError(f"anchored count {own + selection.total:,} differs from budget.py's {exact:,}")
    return config, exact


def touched(net, anchor: PetlConfig) -> set[int]:
    """The instances of ``net`` (indices into ``net.units``) that ``anchor`` already trains: those of
    a module form at a position, target and layer it adapts; the whole-backbone units (BitFit, the
    LayerNorms) when it trains either; the prompt's positions when it has a prompt."""
    out = set()
    for i, u in enumerate(net.units):
        if u.gate_of is not None:
            continue
        if u.candidate in GLOBAL:
            hit = anchor.bitfit or anchor.train_layernorms
        elif u.candidate == PROMPT:
            hit = anchor.prompt_length > 0
        else:
            spec = net.specs[u.candidate]
            hit = any(
                m.form == spec.form
                and m.position == spec.position
                and (m.layers is None or u.layer in m.layers)
                and (u.target is None or m.targets is None or u.target in m.targets)
                for m in anchor.modules
            )
        if hit:
            out.add(i)
    return out


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


def _modules(net, kept: dict[int, int], gated: set[int]) -> tuple[ModuleSpec, ...]:
    layers_by = defaultdict(list)  # (candidate, target, size, gated) -> layers
    for i, k in kept.items():
        u = net.units[i]
        if k == 0 or u.candidate in GLOBAL + (PROMPT,):
            continue
        layers_by[(u.candidate, u.target, k, i in gated)].append(u.layer)
    out = []
    for (c, target, k, gate), layers in sorted(
        layers_by.items(), key=lambda x: (x[0][0], x[0][1] or "", x[0][2], x[0][3])
    ):
        spec = net.specs[c]
        extra = {"targets": (target,)} if spec.targets is not None else {}  # a unit per targeted weight
        out.append(
            dataclasses.replace(spec, size=k * _unit_size(net, c), layers=tuple(sorted(layers)), gate=gate, **extra)
        )
    return tuple(out)


def _unit_size(net, candidate: int) -> int:
    return next(u.unit_size for u in net.units if u.candidate == candidate and u.gate_of is None)


__all__ = ["Selection", "anchored", "configuration", "derive", "ladder", "select", "touched"]
