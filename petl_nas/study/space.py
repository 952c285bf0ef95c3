"""Search spaces as data: a YAML space becomes an Optuna define-by-run sampler of `PetlConfig`s.

A space has named slots (where a module may go: ``site`` attn | ffn, and the ``forms`` it may take)
and dimensions (a list is a categorical choice, ``{low, high, log}`` a range, a scalar a fixed
value). Top-level dimensions apply to every slot; a slot may override them. The ``blocks``
dimension (default ``all``) places a slot's module in an encoder-decoder's encoder, decoder or
cross-attention; spaces that leave it out are unchanged for every backbone. Study parameters are
``<slot>.<dimension>`` plus the globals ``gates``, ``layers``, ``bitfit``, ``lr`` and the head's
``pooling`` and ``head_lr_mult``; they are a format, versioned by the file's ``version``.

Example:
    >>> space = SearchSpace.load("small")                          # doctest: +SKIP
    >>> config, recipe = space.sample(optuna_trial, n_layers=6)    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import POOLINGS, ModuleSpec, PetlConfig, parse_blocks
from ..core.forms import all_forms, form_named
from ..core.forms.weights import SPACE_TARGETS
from ..core.presets import space_dir
from ..errors import ConfigError, read_text, read_yaml, suggest

SITES = ("attn", "ffn")
LORA_TARGETS = SPACE_TARGETS  # a slot's `lora_targets` choices and the weights each names
# Where in the model a slot's module goes: every block, or a '+'-joined subset (encoder-decoders).
BLOCK_CHOICES = ("all", "encoder", "decoder", "cross", "encoder+decoder", "encoder+cross", "decoder+cross")
# dimension -> (kind, allowed values for categorical/fixed); ranges are int or float
SLOT_DIMENSIONS = {
    "insertion": ("choice", ("sequential", "parallel")),
    "composition": ("choice", ("add", "scaled")),
    "prefix_composition": ("choice", ("gated", "add", "scaled")),
    "bottleneck": ("int", None),
    "rank": ("int", None),
    "vera_rank": ("int", None),  # VeRA's r: hundreds where LoRA's is a few
    "frequencies": ("int", None),  # FourierFT's n coefficients per weight
    "length": ("int", None),
    "scale": ("float", None),
    "nonlinearity": ("choice", ("relu", "gelu", "tanh", "swish", "identity")),
    "lora_targets": ("choice", tuple(LORA_TARGETS)),
    "prefix_reparam": ("int_choice", None),
    "phm_n": ("int_choice", None),
    "init": ("choice", ("bert", "lora")),
    "dora": ("bool", None),  # LoRA as DoRA
    "blocks": ("choice", BLOCK_CHOICES),
}
GLOBAL_DIMENSIONS = {
    "gates": ("bool", None),
    "layers": ("choice", ("all", "top", "mask")),
    "bitfit": ("bool", None),
    "lr": ("float", None),
    "train_layernorms": ("bool", None),  # Houlsby, Compacter
    "prompt_length": ("int_choice", None),  # soft prompt tokens (0: none)
    "pooling": ("choice", POOLINGS),  # what the classifier reads (head.py)
    "head_lr_mult": ("float", None),  # the head's learning rate / the PETL rate
}
# Which slot dimensions each form reads (a form ignores the rest).


def slot_forms(site: str) -> tuple[str, ...]:
    """The forms a slot at ``site`` may hold: ``none`` and every registered form that sits there and
    names its search dimensions (`petl_nas.core.forms`)."""
    return ("none", *(f.name for f in all_forms() if site in f.positions and f.dimensions))


def form_dimensions(form: str) -> tuple[str, ...]:
    """Which slot dimensions ``form`` reads (a form ignores the rest)."""
    return () if form == "none" else form_named(form).dimensions


DEFAULTS = {
    "insertion": "parallel",
    "composition": "add",
    "prefix_composition": "gated",
    "nonlinearity": "relu",
    "lora_targets": "qv",
    "prefix_reparam": 0,
    "phm_n": 4,
    "init": "lora",
    "dora": False,
    "gates": False,
    "layers": "all",
    "bitfit": False,
    "blocks": "all",
    "pooling": "auto",
    "head_lr_mult": 1.0,
    "train_layernorms": False,
    "prompt_length": 0,
}


@dataclass(frozen=True)
class Dimension:
    """One searchable (or fixed) dimension, named as it is stored in the study."""

    name: str
    kind: str  # choice | int | float | fixed
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    value: Any = None

    def suggest(self, trial) -> Any:
        if self.kind == "fixed":
            return self.value
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def contains(self, value) -> bool:
        if self.kind == "fixed":
            return value == self.value
        if self.kind == "choice":
            return value in self.choices
        return self.low <= value <= self.high and (self.kind == "float" or float(value).is_integer())

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"= {self.value}"
        if self.kind == "choice":
            return "{" + ", ".join(map(str, self.choices)) + "}"
        return f"[{self.low}, {self.high}]" + (" log" if self.log else "")

    def size(self) -> float:
        if self.kind == "fixed":
            return 1
        if self.kind == "choice":
            return len(self.choices)
        if self.kind == "int":
            return int(self.high) - int(self.low) + 1
        return float("inf")


def _parse_dimension(name: str, raw, kind: str, allowed, where: str) -> Dimension:
    numeric = kind in ("int", "float")
    if isinstance(raw, dict):
        if not numeric:
            raise ConfigError(
                f"{where}: a range needs a numeric dimension; {name} takes one of {', '.join(map(str, allowed or ()))}"
            )
        extra = set(raw) - {"low", "high", "log"}
        if extra or not {"low", "high"} <= set(raw):
            raise ConfigError(f"{where}: a range is {{low, high, log}}, got keys {sorted(raw)}")
        low, high = raw["low"], raw["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise ConfigError(f"{where}: low and high must be numbers, got {low!r}, {high!r}")
        if low > high:
            raise ConfigError(f"{where}: low ({low}) is greater than high ({high})")
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{where}: {name} is an integer; low and high must be integers")
        if raw.get("log") and low <= 0:
            raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
        if low == high:
            return Dimension(name, "fixed", value=int(low) if kind == "int" else float(low))
        return Dimension(name, kind, low=low, high=high, log=bool(raw.get("log", False)))
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise ConfigError(f"{where}: empty choice list; give at least one value")
    for v in values:
        ok = (
            isinstance(v, bool)
            if kind == "bool"
            else isinstance(v, (int, float)) and not isinstance(v, bool)
            if numeric or kind == "int_choice"
            else v in allowed
        )
        if not ok:
            accepted = "true, false" if kind == "bool" else "numbers" if allowed is None else ", ".join(allowed)
            raise ConfigError(
                f"{where}: invalid value {v!r}{suggest(v, allowed) if allowed else f'; accepted: {accepted}'}"
            )
    if len(values) == 1:
        return Dimension(name, "fixed", value=values[0])
    return Dimension(name, "choice", choices=tuple(values))


@dataclass(frozen=True)
class Slot:
    name: str
    site: str
    forms: Dimension
    dims: dict[str, Dimension]


class SearchSpace:
    """A parsed, validated space file. `sample` is the define-by-run function."""

    def __init__(self, data: dict, source: str = "<space>"):
        self.source = source
        self.raw = copy.deepcopy(data)
        where = source
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a space file is a mapping")
        known = {"version", "name", "description", "slots"} | set(SLOT_DIMENSIONS) | set(GLOBAL_DIMENSIONS)
        for k in data:
            if k not in known:
                raise ConfigError(f"{where}: unknown key {k!r}{suggest(k, sorted(known))}")
        if not isinstance(data.get("version"), int):
            raise ConfigError(f"{where}: version: missing or not an integer (the format of the stored parameters)")
        self.version = data["version"]
        self.name = str(data.get("name", Path(source).stem))
        self.description = str(data.get("description", ""))
        slots = data.get("slots")
        if not isinstance(slots, dict) or not slots:
            raise ConfigError(f"{where}: slots: give at least one slot (e.g. attn: {{site: attn, forms: [...]}})")
        self.slots = [self._parse_slot(n, s, data) for n, s in slots.items()]
        self.globals = {}
        for name, (kind, allowed) in GLOBAL_DIMENSIONS.items():
            raw = data.get(name, DEFAULTS.get(name))
            if raw is None:
                raise ConfigError(f"{where}: {name}: missing (e.g. lr: {{low: 1.0e-4, high: 3.0e-3, log: true}})")
            self.globals[name] = _parse_dimension(name, raw, kind, allowed, f"{where}: {name}")

    def _parse_slot(self, name: str, body, top: dict) -> Slot:
        where = f"{self.source}: slots.{name}"
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: expected a mapping with site and forms")
        for k in body:
            if k not in ("site", "forms") and k not in SLOT_DIMENSIONS:
                raise ConfigError(f"{where}: unknown key {k!r}{suggest(k, ['site', 'forms', *SLOT_DIMENSIONS])}")
        site = body.get("site")
        if site not in SITES:
            raise ConfigError(f"{where}.site: must be one of attn, ffn; got {site!r}")
        forms = _parse_dimension(f"{name}.form", body.get("forms", []), "choice", slot_forms(site), f"{where}.forms")
        dims = {}
        used = {d for f in (forms.choices or (forms.value,)) for d in form_dimensions(f)}
        for dim, (kind, allowed) in SLOT_DIMENSIONS.items():
            raw = body.get(dim, top.get(dim, DEFAULTS.get(dim)))
            if raw is None:
                if dim in used:
                    raise ConfigError(f"{where}: dimension {dim!r} is needed by its forms but not given")
                continue
            dims[dim] = _parse_dimension(f"{name}.{dim}", raw, kind, allowed, f"{where}.{dim}")
        blocks = dims["blocks"]
        if site == "ffn" and any("cross" in b for b in (blocks.choices or (blocks.value,))):
            raise ConfigError(
                f"{where}.blocks: cross-attention has no FFN; an ffn slot takes all, encoder, "
                f"decoder (set blocks in the slot to override the top-level choice)"
            )
        return Slot(name, site, forms, dims)

    # ---- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path) -> SearchSpace:
        """A space file by path, or by name from `search_space/` (``small`` -> small.yaml)."""
        path = Path(name_or_path)
        if not path.exists():
            candidate = space_dir() / f"{name_or_path}.yaml"
            if candidate.exists():
                path = candidate
            else:
                names = sorted(p.stem for p in space_dir().glob("*.yaml") if p.stem != "presets")
                raise ConfigError(f"space {str(name_or_path)!r}: no such file{suggest(str(name_or_path), names)}")
        data = read_yaml(read_text(path), path)
        return cls(data, str(path))

    @property
    def hash(self) -> str:
        """A content hash of the parsed space: studies refuse a different space under the same name."""
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()[:16]

    # ---- sampling --------------------------------------------------------------------------
    def sample(self, trial, n_layers: int, flat: bool = False) -> tuple[PetlConfig, dict]:
        """Define-by-run: suggest this trial's parameters and return (PetlConfig, recipe overrides).

        With ``flat=True`` every dimension is suggested whatever the form (for samplers that need a
        fixed search space, like the GP sampler); unused values are ignored.
        """
        g = {name: dim.suggest(trial) for name, dim in self.globals.items() if name != "layers"}
        layers = self._sample_layers(trial, n_layers, flat)
        modules = []
        for slot in self.slots:
            form = slot.forms.suggest(trial)
            vals = {}
            for d in SLOT_DIMENSIONS if flat else form_dimensions(form):
                if d not in slot.dims:
                    continue
                if (
                    d == "scale"
                    and not flat
                    and "scaled" not in (vals.get("composition"), vals.get("prefix_composition"))
                ):
                    continue  # s only exists for scaled composition
                if d == "lora_targets" and slot.site == "ffn":
                    continue  # FFN LoRA always adapts W1 and W2
                vals[d] = slot.dims[d].suggest(trial)
            if form != "none":
                modules.append(self.module_spec(slot, form, vals, g["gates"], layers))
        config = PetlConfig(
            modules=tuple(modules),
            bitfit=bool(g["bitfit"]),
            pooling=g["pooling"],
            head_lr_mult=float(g["head_lr_mult"]),
            train_layernorms=bool(g["train_layernorms"]),
            prompt_length=int(g["prompt_length"]),
        )
        return config, {"lr": float(g["lr"])}

    def with_rate_scale(self, spread: float) -> SearchSpace:
        """This space for a study whose families train at measured rates (`petl_nas.search.rates`):
        its ``lr`` dimension becomes ``lr_scale`` in [1/spread, spread] (log), one multiplier of them
        all (fixed at 1 for a spread of 1). The space file, and so its hash, are the same."""
        scaled = copy.copy(self)
        scaled.globals = {
            **self.globals,
            "lr": (
                Dimension("lr_scale", "fixed", value=1.0)
                if spread == 1
                else Dimension("lr_scale", "float", low=1 / spread, high=spread, log=True)
            ),
        }
        return scaled

    def sample_lr(self, trial) -> float:
        """Only the learning rate, for a configuration given whole (a one-shot proposal)."""
        if "lr" not in self.globals:
            raise ConfigError(f"space {self.name!r} has no lr dimension to draw a learning rate from")
        return float(self.globals["lr"].suggest(trial))

    def _sample_layers(self, trial, n_layers: int, flat: bool) -> tuple[int, ...] | None:
        dim = self.globals["layers"]
        choice = dim.suggest(trial)
        top_k = mask = None
        if choice == "top" or (flat and "top" in (dim.choices or (dim.value,))):
            top_k = trial.suggest_int("layers.top_k", 1, n_layers)
        if choice == "mask" or (flat and "mask" in (dim.choices or (dim.value,))):
            mask = [trial.suggest_categorical(f"layers.mask.{i}", [True, False]) for i in range(n_layers)]
        if choice == "top":
            return tuple(range(n_layers - top_k, n_layers))
        if choice == "mask":
            chosen = tuple(i for i, on in enumerate(mask) if on)
            return chosen or (n_layers - 1,)  # an empty mask means the top layer, never nothing
        return None

    @staticmethod
    def module_spec(slot: Slot, form: str, v: dict, gated: bool, layers) -> ModuleSpec:
        """The ModuleSpec of ``form`` at ``slot`` with dimension values ``v``."""
        shape = form_named(form)
        kw: dict[str, Any] = {
            "form": form,
            "position": slot.site,
            "gate": bool(gated) and shape.takes_gate,
            "layers": layers,
            "blocks": parse_blocks(v.get("blocks", "all")),
        }
        comp = (
            v.get("prefix_composition")
            if "prefix_composition" in shape.dimensions
            else v.get("composition", shape.composition)
        )
        kw["composition"] = comp
        if comp == "scaled" and "scale" in v:  # else the form sets its own s (FourierFT's)
            kw["scale"] = float(v["scale"])
        kw.update(shape.spec_fields(slot.site, v))
        return ModuleSpec(**kw)

    # ---- presets as points of the space -------------------------------------------------------
    def with_head(self, config: PetlConfig) -> PetlConfig:
        """``config`` with this space's head: a fixed value replaces the config's; a searched one keeps
        the config's value when the space allows it, else takes the space's first choice. Presets
        are seeded and compared with the head the searched trials get."""
        import dataclasses

        head = {}
        for name in ("pooling", "head_lr_mult"):
            dim, own = self.globals[name], getattr(config, name)
            head[name] = (
                dim.value
                if dim.kind == "fixed"
                else own
                if dim.contains(own)
                else dim.choices[0]
                if dim.kind == "choice"
                else own
            )
        return dataclasses.replace(config, **head)

    def params_for(self, config: PetlConfig, lr: float, n_layers: int) -> dict | None:
        """The study parameters that sample exactly ``config`` (and ``lr``), or None if it is not a
        point of this space. Used to enqueue presets so the sampler learns from them."""
        found = self._structural_params(config, lr, n_layers)
        if found is None or not all(
            self._dimension(k).contains(v) for k, v in found.items() if self._dimension(k) is not None
        ):  # (layer placements are exact)
            return None
        return {k: v for k, v in found.items() if self._dimension(k) is None or self._dimension(k).kind != "fixed"}

    def nearest_point(self, config: PetlConfig, lr: float, n_layers: int) -> tuple[dict, list[str]] | None:
        """The point of this space nearest to ``config``: every number outside its range (a size, a
        scale, the learning rate) clamped to the range, nothing else changed. Returns the study
        parameters and what was changed (``["lr 0.0001 -> 0.0005"]``; empty for an exact point), or
        None when no clamping makes ``config`` a point (a form, position or choice it lacks)."""
        found = self._structural_params(config, lr, n_layers)
        if found is None:
            return None
        params, changes = {}, []
        for k, v in found.items():
            dim = self._dimension(k)
            if dim is None:  # layers.top_k, layers.mask.<i>: exact by construction
                params[k] = v
                continue
            if not dim.contains(v):
                if dim.kind not in ("int", "float"):
                    return None
                near = min(max(v, dim.low), dim.high)
                near = int(round(near)) if dim.kind == "int" else float(near)
                changes.append(f"{k} {v:g} -> {near:g}")
                v = near
            if dim.kind != "fixed":
                params[k] = v
        return params, changes

    def why_not(self, config: PetlConfig) -> str:
        """Why ``config`` has no nearest point here: the first module whose form or site the space lacks."""
        for m in config.modules:
            slots = [s for s in self.slots if s.site == m.position and m.form in (s.forms.choices or (s.forms.value,))]
            if not slots:
                return f"space {self.name!r} has no {m.form} at {m.position}"
        if len(config.modules) > len(self.slots):
            return f"space {self.name!r} holds {len(self.slots)} modules, the configuration {len(config.modules)}"
        layer_sets = {m.layers for m in config.modules}
        if len(layer_sets) > 1:
            return f"its modules sit on different layers; space {self.name!r} places them all on the same ones"
        layers, dim = next(iter(layer_sets), None), self.globals["layers"]
        choices = dim.choices or (dim.value,)
        if (layers is None and "all" not in choices) or (layers is not None and not {"top", "mask"} & set(choices)):
            return (
                f"space {self.name!r} has no layers = {'all' if layers is None else list(layers)} "
                f"(its layers: {', '.join(choices)})"
            )
        gates = any(m.gate for m in config.modules)
        for name, value in (
            ("bitfit", config.bitfit),
            ("train_layernorms", config.train_layernorms),
            ("prompt_length", config.prompt_length),
            ("gates", gates),
        ):
            if not self.globals[name].contains(value):
                return f"space {self.name!r} has no {name} = {value}"
        return (
            f"one of its modules' choices (insertion, composition, nonlinearity, targets, init, layers) "
            f"is not in space {self.name!r}"
        )

    def _structural_params(self, config: PetlConfig, lr: float, n_layers: int) -> dict | None:
        """Study parameters (fixed ones included, values unchecked against ranges) that decode to
        ``config`` when every value is taken as given; None when the space's structure cannot."""
        import itertools

        import optuna

        mods = list(config.modules)
        if len(mods) > len(self.slots):
            return None
        gates = {m.gate for m in mods if form_named(m.form).takes_gate}  # the others have none either way
        layer_sets = {m.layers for m in mods}
        if len(gates) > 1 or len(layer_sets) > 1:  # the space places every module on the same layers
            return None
        if any(m.gate and m.gate_per != "example" for m in mods):
            return None  # the spaces' gates are UniPELT's (per example)
        placements = self._layer_placements(layer_sets.pop() if layer_sets else None, n_layers)
        for placement, order in itertools.product(
            placements, itertools.permutations(range(len(self.slots)), len(mods))
        ):
            params = {
                "gates": gates.pop() if gates else False,
                "bitfit": config.bitfit,
                self.globals["lr"].name: lr,
                "pooling": config.pooling,
                "head_lr_mult": config.head_lr_mult,
                "train_layernorms": config.train_layernorms,
                "prompt_length": config.prompt_length,
                **placement,
            }
            gates = {params["gates"]}
            for slot in self.slots:
                params[f"{slot.name}.form"] = "none"
            ok = True
            for m, si in zip(mods, order):
                slot = self.slots[si]
                if slot.site != m.position:
                    ok = False
                    break
                params[f"{slot.name}.form"] = m.form
                params.update({f"{slot.name}.{k}": v for k, v in self._module_values(m).items()})
            if not ok:
                continue
            params = {k: v for k, v in params.items() if self._dimension(k) is not None or k in placement}
            categorical = [k for k in params if k not in placement and self._dimension(k).kind in ("choice", "fixed")]
            if not all(self._dimension(k).contains(params[k]) for k in categorical):
                continue
            try:
                with warnings.catch_warnings():  # FixedTrial warns about values outside a range
                    warnings.simplefilter("ignore")
                    decoded, recipe = self.sample(optuna.trial.FixedTrial(params), n_layers)
            except (ValueError, KeyError, ConfigError):
                continue
            if decoded == config and recipe["lr"] == lr:
                return params
        return None

    def _layer_placements(self, layers: tuple[int, ...] | None, n_layers: int) -> list[dict]:
        """The ``layers`` parameters (with ``layers.top_k`` or ``layers.mask.<i>``) that may place a
        configuration's modules on ``layers`` (None: every layer); `_structural_params` keeps the
        one that decodes to it."""
        dim = self.globals["layers"]
        choices = dim.choices or (dim.value,)
        if layers is None:
            return [{"layers": "all"}] if "all" in choices else []
        out = []
        k = len(layers)
        if "top" in choices and tuple(layers) == tuple(range(n_layers - k, n_layers)):
            out.append({"layers": "top", "layers.top_k": k})
        if "mask" in choices:
            out.append({"layers": "mask", **{f"layers.mask.{i}": i in layers for i in range(n_layers)}})
        return out

    @staticmethod
    def _module_values(m: ModuleSpec) -> dict:
        v = {
            "scale": m.scale,
            "init": m.init,
            "nonlinearity": m.nonlinearity,
            "composition": m.composition,
            "blocks": "all" if m.blocks is None else "+".join(m.blocks),
            **form_named(m.form).space_values(m),
        }
        keep = set(form_dimensions(m.form)) - ({"scale"} if m.composition != "scaled" else set())
        return {k: val for k, val in v.items() if k in keep}

    def _dimension(self, param: str) -> Dimension | None:
        if param in self.globals:
            return self.globals[param]
        if param == self.globals["lr"].name:  # lr_scale, in a calibrated study
            return self.globals["lr"]
        slot_name, _, dim = param.partition(".")
        for slot in self.slots:
            if slot.name == slot_name:
                return slot.forms if dim == "form" else slot.dims.get(dim)
        return None

    # ---- describing --------------------------------------------------------------------------
    def dimensions(self) -> list[Dimension]:
        out = [slot.forms for slot in self.slots]
        for slot in self.slots:
            forms = slot.forms.choices or (slot.forms.value,)
            used = {d for f in forms for d in form_dimensions(f)} - ({"lora_targets"} if slot.site == "ffn" else set())
            out += [
                slot.dims[d]
                for d in SLOT_DIMENSIONS
                if d in used and d in slot.dims and not (d in ("blocks", "dora") and slot.dims[d].value == DEFAULTS[d])
            ]  # the default says nothing
        return out + list(self.globals.values())

    def layer_parameters(self, n_layers: int | None) -> list[tuple[str, str]]:
        """The layer-placement parameters a study can hold besides `dimensions`: ``layers.top_k``
        when ``top`` is a choice, one ``layers.mask.<i>`` per layer when ``mask`` is (None: unknown L)."""
        choices = self.globals["layers"].choices or (self.globals["layers"].value,)
        out = []
        if "top" in choices:
            out.append(("layers.top_k", f"[1, {n_layers if n_layers else 'L'}]"))
        if "mask" in choices:
            if n_layers:
                out += [(f"layers.mask.{i}", "{True, False}") for i in range(n_layers)]
            else:
                out.append(("layers.mask.<i>", "{True, False}, one per layer"))
        return out

    def describe(self, n_layers: int | None = None) -> str:
        """Every parameter a study of this space can hold (on an ``n_layers``-layer backbone)."""
        searched = [d for d in self.dimensions() if d.kind != "fixed"]
        layer_rows = self.layer_parameters(n_layers)
        lines = [
            f"space {self.name} (version {self.version}, {self.source}, hash {self.hash})",
            self.description,
            "",
            f"{'parameter':<26}{'values':<44}",
        ]
        lines += [f"{d.name:<26}{d.describe():<44}" for d in self.dimensions()]
        lines += [f"{name:<26}{values:<44}" for name, values in layer_rows]
        finite = 1
        for d in searched:
            finite *= d.size()
        size = "infinite (continuous dimensions)" if finite == float("inf") else f"{finite:,.0f} points at most"
        total = len(searched) + len(layer_rows)
        per_layer = (
            ""
            if n_layers or not any(n.startswith("layers.mask") for n, _ in layer_rows)
            else " plus one layers.mask.<i> per layer beyond the first (--model counts them)"
        )
        where = f" on a {n_layers}-layer backbone" if n_layers else ""
        lines += [
            "",
            f"{total} parameters a study can hold{where}{per_layer}: {len(searched)} searched dimensions "
            f"and {len(layer_rows)} layer-placement parameters; {size} (conditional: fewer are active per trial)",
        ]
        return "\n".join(lines)


__all__ = ["SearchSpace", "Dimension", "Slot"]
