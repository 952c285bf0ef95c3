"""What the design space knows of one functional form, in one object: the `Form` contract and the
registry every layer reads forms from (`form_named`, `all_forms`).

A form says which `ModuleSpec` fields it reads and their defaults, which positions and insertions
it takes, how its modules are placed on a backbone (`place`, through the `Placement` that
`apply_petl` hands it), the search-space dimensions it reads and how they map onto its fields,
how it reads in one line, and what the PEFT and AdapterHub mappings make of it. Every default
below is what a new form gets without saying more: not searchable until it names its
dimensions, not a one-shot candidate, and "not expressible" in PEFT and AdapterHub.

Example:
    >>> form_named("lora").parallel_only
    True
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...errors import ConfigError, suggest

INITS = ("bert", "lora")  # a module's ``init``: BERT's random normal, or LoRA's (its output starts at 0)

# The fields every form reads (`ModuleSpec`); a form adds its own in `keys`.
COMMON_KEYS = (
    "form",
    "position",
    "size",
    "insertion",
    "composition",
    "scale",
    "learn_scale",
    "gate",
    "gate_per",
    "layers",
    "blocks",
)


class Form:
    """One functional form. Subclass it, set the attributes, override what differs, and register an
    instance: ``register(MyForm())`` (the whole of a new form: `docs/architecture.md`, "Adding a PETL method").

    Attributes:
        name: the ``form:`` value of a module spec (``lora``).
        title: how it reads in a configuration's one-line description (``LoRA``).
        keys: the `ModuleSpec` fields it reads besides `COMMON_KEYS` (a field outside them set away
            from its default is refused, so every design round-trips).
        positions: where it can sit: ``attn``, ``ffn``.
        parallel_only: it reads the sublayer's input x by construction (He et al.: LoRA, prefix).
        head_attention: it edits attention heads through transformers' attention interface.
        gated_composition: it takes composition ``gated`` (prefix tuning's λ).
        composition, init: its defaults for those fields.
        size_letter: what its size is called in a description (``r``, ``l``).
        sized: whether ``size`` means anything to it (IA3's vectors are as wide as their weights: no).
        dimensions: the search-space dimensions a slot of this form reads (none: not searchable).
        size_dimension: which of them is its size.
        supernet_rank: its place among the one-shot supernet's candidates (None: not a candidate).
        sums_by_size: two of its modules that differ only in size, ungated, with a fixed scale and no
            dropout, are one module of the summed size: the same function family with as many
            parameters (LoRA: s·B₁A₁x + s·B₂A₂x = s·[B₁ B₂][A₁; A₂]x). `petl_nas.core.canonical`
            merges them. Not the bottleneck adapter: two output biases become one.
        takes_gate: UniPELT's gate applies to it (a space's ``gates`` leaves a form without one ungated).
        zero_start_inits: the ``init`` values under which its output starts at zero (a zero output
            projection and bias: LoRA's B, an adapter's up projection); none for a form whose
            output never does (a multi-head adapter's, prefix tuning's).

    `scale_is_a_rate` says whether a module's fixed scale s is, under Adam, only a learning-rate
    multiple of its output projection (`petl_nas.core.family_rates.at_reference_scales`).
    """

    name: str = ""
    title: str = ""
    keys: tuple[str, ...] = ()
    positions: tuple[str, ...] = ("attn", "ffn")
    parallel_only: bool = False
    head_attention: bool = False
    gated_composition: bool = False
    composition: str = "add"
    init: str = "bert"
    size_letter: str = "r"
    sized: bool = True
    dimensions: tuple[str, ...] = ()
    size_dimension: str | None = None
    supernet_rank: int | None = None
    sums_by_size: bool = False
    takes_gate: bool = True
    zero_start_inits: tuple[str, ...] = ()

    # ---- the genotype ------------------------------------------------------------------------
    def targets(self, position: str) -> tuple[str, ...]:
        """The weights its ``targets`` may name at ``position`` (empty: it takes no targets)."""
        return ()

    def default_targets(self, position: str) -> tuple[str, ...] | None:
        return None

    def check(self, spec, where: str) -> None:
        """Refuse what only this form cannot take (after the common checks), naming ``where.field``."""

    def sums(self, spec) -> bool:
        """Whether ``spec`` sums by size (`sums_by_size`), unless one of its own fields says not."""
        return self.sums_by_size

    def scale_is_a_rate(self, spec) -> bool:
        """``spec``'s scale is a fixed s (``add``: 1, or ``scaled``, not learned) on an output that
        starts at zero (its init is one of ``zero_start_inits``): Δh = s·F(U, θ) with F linear in a
        group of parameters U (the output projection and its bias) that starts at zero and that
        nothing else reads. Then the model at scale s with U is the model at scale 1 with s·U, so
        training it at scale s is training it at scale 1 with U's learning rate s times higher
        (Adam's step does not see a gradient's scale): s is a rate, not structure."""
        return spec.composition in ("add", "scaled") and not spec.learn_scale and spec.init in self.zero_start_inits

    # ---- on a backbone -----------------------------------------------------------------------
    def shared(self, spec):
        """A module shared by every layer of one module spec (Compacter's PHM rule), or None."""
        return None

    def place(self, spec, at) -> None:
        """Build this module's layers for one block of the backbone and put them on it, through
        ``at`` (`petl_nas.core.inject.Placement`: the block, its covered layers, where to edit)."""
        raise NotImplementedError(f"form {self.name!r} does not say how it is placed")

    # ---- the search space --------------------------------------------------------------------
    def spec_fields(self, site: str, values: dict) -> dict[str, Any]:
        """The `ModuleSpec` fields of a point of the space, from its dimension ``values``."""
        return {}

    def space_values(self, spec) -> dict[str, Any]:
        """The inverse of `spec_fields`: the dimension values that give ``spec``."""
        return {}

    def size_step(self, values: dict) -> int:
        """Sizes are multiples of this (Compacter: n)."""
        return 1

    def supernet_fields(self, site: str, space, gate: dict) -> dict[str, Any]:
        """The fields of its one-shot candidate at ``site`` (only with a `supernet_rank`), beside its
        size: ``space.smallest(dim)`` is a dimension's smallest value there, ``space.targets(site)``
        the weights it allows there; ``gate`` is ``{"gate": True}`` where the space allows gates."""
        return dict(gate)

    # ---- text and other libraries ------------------------------------------------------------
    def describe(self, spec) -> list[str]:
        """What a description says after ``<position> <title> <letter>=<size>``."""
        return []

    def short_words(self, spec) -> list[str]:
        """What a short name (a console line) says after ``<title> <letter>=<size>``: where it sits."""
        return [spec.position]

    def adapters_config(
        self, spec, hidden_size: int, leave_out: list[int], scaling: float, where: str, reasons: list[str]
    ) -> dict | None:
        """Its AdapterHub config, or None with a reason appended when it has none."""
        reasons.append(f"{where}: AdapterHub has no {self.title}")
        return None

    def peft_refusal(self, spec, where: str) -> str | None:
        """Why PEFT cannot express it (None: PEFT's tuner `peft_type` can; `deploy.interop` maps it)."""
        return f"{where}: PEFT has no {self.title}"

    # ---- HF PEFT: a form PEFT expresses says how (`deploy.interop`, `deploy.convert`) -------------
    peft_type: str | None = None  # PEFT's ``peft_type`` for it (``LORA``, ``IA3``, ``VERA``, ...)

    def peft_fields(self, spec, target_modules: str) -> dict[str, Any]:
        """``spec``'s fields of a PEFT config of type `peft_type` (beside ``peft_type``, ``task_type``
        and ``modules_to_save``, which `deploy.interop` writes), where ``target_modules`` is a regular
        expression naming exactly the backbone modules it adapts, layers written in."""
        raise NotImplementedError(f"form {self.name!r} does not say how PEFT writes it")

    def peft_weights(self, module, layer, adapter: str = "default") -> None:
        """Copy the trained tensors of ``module`` (this form's module on one weight) into PEFT's
        tuner layer ``layer`` that wraps the same weight (its adapter ``adapter``), so that the
        PEFT model computes what this one does."""
        raise NotImplementedError(f"form {self.name!r} does not say how PEFT holds its weights")


_FORMS: dict[str, Form] = {}


def register(form: Form) -> Form:
    """Add ``form`` to the registry (a name taken twice is an error) and return it."""
    if not form.name or not form.title:
        raise ValueError("a form needs a name and a title")
    if form.name in _FORMS and type(_FORMS[form.name]) is not type(form):
        raise ValueError(f"form {form.name!r} is registered already")
    if unknown := [i for i in form.zero_start_inits if i not in INITS]:
        raise ValueError(f"form {form.name!r}: zero_start_inits names {unknown[0]!r}, not an init ({', '.join(INITS)})")
    _FORMS[form.name] = form
    return form


@contextlib.contextmanager
def registered(form: Form):
    """``form`` registered within the block only (a plugin's test, a form tried out in a notebook)."""
    register(form)
    try:
        yield form
    finally:
        _FORMS.pop(form.name, None)


def form_named(name: str, where: str = "form") -> Form:
    """The registered form called ``name``, or one `ConfigError` naming the ones there are."""
    if name not in _FORMS:
        raise ConfigError(f"{where}: unknown value {name!r}{suggest(name, form_names())}")
    return _FORMS[name]


def form_names() -> tuple[str, ...]:
    return tuple(_FORMS)


def all_forms() -> tuple[Form, ...]:
    return tuple(_FORMS.values())


__all__ = ["Form", "COMMON_KEYS", "register", "registered", "form_named", "form_names", "all_forms"]
