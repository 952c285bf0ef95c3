"""The supernet: every candidate of a space in one model, each rank component and adapter unit gated.

`build_supernet` applies, with the ordinary injection code, one PetlConfig holding the candidates
(`candidates`), then puts a `HardConcrete` gate on each unit through torch parametrizations: a LoRA
module's rank rows of A, an adapter's bottleneck rows of W_down and b_down (and its b_up, which
exists while any unit of that adapter is open), and, where the space allows BitFit, one gate over
every bias of the backbone (each bias is its pretrained value plus the gate times its change: the
configuration can only say BitFit or not). A Compacter adapter's unit is one column of its PHM
fast matrices: n bottleneck dimensions at once (the rows of W_down that t's column q builds, the
entries of b_down it shares and the rows of s in W_up), so what is kept stays divisible by n.
A multi-head adapter's unit is one of its learned positions (`MultiHeadAdapter.position_gate`
scales its value rows: relu attention has no normaliser, so a zero value removes the position
exactly). A prefix's positions are gated in the
attention itself
(`HeadEdits.prefix_gate`): a shut position is left out of the softmax, an open one adds log g to
its logits. A gate at 0 removes its unit exactly, so a supernet with every gate closed computes
what the backbone computes. Trained LayerNorms, where the space allows them, are one more such
unit: every norm's weight and bias is its pretrained value plus the gate times its change. A
LayerNorm bias is also a bias BitFit trains, so it keeps its change while either gate is open
(1 − (1 − z_bitfit)(1 − z_norms)), and its cost is counted once, with the chance that either is.
Where the space allows UniPELT's gates, every LoRA, adapter, Compacter and multi-head adapter
instance is built with its gate g(x), and one more hard-concrete z per instance chooses between
the two forms: its output is scaled by (1 − z) + z·g(x), the ungated module at z = 0, the gated
one at z = 1 (`Composition.gate_mix`); the gate's parameters count only while the instance is kept.
A soft prompt's positions are units too (`inject.gate_prompt`): a forward inserts only the open
ones, so the tokens sit where a prompt of that length puts them, and every attention that reads
the prompt adds log g to its positions' logits, as a prefix's positions do.

Candidates: LoRA, parallel adapters, Compacter, prefixes and multi-head adapters where the space's
slots allow them, UniPELT's gates on the first four, BitFit, trained LayerNorms and a soft prompt.
A prefix's UniPELT gate is left to the sampler (its positions are gated instead).

`Supernet.expected_count` is the differentiable expected deployable count Σ P(open)·cost, with each
unit's cost read off the shapes the module really has; `penalty` is the Lagrangian term that holds
it to a target (the multiplier rises while the expectation is over the target).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils import parametrize

from ...core.backbones import stacks
from ...core.budget import applies, count_parameters
from ...core.config import ModuleSpec, PetlConfig
from ...core.forms import all_forms
from ...core.forms.weights import WEIGHTS as LORA_TARGETS
from ...core.head import pooler_parameters
from ...core.inject import apply_petl, gate_prompt, head_attention_refusal, norm_modules
from ...core.modules.adapter import Bottleneck
from ...core.modules.head_attention import edits_of
from ...core.modules.lora import LoRA
from ...core.modules.mh_adapter import MultiHeadAdapter
from ...core.modules.phm import CompacterAdapter
from ...core.modules.prefix import PrefixEncoder
from ...study.space import DEFAULTS
from ...study.space import LORA_TARGETS as SPACE_LORA_TARGETS
from .gates import HardConcrete

GATES = "oneshot_gates"
BITFIT = -1  # the candidate index of the BitFit unit (not a ModuleSpec)
LAYERNORMS = -2  # ... and of the trained-LayerNorms unit
GLOBAL = (BITFIT, LAYERNORMS)  # units that switch a whole-backbone option of the configuration
PROMPT = -3  # the soft prompt's positions (one unit each)


class _Rows(nn.Module):
    """Multiplies a weight's rows (or a bias's entries) by the gates."""

    def __init__(self, gate: HardConcrete):
        super().__init__()
        self.gate = [gate]  # a list: not a submodule of the parametrization

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        z = self.gate[0].z().to(w.dtype)
        return w * (z[:, None] if w.dim() == 2 else z)


class _AnyOpen(nn.Module):
    """Keeps a bias while any gate of its module is open (max z), drops it when all are shut."""

    def __init__(self, gate: HardConcrete):
        super().__init__()
        self.gate = [gate]

    def forward(self, b: torch.Tensor) -> torch.Tensor:
        return b * self.gate[0].z().max().to(b.dtype)


class _Columns(nn.Module):
    """Gates the PHM fast matrices of a Compacter adapter along its units (columns of width n):
    ``t`` of W_down on its last axis, ``s`` of W_up on its middle one, b_down at every n-block."""

    def __init__(self, gate: HardConcrete, role: str):
        super().__init__()
        self.gate, self.role = [gate], role

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        z = self.gate[0].z().to(w.dtype)
        if self.role == "down.t":  # [n, r, size/n]
            return w * z[None, None, :]
        if self.role == "up.s":  # [n, size/n, r]
            return w * z[None, :, None]
        return w * z.repeat(w.shape[0] // z.shape[0])  # b_down [size]: entry a·(size/n) + q is unit q


class _FromStart(nn.Module):
    """A BitFit bias or a LayerNorm tensor: its pretrained value plus what training changed, times
    the gate; a LayerNorm bias that BitFit's gate and the norms' gate share is open while either is,
    1 − (1 − z₁)(1 − z₂). The start when every gate is shut."""

    def __init__(self, gates: list[HardConcrete], start: torch.Tensor):
        super().__init__()
        self.gates = list(gates)  # a list: not submodules of the parametrization
        self.register_buffer("start", start.detach().clone())

    def forward(self, b: torch.Tensor) -> torch.Tensor:
        shut = 1.0
        for g in self.gates:
            shut = shut * (1 - g.z())
        return self.start + (1 - shut).to(b.dtype) * (b - self.start)


@dataclass
class Unit:
    """The gates of one module instance: which candidate, layer and target, and what a unit costs."""

    candidate: int  # index into the supernet's candidate specs (BITFIT: the biases)
    layer: int  # -1 for BitFit (every layer)
    target: str | None  # LoRA: q, v, ffn_in, ...; adapter: None; "bitfit"
    gate: HardConcrete
    unit_cost: int  # deployable parameters per open unit
    fixed_cost: int = 0  # parameters the module has while any unit is open (an adapter's b_up)
    unit_size: int = 1  # the module's size per open unit (Compacter: n dimensions)
    group_cost: int = 0  # parameters each distinct derived spec of this candidate adds once (PHM's rule)
    gate_of: int | None = None  # a UniPELT-gate choice: the index (in Supernet.units) of the instance it gates


@dataclass
class Supernet:
    model: nn.Module
    specs: tuple[ModuleSpec, ...]
    units: list[Unit] = field(default_factory=list)
    multiplier: float = 0.0  # the Lagrange multiplier of the count constraint
    shared_cost: int = 0  # LayerNorm biases with both BitFit and LayerNorm units: kept while either is open

    def gates(self) -> list[HardConcrete]:
        return [u.gate for u in self.units]

    def expected_count(self) -> torch.Tensor:
        total, shared = 0.0, {}
        for u in self.units:
            p = u.gate.p_open()
            if u.gate_of is not None:  # a UniPELT gate: its parameters exist while the instance does
                total = total + u.unit_cost * p.sum() * self.units[u.gate_of].gate.p_open().max()
                continue
            total = total + u.unit_cost * p.sum() + u.fixed_cost * p.max()
            if u.group_cost:  # a candidate's shared tensor (PHM's rule): while any unit is open
                shared.setdefault(u.candidate, (u.group_cost, []))[1].append(p.max())
        total = total + sum(cost * torch.stack(opens).max() for cost, opens in shared.values())
        if self.shared_cost:
            shut = [1 - u.gate.p_open().max() for u in self.units if u.candidate in GLOBAL]
            total = total + self.shared_cost * (1 - torch.stack(shut).prod())
        return total

    def penalty(self, target: float, step_size: float = 0.02) -> torch.Tensor:
        """λ·g + g²/2 with g = log(E/target), then λ += step·g (kept ≥ 0): dual ascent holds the
        expected count E at ``target`` without a hand-tuned weight. The log keeps the pull bounded
        when the supernet starts many times larger than the budget."""
        gap = torch.log(self.expected_count() / target)
        self.multiplier = max(0.0, self.multiplier + step_size * float(gap.detach()))
        return self.multiplier * gap + 0.5 * gap * gap

    def close_all(self) -> None:
        for g in self.gates():
            g.close()


def candidates(space, model_config, budget: int | None) -> tuple[ModuleSpec, ...]:
    """The supernet's module specs for ``space``: LoRA at each position whose slot allows it (every
    target the space allows there), a parallel adapter at each position whose slot allows adapters, a prefix at
    attention where a slot allows prefixes (flat where the space allows it, composed by the shared
    softmax); every layer; each at the space's largest size, cut to the largest that alone (on one
    layer) fits ``budget``. Forms the backbone refuses (a prefix on DeBERTa) are left out."""
    forms: dict[str, set[str]] = {}
    for slot in space.slots:
        forms.setdefault(slot.site, set()).update(slot.forms.choices or (slot.forms.value,))
    gated = {"gate": True} if _allows_true(space, "gates") else {}
    specs = []
    ranked = sorted((f for f in all_forms() if f.supernet_rank is not None), key=lambda f: f.supernet_rank)
    for site in ("attn", "ffn"):
        for shape in ranked:
            form, dim = shape.name, shape.size_dimension
            if form not in forms.get(site, ()):
                continue
            size = _largest(space, site, dim)
            extra = shape.supernet_fields(site, _SpaceAt(space, site), gated)
            spec = ModuleSpec(form=form, position=site, size=size, **extra)
            step = shape.size_step(extra)  # Compacter: sizes divisible by n
            size = max(step, size - size % step)
            spec = ModuleSpec(form=form, position=site, size=size, **extra)
            if not applies(model_config, PetlConfig(modules=(spec,))):  # a form this backbone refuses
                continue
            while budget is not None and size > step and _one_layer_count(model_config, spec) > budget:
                size = max(step, (size // 2) - (size // 2) % step)
                spec = ModuleSpec(form=form, position=site, size=size, **extra)
            specs.append(spec)
    return tuple(specs)


def allows_bitfit(space, model_config, budget: int | None, head: PetlConfig | None = None) -> bool:
    """Does the space allow BitFit, does the backbone have biases, and do they alone fit ``budget``?"""
    return (
        _allows_true(space, "bitfit")
        and applies(model_config, PetlConfig(bitfit=True))
        and (budget is None or bitfit_cost(model_config, head) <= budget)
    )


def allows_layernorms(space, model_config, budget: int | None, head: PetlConfig | None = None) -> bool:
    """Does the space allow trained LayerNorms, and do they alone fit ``budget``?"""
    return _allows_true(space, "train_layernorms") and (
        budget is None or global_cost(model_config, head, layernorms=True) <= budget
    )


def prompt_length_for(space, model_config, budget: int | None, head: PetlConfig | None = None) -> int:
    """The longest soft prompt the space allows that alone fits ``budget`` (0: no prompt candidate,
    or a backbone whose attention cannot add the prompt's gates to its logits)."""
    d = space.globals.get("prompt_length")
    if d is None or head_attention_refusal(model_config) is not None:  # its gates need the ``petl`` attention
        return 0
    longest = int(max(d.choices) if d.choices else d.high if d.kind == "int" else d.value or 0)
    if longest and budget is not None:
        longest = min(longest, budget // global_cost(model_config, head, prompt_length=1))
    return longest


def _allows_true(space, name: str) -> bool:
    """Does the space's global boolean ``name`` allow True?"""
    d = space.globals.get(name)
    return d is not None and (True in d.choices if d.choices else bool(d.value))


def bitfit_cost(model_config, head: PetlConfig | None = None) -> int:
    """The deployable parameters BitFit adds (every bias of the backbone), as budget.py counts them."""
    return global_cost(model_config, head, bitfit=True)


def global_cost(
    model_config, head: PetlConfig | None = None, bitfit: bool = False, layernorms: bool = False, prompt_length: int = 0
) -> int:
    """What BitFit, trained LayerNorms and/or a soft prompt add to ``head`` alone, as budget.py counts them."""
    bare = dataclasses.replace(head or PetlConfig(), modules=(), bitfit=False, train_layernorms=False, prompt_length=0)
    with_them = dataclasses.replace(bare, bitfit=bitfit, train_layernorms=layernorms, prompt_length=prompt_length)
    return count_parameters(model_config, with_them).deployable - count_parameters(model_config, bare).deployable


def _largest(space, site: str, dim: str) -> int:
    for slot in space.slots:
        if slot.site == site and dim in slot.dims:
            d = slot.dims[dim]
            return int(d.high if d.kind == "int" else max(d.choices) if d.choices else d.value)
    d = space.globals.get(dim)
    return int(d.high) if d is not None and d.kind == "int" else 8


class _SpaceAt:
    """What a form's one-shot candidate may read of the space at one site (`Form.supernet_fields`)."""

    def __init__(self, space, site: str):
        self.space, self.site = space, site

    def smallest(self, dim: str) -> int:
        return _smallest(self.space, self.site, dim)

    def targets(self, site: str) -> tuple[str, ...]:
        return _lora_targets(self.space, site)


def _lora_targets(space, site: str) -> tuple[str, ...]:
    """The weights LoRA may adapt at ``site``: at attention, those of every ``lora_targets`` value
    the space allows (its default, q and v, where it names none); at the FFN, both of its linears."""
    if site != "attn":
        return LORA_TARGETS[site]
    found = _dimensions(space, site, "lora_targets")
    keys = (found[0].choices or (found[0].value,)) if found else (DEFAULTS["lora_targets"],)
    allowed = {t for key in keys for t in SPACE_LORA_TARGETS[key]}
    return tuple(t for t in LORA_TARGETS[site] if t in allowed)


def _smallest(space, site: str, dim: str) -> int:
    """The smallest value a categorical or fixed dimension allows (0 where the space does not say)."""
    found = _dimensions(space, site, dim)
    return int(min(found[0].choices) if found[0].choices else found[0].value) if found else 0


def _dimensions(space, site: str, dim: str) -> list:
    """``dim`` as the slots at ``site`` give it, then as the space's globals do (first wins)."""
    found = [slot.dims[dim] for slot in space.slots if slot.site == site and dim in slot.dims]
    return found + ([space.globals[dim]] if dim in space.globals else [])


def _one_layer_count(model_config, spec: ModuleSpec) -> int:
    return count_parameters(model_config, PetlConfig(modules=(dataclasses.replace(spec, layers=(0,)),))).deployable


def build_supernet(
    model: nn.Module,
    specs: tuple[ModuleSpec, ...],
    head: PetlConfig | None = None,
    init_open: float = 0.9,
    gate_speed: float = 1.0,
    bitfit: bool = False,
    layernorms: bool = False,
    prompt_length: int = 0,
) -> Supernet:
    """Apply ``specs`` (and ``head``'s head options) to ``model`` in place and gate every unit;
    ``gate_speed``: how many times faster than the weights the gates learn (`HardConcrete`);
    ``bitfit``: add one gated unit for every bias of the backbone; ``layernorms``: one for every
    LayerNorm's weight and bias; ``prompt_length``: a soft prompt of that many gated positions."""
    config = dataclasses.replace(
        head or PetlConfig(),
        modules=tuple(specs),
        bitfit=bitfit,
        train_layernorms=layernorms,
        prompt_length=prompt_length,
    )
    apply_petl(model, config)
    gates = nn.ModuleList()
    model.petl.add_module(GATES, gates)
    net = Supernet(model, tuple(specs))
    _gate_globals(net, model, head, bitfit, layernorms, init_open, gate_speed, gates)
    if prompt_length:
        gate = HardConcrete(prompt_length, init_open, gate_speed)
        gate_prompt(model, gate.z)
        net.units.append(Unit(PROMPT, -1, "prompt", gate, model.petl.prompt.embeddings.shape[1]))
        gates.append(gate)
    for i, group in enumerate(model.petl.groups.values()):
        for key, module in _instances(group):
            layer, _, target = key.partition("_")
            gate = _gate_instance(net, i, int(layer), target, module, init_open, gate_speed)
            if gate is None:
                continue
            gates.append(gate)
            if module.compose.gate is not None:  # UniPELT's gate: with it or without, z decides
                mix = HardConcrete(1, 0.5, gate_speed)
                module.compose.gate_mix = mix.z
                cost = sum(p.numel() for p in module.compose.gate.parameters())
                net.units.append(Unit(i, int(layer), target, mix, cost, gate_of=len(net.units) - 1))
                gates.append(mix)
    for i, layer, edits in _prefixes(model):
        pk, _ = edits.prefix.layer_kv(edits.prefix_index)  # [H_kv, l, D]
        gate = HardConcrete(pk.shape[1], init_open, gate_speed)
        edits.prefix_gate = gate.z
        net.units.append(Unit(i, layer, None, gate, 2 * pk.shape[0] * pk.shape[2]))
        gates.append(gate)

    # before the prompt's insertion reads its gate; a partial, not a closure: a copy of the model
    # (copy.deepcopy) then draws its own gates
    model.register_forward_pre_hook(functools.partial(_resample, gates), prepend=True)
    return net


def _gate_instance(net: Supernet, i: int, layer: int, target, module, init_open: float, speed: float):
    """Gate the units of one module instance (group ``i``, ``layer``) and list them on ``net``;
    returns the gate (None: a module with no units to gate)."""
    if isinstance(module, LoRA):  # a rank component: a row of A (and B's column, which reads it)
        gate = HardConcrete(module.A.shape[0], init_open, speed)
        parametrize.register_parametrization(module, "A", _Rows(gate))
        net.units.append(Unit(i, layer, target, gate, module.A.shape[1] + module.B.shape[0]))
    elif isinstance(module, CompacterAdapter):
        gate = _gate_compacter(net, i, layer, module, init_open, speed)
    elif isinstance(module, MultiHeadAdapter):
        gate = HardConcrete(module.values.shape[1], init_open, speed)
        module.position_gate = gate.z  # (a parameter named `values` cannot be parametrized)
        net.units.append(Unit(i, layer, None, gate, module.keys[:, 0].numel() + module.values[:, 0].numel()))
    elif isinstance(module, Bottleneck):  # a bottleneck unit: a row of W_down and b_down; b_up while any is open
        gate = HardConcrete(module.down.weight.shape[0], init_open, speed)
        parametrize.register_parametrization(module.down, "weight", _Rows(gate))
        parametrize.register_parametrization(module.down, "bias", _Rows(gate))
        parametrize.register_parametrization(module.up, "bias", _AnyOpen(gate))
        d_in, d_out = module.down.weight.shape[1], module.up.weight.shape[0]
        net.units.append(Unit(i, layer, None, gate, d_in + 1 + d_out, fixed_cost=d_out))
    else:
        return None
    return gate


def _gate_compacter(net: Supernet, i: int, layer: int, module, init_open: float, speed: float) -> HardConcrete:
    """A Compacter's units: one column of its PHM fast matrices each (n bottleneck dimensions); its
    slow matrices and up bias exist while any is open."""
    down, up = module.down, module.up
    n, rank = down.n, down.s.shape[-1]
    gate = HardConcrete(down.t.shape[-1], init_open, speed)
    parametrize.register_parametrization(down, "t", _Columns(gate, "down.t"))
    parametrize.register_parametrization(down, "bias", _Columns(gate, "down.bias"))
    parametrize.register_parametrization(up, "s", _Columns(gate, "up.s"))
    for fixed, name in ((down, "s"), (up, "t"), (up, "bias")):
        parametrize.register_parametrization(fixed, name, _AnyOpen(gate))
    fixed_cost = sum(getattr(m, name).numel() for m, name in ((down, "s"), (up, "t"), (up, "bias")))
    net.units.append(
        Unit(
            i,
            layer,
            None,
            gate,
            2 * n * rank + n,
            fixed_cost=fixed_cost,
            unit_size=n,
            group_cost=down.rule[0].A.numel(),
        )
    )
    return gate


def _resample(gates: list[HardConcrete], module: nn.Module, args) -> None:
    """One draw per forward: every use of a gate in it sees the same z."""
    for g in gates:
        g.sample()


def _gate_globals(
    net: Supernet,
    model: nn.Module,
    head,
    bitfit: bool,
    layernorms: bool,
    init_open: float,
    gate_speed: float,
    gates: nn.ModuleList,
) -> None:
    """The BitFit and LayerNorm units (see the module docstring), with their exact costs."""
    if not (bitfit or layernorms):
        return
    c_b = global_cost(model.config, head, bitfit=True) if bitfit else 0  # (a bias-free backbone has no BitFit)
    c_l = global_cost(model.config, head, layernorms=True) if layernorms else 0
    both = bitfit and layernorms
    net.shared_cost = c_b + c_l - global_cost(model.config, head, bitfit=True, layernorms=True) if both else 0
    found = {
        BITFIT: HardConcrete(1, init_open, gate_speed) if bitfit else None,
        LAYERNORMS: HardConcrete(1, init_open, gate_speed) if layernorms else None,
    }
    norms = norm_modules(model) if layernorms else []
    norm_ids = {id(m) for m in norms}
    for module, start in _backbone_biases(model) if bitfit else []:
        if id(module) not in norm_ids:
            parametrize.register_parametrization(module, "bias", _FromStart([found[BITFIT]], start))
    for module in norms:
        for name, p in list(module.named_parameters(recurse=False)):
            which = [found[LAYERNORMS]] + ([found[BITFIT]] if bitfit and name == "bias" else [])
            parametrize.register_parametrization(module, name, _FromStart(which, p.detach().clone()))
    for candidate, target, cost in ((BITFIT, "bitfit", c_b), (LAYERNORMS, "layernorms", c_l)):
        if found[candidate] is not None:
            net.units.append(Unit(candidate, -1, target, found[candidate], cost - net.shared_cost))
            gates.append(found[candidate])


def _backbone_biases(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(module, pretrained value) of every bias BitFit trains: the backbone's, not PETL's or the head's."""
    petl = {id(p) for p in model.petl.parameters()}
    pooler = {id(p) for p in pooler_parameters(model, model.petl.pooling)}
    out = []
    for module in model.base_model.modules():
        b = dict(module.named_parameters(recurse=False)).get("bias")
        if b is not None and b.requires_grad and id(b) not in petl | pooler:
            out.append((module, b.detach().clone()))
    return out


def _prefixes(model: nn.Module):
    """(candidate index, layer, HeadEdits) of every prefixed attention module, in candidate order."""
    index = {
        id(enc): (i, enc)
        for i, group in enumerate(model.petl.groups.values())
        for enc in group.modules()
        if isinstance(enc, PrefixEncoder)
    }
    found = []
    spec, layer_lists = stacks(model)
    for block in (b for b in spec.blocks if b.attention is not None):  # DeBERTa: no prefix anywhere
        for l, layer in enumerate(layer_lists[block.name]):
            edits = edits_of(layer.get_submodule(block.attention))
            if edits is not None and edits.prefix is not None and id(edits.prefix) in index:
                found.append((index[id(edits.prefix)][0], l, edits))
    return sorted(found, key=lambda x: (x[0], x[1]))


def _instances(group: nn.Module):
    """(key, module) of a group's per-layer modules (one block: ``'3'``, ``'3_q'``; several: nested)."""
    for key, module in group.items():
        if isinstance(module, (LoRA, Bottleneck, CompacterAdapter, MultiHeadAdapter)):
            yield key, module
        elif isinstance(module, nn.ModuleDict):
            yield from _instances(module)


__all__ = [
    "Supernet",
    "Unit",
    "build_supernet",
    "candidates",
    "allows_bitfit",
    "allows_layernorms",
    "bitfit_cost",
    "global_cost",
    "prompt_length_for",
    "GATES",
    "BITFIT",
    "LAYERNORMS",
    "GLOBAL",
    "PROMPT",
]
