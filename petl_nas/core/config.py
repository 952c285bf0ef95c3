"""The genotype: `PetlConfig` and its `ModuleSpec`s, validation, and the YAML/JSON round trip.

A configuration is a frozen value on He et al.'s design dimensions (functional form, modified
representation, insertion, composition, size) plus a few global switches. Search samples it,
training consumes it, export writes it; nothing else travels between those stages.

Example:
    >>> cfg = PetlConfig(modules=(ModuleSpec(form="lora", position="attn", size=8, scale=2.0),))
    >>> PetlConfig.from_yaml(cfg.to_yaml()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, check_keys, read_text, read_yaml, suggest
from ..rules import BOOL, NUMBER, WHOLE, check_fields, list_of, number
from .forms import COMMON_KEYS, INITS, all_forms, form_named, form_names

POSITIONS = ("attn", "ffn")
INSERTIONS = ("sequential", "parallel")
COMPOSITIONS = ("add", "scaled", "gated")
NONLINEARITIES = ("relu", "gelu", "tanh", "swish", "identity")
GATE_SCOPES = ("example", "token")
POOLINGS = ("auto", "cls", "mean", "pooler", "pooler_trained")  # see head.py
# Attention kinds of a backbone (He et al.'s N_attn): an encoder-decoder has all three, an encoder
# only `encoder`, a decoder-only model only `decoder`. FFNs live in the encoder and decoder blocks.
BLOCKS = ("encoder", "decoder", "cross")


def form_keys(form: str) -> tuple[str, ...]:
    """The `ModuleSpec` fields ``form`` reads; a key outside them is a mistake worth reporting."""
    return COMMON_KEYS + form_named(form).keys


def parse_blocks(value, where: str = "blocks") -> tuple[str, ...] | None:
    """``None``/``"all"`` -> None; a list or a ``+``-joined string of block names -> a canonical tuple."""
    if value is None or value == "all":
        return None
    if not isinstance(value, (str, list, tuple)):
        raise ConfigError(f"{where}: expected a list of block names, got {value!r}")
    names = value.split("+") if isinstance(value, str) else list(value)
    for name in names:
        _check_choice(where, name, BLOCKS)
    return tuple(b for b in BLOCKS if b in names)


def _check_choice(where: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{where}: unknown value {value!r}{suggest(value, choices)}")


@dataclass(frozen=True)
class ModuleSpec:
    """One PETL module placed on He et al.'s design dimensions.

    Attributes:
        form: functional form: ``adapter`` (bottleneck MLP), ``lora`` (low-rank weight update),
            ``prefix`` (prefix keys/values in head attention), ``mh_adapter`` (multi-head parallel
            adapter: relu attention over learned keys/values, per head), ``compacter`` (bottleneck
            adapter whose projections are PHM/Kronecker layers), ``ia3`` (learned scaling vectors),
            ``ln`` (trained copies of the sublayer's LayerNorm).
        position: modified representation: ``attn`` (attention sublayer; head attention for prefix
            and mh_adapter; the q/k/v/o weights for LoRA) or ``ffn`` (FFN sublayer; W1/W2 for LoRA).
        size: bottleneck r (adapter, compacter), rank r (LoRA), length l (prefix, mh_adapter).
        insertion: ``sequential`` (reads the sublayer output h) or ``parallel`` (reads its input x).
            LoRA, prefix and mh_adapter are parallel by construction.
        composition: ``add`` (h + Δh), ``scaled`` (h + s·Δh) or ``gated``: for prefix, the λ(x) gate of
            plain prefix concatenation (He et al. eq. 5); ``add``/``scaled`` prefix uses its own softmax
            and adds the result (the ungated variant). ``gated`` is prefix-only; see ``gate``.
        scale: s for ``scaled`` composition (LoRA's alpha/r).
        learn_scale: learn s (initialised at ``scale``), per layer.
        gate: UniPELT's learned gate g = σ(W·x + b) from the module's input x (for prefix: the
            attention sublayer's input), multiplying this module's contribution Δh (for prefix:
            multiplying the prefix keys P_K and values P_V, as in the UniPELT code).
        gate_per: ``example`` (UniPELT: one gate per example, the mean of σ(W·x_t + b) over the
            example's tokens, padding excluded) or ``token`` (one gate per token; for prefix, log g
            is added to the prefix's attention logits, so a closed gate removes the prefix exactly).
            In causal blocks (a decoder's self- and cross-attention and FFN) a sequence mean would
            let a token see later tokens, so gates there are per token whatever this says.
        layers: the layer indices it applies to, counted within each block's stack; None means every layer.
        blocks: which attention kinds (position ``attn``) or which stacks' FFNs (``ffn``) it applies to:
            a subset of ``encoder`` (encoder self-attention), ``decoder`` (decoder self-attention;
            the only block of a decoder-only model) and ``cross`` (decoder cross-attention, no FFN).
            None means every block the backbone has; naming a block it lacks is an error when applied.
        nonlinearity: bottleneck activation.
        init: ``bert`` (N(0, 0.02) weights, zero biases) or ``lora`` (Kaiming down, zero up: Δh = 0 at
            the start). Default: ``lora`` for LoRA, ``bert`` otherwise.
        dropout: dropout on the module's input (adapter, LoRA).
        targets: LoRA's weights: a subset of q, k, v, o (attn) or ffn_in, ffn_out (ffn); IA3's: a
            subset of q, k, v, o (their outputs scaled) or ffn_out (its input scaled); LN's: attn_norm
            or ffn_norm, the sublayer's own norm.
        reparam: prefix reparameterisation MLP width (0: train the prefix vectors directly).
        phm_n: number of Kronecker summands n in a PHM layer (compacter).
        phm_rank: rank of the per-layer fast matrices (1 in Compacter).
        dora: LoRA as DoRA (Liu et al. 2024): a trained magnitude per output row rescales W + s·B·A,
            starting at that matrix's row norms, so the model is unchanged at the start.
        seed: the seed a form's frozen random parts are drawn from, rebuilt from it and never saved
            (VeRA's shared A and B: PEFT's ``projection_prng_key``; FourierFT's frequencies: its
            ``random_loc_seed``).
    """

    form: str
    position: str = "attn"
    size: int = 8
    insertion: str = "parallel"
    composition: str | None = None
    scale: float = 1.0
    learn_scale: bool = False
    gate: bool = False
    gate_per: str = "example"
    layers: tuple[int, ...] | None = None
    blocks: tuple[str, ...] | None = None
    nonlinearity: str = "relu"
    init: str | None = None
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    reparam: int = 0
    phm_n: int = 4
    phm_rank: int = 1
    dora: bool = False
    seed: int = 0

    def __post_init__(self):
        self._check_types("module")
        self._normalise()
        self.check("module")

    def _check_types(self, where: str) -> None:
        """Before anything is converted: each field's type (a quoted "no" is no boolean, "qv" no list
        of targets), and no field this form does not use set away from its default (``to_dict``
        would drop it, so the design would not round-trip)."""
        check_fields(
            self,
            f"{where}.",
            {
                "scale": NUMBER,
                "dropout": NUMBER,
                "learn_scale": BOOL,
                "gate": BOOL,
                "dora": BOOL,
                "reparam": WHOLE,
                "phm_n": WHOLE,
                "phm_rank": WHOLE,
                "seed": WHOLE,
                "layers": list_of(WHOLE, "layer indices"),
                "targets": list_of(((lambda v: isinstance(v, str)), ""), "weight names such as [q, v]"),
            },
        )
        if self.targets is not None and len(set(self.targets)) != len(self.targets):
            raise ConfigError(f"{where}.targets: {list(self.targets)} names a weight twice")
        if self.form in form_names():
            filled = {"init": form_named(self.form).init}  # what `_normalise` fills in for this form
            keys = form_keys(self.form)
            for f in dataclasses.fields(self):
                unused = f.name not in keys
                if unused and getattr(self, f.name) not in (f.default, filled.get(f.name)):
                    raise ConfigError(f"{where}.{f.name}: {self.form} does not use it")

    def _normalise(self) -> None:
        # Fill form-dependent defaults so that equal designs are equal values.
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        form = form_named(self.form, "module.form") if self.form in form_names() else None  # else: `check` says
        if self.composition is None:
            set_("composition", form.composition if form else "add")
        if self.init is None:
            set_("init", form.init if form else "bert")
        if form and self.targets is None and self.position in form.positions:
            set_("targets", form.default_targets(self.position))
        if self.targets is not None:
            set_("targets", tuple(self.targets))
        if self.layers is not None:
            set_("layers", tuple(sorted(set(int(i) for i in self.layers))))
        if self.blocks is not None:
            set_("blocks", parse_blocks(self.blocks, "module.blocks"))  # canonical order, "all" -> None
        set_("scale", float(self.scale))

    def check(self, where: str) -> None:
        """Raise ConfigError naming ``where.field`` for the first invalid field."""
        form = form_named(self.form, f"{where}.form")
        _check_choice(f"{where}.position", self.position, POSITIONS)
        _check_choice(f"{where}.insertion", self.insertion, INSERTIONS)
        _check_choice(f"{where}.composition", self.composition, COMPOSITIONS)
        _check_choice(f"{where}.nonlinearity", self.nonlinearity, NONLINEARITIES)
        _check_choice(f"{where}.init", self.init, INITS)
        _check_choice(f"{where}.gate_per", self.gate_per, GATE_SCOPES)
        if self.gate_per != "example" and not self.gate:
            raise ConfigError(f"{where}.gate_per: {self.gate_per!r} needs gate: true")
        if self.position not in form.positions:
            raise ConfigError(
                f"{where}.position: {self.form} modifies head attention, so position must be 'attn', "
                f"got {self.position!r}"
                if form.head_attention
                else f"{where}.position: {self.form} sits at {', '.join(form.positions)}, got {self.position!r}"
            )
        if form.parallel_only and self.insertion != "parallel":
            raise ConfigError(
                f"{where}.insertion: {self.form} is a parallel insertion by construction, got {self.insertion!r}"
            )
        if self.composition == "gated" and not form.gated_composition:
            raise ConfigError(
                f"{where}.composition: 'gated' is prefix tuning's λ gate; for UniPELT's "
                f"learned gate on a {self.form} set gate: true (accepted: add, scaled)"
            )
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size <= 0:
            raise ConfigError(f"{where}.size: must be a positive integer, got {self.size!r}")
        if self.composition != "scaled" and (self.scale != 1.0 or self.learn_scale):
            raise ConfigError(f"{where}.scale: composition {self.composition!r} has no s; use composition 'scaled'")
        if self.scale <= 0:
            raise ConfigError(f"{where}.scale: must be positive, got {self.scale}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{where}.dropout: must be in [0, 1), got {self.dropout}")
        if self.layers is not None:
            if not self.layers:
                raise ConfigError(f"{where}.layers: empty list; leave it out to use every layer")
            if self.layers[0] < 0:
                raise ConfigError(f"{where}.layers: layer indices start at 0, got {self.layers[0]}")
        if self.blocks is not None:
            if not self.blocks:
                raise ConfigError(f"{where}.blocks: empty list; leave it out to use every block")
            if self.position == "ffn" and "cross" in self.blocks:
                raise ConfigError(f"{where}.blocks: cross-attention has no FFN; position 'ffn' takes encoder, decoder")
        if form.targets(self.position):
            for t in self.targets or ():
                _check_choice(f"{where}.targets", t, form.targets(self.position))
        elif self.targets is not None:
            takers = [f.name for f in all_forms() if "targets" in f.keys]
            raise ConfigError(f"{where}.targets: only {', '.join(takers)} use{'s' if len(takers) == 1 else ''} targets")
        if self.reparam < 0:
            raise ConfigError(f"{where}.reparam: must be >= 0 (0 = flat prefix), got {self.reparam}")
        if self.phm_n <= 0 or self.phm_rank <= 0:
            raise ConfigError(f"{where}.phm_n/phm_rank: must be positive")
        if self.seed < 0:
            raise ConfigError(f"{where}.seed: must be >= 0 (a generator's seed), got {self.seed}")
        form.check(self, where)

    @property
    def key(self) -> str:
        """Stable short name, e.g. ``ffn_adapter``; the module's parameters live under ``petl.<i>_<key>``."""
        return f"{self.position}_{self.form}"

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k in form_keys(self.form):
            v = getattr(self, k)
            if k == "blocks" and v is None:  # the default; written only when restricted
                continue
            if k == "gate_per" and not self.gate:  # meaningful only with a gate
                continue
            if k == "dora" and not v:  # written only when set: LoRA's dicts stay as they were
                continue
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "module") -> ModuleSpec:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
        form = data.get("form")
        if form is None:
            raise ConfigError(f"{where}.form: missing; accepted: {', '.join(form_names())}")
        form_named(form, f"{where}.form")
        allowed = form_keys(form)
        for k in data:
            if k not in allowed:
                known = {f.name for f in dataclasses.fields(cls)}
                why = f"{form} does not use it" if k in known else f"unknown key{suggest(k, allowed)}"
                raise ConfigError(f"{where}.{k}: {why}")
        kw = dict(data)
        if kw.get("blocks") is not None:  # a list, or "all" / "decoder+cross" as spaces write it
            kw["blocks"] = parse_blocks(kw["blocks"], f"{where}.blocks")
        for k in ("layers", "targets"):
            if kw.get(k) is not None:
                if not isinstance(kw[k], (list, tuple)):
                    raise ConfigError(f"{where}.{k}: expected a list, got {kw[k]!r}")
                kw[k] = tuple(kw[k])
        try:
            spec = cls(**kw)
        except ConfigError as e:
            raise ConfigError(str(e).replace("module.", f"{where}.", 1)) from None
        except TypeError as e:  # pragma: no cover - guarded by the key check above
            raise ConfigError(f"{where}: {e}") from None
        return spec


@dataclass(frozen=True)
class PetlConfig:
    """A whole PETL design: module specs plus global switches.

    Attributes:
        modules: the inserted modules, applied in this order where they share a site.
        bitfit: train every bias of the backbone (BitFit).
        prompt_length: number of soft prompt tokens (prompt tuning), inserted after the first token of
            the (encoder's) input; before every token on a decoder-only model.
        train_layernorms: train the backbone's LayerNorms too (Houlsby, Compacter).
        pooling: what a sequence classifier reads (`petl_nas.core.head`): ``auto`` (the checkpoint's
            sentence-transformers pooling if it has one, else the architecture's own head),
            ``cls``, ``mean``, ``pooler`` (frozen) or ``pooler_trained``.
        head_dropout: dropout before the classifier (None: the checkpoint's own).
        head_lr_mult: the head's learning rate as a multiple of the PETL learning rate.
        lr_mults: a learning rate of their own for families of trained parameters, as multiples of the
            recipe's (``{"adapter": 0.3, "lora": 1.5}``): a functional form's name (every module of
            that form), ``prompt``, ``bitfit`` or ``layernorms`` (`LR_FAMILIES`); a family left out
            trains at the recipe's rate. Adapters, LoRA, Compacter and prefixes train best at rates
            up to 10x apart, so one shared rate is a compromise for a mixed configuration.

    The head is part of the design, but budgets count PETL parameters only, as the papers do; the
    head's count (and a trained pooler's) is shown beside it.
    """

    modules: tuple[ModuleSpec, ...] = ()
    bitfit: bool = False
    prompt_length: int = 0
    train_layernorms: bool = False
    pooling: str = "auto"
    head_dropout: float | None = None
    head_lr_mult: float = 1.0
    lr_mults: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if isinstance(self.modules, ModuleSpec) or not isinstance(self.modules, (list, tuple)):
            raise ConfigError(
                f"modules: expected a list of ModuleSpec, got {type(self.modules).__name__} "
                f"(one module: modules=(ModuleSpec(...),))"
            )
        object.__setattr__(self, "modules", tuple(self.modules))
        for name in ("bitfit", "train_layernorms"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for i, m in enumerate(self.modules):
            if not isinstance(m, ModuleSpec):
                raise ConfigError(f"modules[{i}]: expected a ModuleSpec, got {type(m).__name__}")
        if not isinstance(self.prompt_length, int) or self.prompt_length < 0:
            raise ConfigError(f"prompt_length: must be a non-negative integer, got {self.prompt_length!r}")
        _check_choice("pooling", self.pooling, POOLINGS)
        if self.head_dropout is not None and not (
            isinstance(self.head_dropout, (int, float)) and 0.0 <= self.head_dropout < 1.0
        ):
            raise ConfigError(f"head_dropout: must be in [0, 1) or null, got {self.head_dropout!r}")
        if (
            not isinstance(self.head_lr_mult, (int, float))
            or isinstance(self.head_lr_mult, bool)
            or self.head_lr_mult <= 0
        ):
            raise ConfigError(f"head_lr_mult: must be a positive number, got {self.head_lr_mult!r}")
        object.__setattr__(self, "head_lr_mult", float(self.head_lr_mult))
        object.__setattr__(self, "lr_mults", _checked_lr_mults(self.lr_mults))
        self._check_head_overlap()

    def lr_mult(self, family: str) -> float:
        """The learning-rate multiple of a family of trained parameters (``head``: `head_lr_mult`)."""
        return self.head_lr_mult if family == "head" else dict(self.lr_mults).get(family, 1.0)

    def _check_head_overlap(self) -> None:
        # One attention function serves each attention module: one prefix and one mh_adapter at most.
        overlap = lambda a, b: a is None or b is None or bool(set(a) & set(b))  # noqa: E731
        for form in (f.name for f in all_forms() if f.head_attention):
            seen: dict[int, ModuleSpec] = {}
            for i, m in enumerate(self.modules):
                if m.form != form:
                    continue
                for j, other in seen.items():
                    if overlap(other.layers, m.layers) and overlap(other.blocks, m.blocks):
                        raise ConfigError(
                            f"modules[{i}].layers: a second {form} on layers already "
                            f"covered by modules[{j}] in the same blocks; merge them into one "
                            f"module or give them disjoint layers or blocks"
                        )
                seen[i] = m

    def check_backbone(self, depths: dict[str, dict[str, int]], name: str = "this backbone") -> None:
        """Raise ConfigError if a module names a block or a layer the backbone does not have.

        ``depths`` maps each position to the backbone's blocks there and their depths, e.g.
        ``{"attn": {"encoder": 12, "decoder": 12, "cross": 12}, "ffn": {"encoder": 12, "decoder": 12}}``.
        """
        single = len(depths["attn"]) == 1
        for i, m in enumerate(self.modules):
            have = depths[m.position]
            for b in self.blocks_of(m, have):
                if b not in have:
                    raise ConfigError(
                        f"modules[{i}].blocks: {name} has no {b!r} block at {m.position}; it has {', '.join(have)}"
                    )
                n = have[b]
                if m.layers is not None and m.layers[-1] >= n:
                    where = "the model's" if single else f"the {b} stack's"
                    raise ConfigError(
                        f"modules[{i}].layers: layer {m.layers[-1]} is past {where} depth ({n} layers: 0..{n - 1})"
                    )

    def blocks_of(self, spec: ModuleSpec, available) -> tuple[str, ...]:
        """The blocks ``spec`` applies to, given the backbone's blocks at its position."""
        return tuple(available) if spec.blocks is None else spec.blocks

    def layers_of(self, spec: ModuleSpec, n_layers: int) -> tuple[int, ...]:
        return spec.layers if spec.layers is not None else tuple(range(n_layers))

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "modules": [m.to_dict() for m in self.modules],
            "bitfit": self.bitfit,
            "prompt_length": self.prompt_length,
            "train_layernorms": self.train_layernorms,
            "pooling": self.pooling,
            "head_dropout": self.head_dropout,
            "head_lr_mult": self.head_lr_mult,
            **({"lr_mults": dict(self.lr_mults)} if self.lr_mults else {}),  # absent: as configs always read
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> PetlConfig:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
        check_keys(where, data, [f.name for f in dataclasses.fields(cls)])
        mods = data.get("modules") or []
        if not isinstance(mods, list):
            raise ConfigError(f"{where}.modules: expected a list of modules")
        specs = tuple(ModuleSpec.from_dict(m, f"modules[{i}]") for i, m in enumerate(mods))
        for k in ("bitfit", "train_layernorms"):
            if not isinstance(data.get(k, False), bool):
                raise ConfigError(f"{k}: expected true or false, got {data[k]!r}")
        return cls(
            modules=specs,
            bitfit=data.get("bitfit", False),
            prompt_length=data.get("prompt_length", 0),
            train_layernorms=data.get("train_layernorms", False),
            pooling=data.get("pooling", "auto"),
            head_dropout=data.get("head_dropout"),
            head_lr_mult=data.get("head_lr_mult", 1.0),
            lr_mults=data.get("lr_mults") or (),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> PetlConfig:
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text_or_path: str | Path) -> PetlConfig:
        """Parse YAML text, or read a ``.yaml``/``.yml``/``.json`` file; errors name the file."""
        path = Path(text_or_path) if _looks_like_path(text_or_path) else None
        text = read_text(path) if path else str(text_or_path)
        data = read_yaml(text, path or "config")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}" if path else str(e)) from None


def _looks_like_path(x: str | Path) -> bool:
    return isinstance(x, Path) or ("\n" not in x and x.endswith((".yaml", ".yml", ".json")))


def lr_families() -> tuple[str, ...]:
    """The families `PetlConfig.lr_mults` may name: every registered form, then the prompt, BitFit's
    biases and the backbone's LayerNorms (the head has `PetlConfig.head_lr_mult`)."""
    return (*form_names(), "prompt", "bitfit", "layernorms")


def _checked_lr_mults(value) -> tuple[tuple[str, float], ...]:
    """``lr_mults`` as sorted (family, multiple) pairs; one line for an unknown family or a bad multiple."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, (tuple, list)):
        raise ConfigError(f"lr_mults: expected a mapping of family: multiple, got {type(value).__name__}")
    checked = {}
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ConfigError(f"lr_mults: expected a mapping of family: multiple, got {value!r}")
        family, mult = pair
        if family not in lr_families():
            raise ConfigError(f"lr_mults.{family}: unknown family{suggest(family, lr_families())}")
        check_fields({family: mult}, "lr_mults.", {family: number(0, True)})  # finite too: not inf
        checked[family] = float(mult)
    return tuple(sorted(checked.items()))


__all__ = [
    "PetlConfig",
    "ModuleSpec",
    "lr_families",
    "parse_blocks",
    "form_keys",
    "POSITIONS",
    "BLOCKS",
    "GATE_SCOPES",
    "POOLINGS",
]
