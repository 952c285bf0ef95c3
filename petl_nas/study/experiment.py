"""Experiment files: one YAML per search (backbone, task, data, budget, space, trials, fidelity).

Files list only what differs from the defaults below; command-line flags override the file.

Example (``experiments/examples/smoke.yaml``)::

    name: smoke
    backbone:
      tiny: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 64, vocab_size: 600}
    task: demo_keyword
    budget: 5%
    space: small
    trials: 8
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.presets import check_preset_names, preset_names
from ..errors import ConfigError, check_keys, read_text, read_yaml
from ..rules import (
    BOOL,
    TEXT,
    Rule,
    auto_or,
    check_fields,
    field_rules,
    number,
    one_of,
    option,
    optional,
    whole,
    yaml_hint,
)
from ..training.compiling import COMPILE_MODES
from ..training.costs import check_objectives
from .storage_url import STUDY_FILE, as_url

# a trial trains on one device: more than one GPU would be reserved and idle (and Ray takes no 1.5 GPUs)
_ONE_GPU_AT_MOST = Rule(
    (lambda v: number(0, False)[0](v) and v <= 1),
    "a number from 0 to 1 (a trial trains on one GPU; a fraction shares a card)",
    {"type": "number", "minimum": 0, "maximum": 1},
)
# A search's name is also its folder, runs/NAME: one plain path component, so no name writes elsewhere.
_RUN_NAME = Rule(
    (lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v) is not None),
    "a plain name of letters, digits, '.', '_' or '-' (it names the folder runs/NAME)",
    {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"},
)


_BUDGET = re.compile(r"^(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(%?)$")
BUDGET_SCHEMA = {"anyOf": [{"type": "string", "pattern": _BUDGET.pattern}, {"type": "integer", "minimum": 0}]}


def check_budget_text(text: str | int | float) -> re.Match:
    """ConfigError unless ``text`` is written as a budget (a count or a percentage), before the
    backbone's size is known; the match of its number and its ``%``."""
    m = _BUDGET.match(str(text).strip())
    if not m:
        raise ConfigError(
            f"budget: {text!r} is not a count (120000, 1.2e5) or a percentage of the "
            f"backbone (0.5%); no spaces, no sign"
        )
    return m


def check_budget_list(values, where: str) -> list:
    """``values`` as a list of budgets (``0.01%`` or counts), each checked by `check_budget_text`;
    one error line prefixed by ``where`` otherwise."""
    if not isinstance(values, (list, tuple)) or not values or not all(isinstance(v, (str, int)) for v in values):
        raise ConfigError(f"{where}: expected a non-empty list such as [0.01%, 0.05%, 0.5%], got {values!r}")
    for value in values:
        try:
            check_budget_text(value)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return list(values)


def parse_budget(text: str | int | float | None, backbone_params: int | None) -> int | None:
    """``"0.5%"`` of the backbone or an absolute count (``120000``, ``1.2e5``) -> parameters; neither
    may exceed the whole backbone (``backbone_params``; None: an older study that did not record it,
    where only a count is accepted)."""
    if text is None or text == "":
        return None
    m = check_budget_text(text)
    value = float(m.group(1))
    if m.group(2):
        if value > 100:
            raise ConfigError(f"budget: {text!r} is more than the whole backbone")
        if backbone_params is None:
            raise ConfigError(
                f"budget: {text!r} is a percentage, and this study did not record its backbone's "
                f"size; give a count of parameters"
            )
        return int(value / 100 * backbone_params)
    if not value.is_integer():
        raise ConfigError(f"budget: {text!r} is a fraction of a parameter; write a whole count or add %")
    if backbone_params is not None and value > backbone_params:
        raise ConfigError(f"budget: {text!r} is more than the whole backbone ({backbone_params:,} parameters)")
    return int(value)


NEW_STUDY_PRECISION = "native"  # `fidelity.precision: auto` in a new study: bf16 where computed natively
NEW_STUDY_LENGTH_BUCKETS = 16  # `fidelity.length_buckets: auto` in a new study: 0.36x the tokens on SST-2


_SHARE_FROM_0 = Rule(
    (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1),
    "a number in [0, 1)",
    {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
)


_NAME_OR_MAPPING = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "object"}]}


LARGE_BUDGET = 0.10  # of the backbone: PETL methods train well under 5% (Houlsby's adapters 3.6%)


def large_budget_warning(text, budget: int | None, backbone_params: int) -> str | None:
    """What to say when a budget is a large share of the backbone (``50%`` typed for ``0.5%``): a
    budget that big is allowed (a comparison with full fine-tuning), never taken in silence."""
    if budget is None or budget <= LARGE_BUDGET * backbone_params:
        return None
    raw = str(text).strip()
    meant = f" (did you mean {float(raw[:-1]) / 100:g}%?)" if raw.endswith("%") else ""
    return (
        f"budget {raw} is {budget:,} parameters, {budget / backbone_params:.0%} of the backbone; PETL "
        f"configurations usually take under 5%{meant}"
    )


@dataclass(frozen=True)
class Fidelity:
    """How cheaply each search trial is trained and scored.

    Attributes:
        k: training examples per trial (UniPELT's low-resource protocol; None = all).
        epochs: epochs per trial, or ``auto`` (the default): calibrated before the search on a few presets, the
            shortest length at which they clear the trivial baseline, rank as at the final length and score
            within noise of it (`petl_nas.search.calibrate`). ``fidelity: auto`` is short for it.
        batch_size, max_length, evals_per_epoch: the rest of the trial recipe.
        length_buckets: 0 shuffles training rows uniformly; N > 0 batches rows of similar lengths,
            drawn from pools of N batches of shuffled rows: less padding to compute. ``auto`` (the
            default): `NEW_STUDY_LENGTH_BUCKETS` for a new study (a 10-epoch MiniLM trial about 3x
            cheaper at equal scores, ``bench/results/trial_throughput_sst2.md``), and what a
            resumed study recorded (0 for one made before it was the default).
        frozen_cache_mb: 0 (the default) runs every layer at every step; N > 0 runs the layers
            below a trial's lowest trainable one without dropout and reuses their output across
            epochs and trials, kept in memory up to N MiB per worker (`petl_nas.training.frozen`).
        precision: ``native`` (bf16 wherever the device computes it natively: a GPU from Ampere
            on, a CPU with AVX512-BF16 or AMX, where a trial is 1.6x faster at equal scores,
            ``bench/results/trial_throughput_sst2.md``; full precision elsewhere), ``bf16`` (on any
            device, emulated where not native), ``fp32``, or ``auto`` (the default):
            `NEW_STUDY_PRECISION` for a new study and what a resumed study recorded (one made
            before ``native`` recorded ``auto``: bf16 on a GPU, full precision on a CPU). The
            exported record's final runs compute the same way (`petl_nas.core.precision`).
        compile: ``off`` (the default) or a ``torch.compile`` mode for every trial's steps:
            ``default``, ``reduce-overhead`` (CUDA graphs on a GPU) or ``max-autotune``
            (`petl_nas.training.compiling`). Compiling costs time in every trial: it pays for long trials
            on a GPU; not with ``frozen_cache_mb``.
        cuda_graphs: false (the default) or true: on a GPU, each trial records its training step
            once per batch shape and replays it as a CUDA graph (`petl_nas.training.step_graphs`): no
            compilation, a fraction of the host's work per step. Ignored on a CPU; not with
            ``compile`` or ``frozen_cache_mb``.
        search_dev: examples carved (at random, by the data seed) from the training data to
            score trials on.
        max_steps: cap on each trial's optimiser steps (None: ``epochs`` decide).
        eval_rows: score each evaluation on the first rows of the search dev only (None: all);
            beam search makes this the main cost of a generation trial.
        score: a trial's score is its ``last`` evaluation (as the final runs report) or its
            ``best`` one. The best of several noisy evaluations favours unstable configurations,
            which the final recipe then does not reproduce.
    """

    k: int | None = option(1000, "training rows per trial (`null`: all of them)", optional(whole(1)))
    epochs: float | str = option(
        "auto", "epochs per trial, or `auto`: calibrated on a few presets before the search", auto_or(number(0, True))
    )
    batch_size: int = option(32, "rows per batch", whole(1))
    max_length: int = option(64, "tokens per row (longer rows are cut)", whole(1))
    evals_per_epoch: int = option(
        1,
        "evaluations per epoch where every one is read (ASHA, `score: best`); otherwise a trial evaluates once",
        whole(1),
    )
    length_buckets: int | str = option(
        "auto",
        "`0`: a uniform shuffle; N: batches of rows of similar lengths, from pools of N batches; `auto`: 16 "
        "in a new study, what a resumed study recorded",
        auto_or(whole(0)),
    )
    frozen_cache_mb: int = option(
        0,
        "`0`: off; N: reuse what the frozen layers below a trial's lowest trained one compute, up to N MiB per worker",
        whole(0),
    )
    precision: str = option(
        "auto",
        "`native` (bf16 wherever the device computes it natively: a GPU from Ampere on, a CPU with "
        "AVX512-BF16 or AMX; fp32 elsewhere), `bf16`, `fp32`, or `auto`: `native` for a new study, what a "
        "resumed study recorded (one made before `native` recorded `auto`: bf16 on a GPU, fp32 on a CPU)",
        one_of("auto", "native", "bf16", "fp32"),
    )
    compile: str = option(
        "off",
        "`off`, or a `torch.compile` mode for every trial's steps",
        Rule(one_of(*COMPILE_MODES)[0], one_of(*COMPILE_MODES)[1], {"enum": [*COMPILE_MODES, False]}),
    )  # YAML 1.1 reads a bare off as false
    cuda_graphs: bool = option(
        False, "on a GPU: each step recorded once per batch shape and replayed as a CUDA graph", BOOL
    )
    search_dev: int = option(500, "rows carved from the training data to score trials on", whole(1))
    max_steps: int | None = option(None, "a cap on each trial's optimiser steps", optional(whole(1)))
    eval_rows: int | None = option(
        None, "score each evaluation on the search dev's first rows only", optional(whole(1))
    )
    score: str = option("last", "a trial's score: its `last` evaluation or its `best` one", one_of("last", "best"))

    def __post_init__(self):
        if self.compile is False:  # YAML 1.1 reads a bare ``off`` as false
            object.__setattr__(self, "compile", "off")
        if self.compile is True:
            raise ConfigError(
                "fidelity: compile: expected one of " + ", ".join(COMPILE_MODES) + ", got true (YAML "
                "reads on and yes as true: name a mode, such as default)"
            )
        check_fields(self, "fidelity: ", field_rules(Fidelity))
        if self.compile != "off" and self.frozen_cache_mb:
            raise ConfigError(
                "fidelity: compile and frozen_cache_mb cannot be combined (the cached layers' "
                "per-batch feeding would recompile every step); set one of them to its default"
            )
        if self.cuda_graphs and (self.compile != "off" or self.frozen_cache_mb):
            raise ConfigError(
                "fidelity: cuda_graphs cannot be combined with compile (it records its own graphs) "
                "or frozen_cache_mb (fed batch by batch); set one of them to its default"
            )


@dataclass(frozen=True)
class FinalEval:
    """The re-evaluation of the Pareto front on the held-out test split (the task's dev set)."""

    seeds: int = option(3, "seeds each re-evaluated configuration trains (`0`: no re-evaluation)", whole(0))
    epochs: float = option(10.0, "epochs of the final recipe", number(0, True))
    k: int | None = option(
        -1, "training rows of the final runs: `-1` the search's K, `null` all of them", optional(whole(-1))
    )
    max_front: int = option(8, "front members re-evaluated at most (best search scores first)", whole(1))
    presets: str = option(
        "best", "also re-evaluate the best preset within budget (`all`, `none`)", one_of("best", "all", "none")
    )
    max_steps: int | None = option(None, "a cap on each final run's optimiser steps", optional(whole(1)))
    eval_rows: int | None = option(None, "score on the test split's first rows only", optional(whole(1)))
    baselines: bool = option(True, "the LoRA rank sweep within the budget, trained on top of `trials`", BOOL)
    confirm: int = option(
        3,
        "re-score this many top trials, and the best baselines (`confirm_baselines`), over "
        "extra seeds on the search dev before choosing (`0`: choose by single scores)",
        whole(0),
    )
    confirm_seeds: int = option(2, "the extra seeds of each confirmed trial", whole(1))
    confirm_baselines: int = option(
        3,
        "also re-score up to this many baselines (presets, rank-sweep points, the baselines built for the budget) "
        "whose search scores are within noise of the best baseline's; the best baseline is then the best "
        "confirmed mean among them (where none learned and a searched trial did: the one with the best search "
        "score)",
        whole(1),
    )
    reference: str | None = option(
        "lora",
        "a preset (PEFT's LoRA r=8 on q, v by default) confirmed beside them wherever it learned; a pick "
        "with more deployable parameters that does not beat it beyond noise on search-dev gives way to it, "
        "unless the best baseline or the best confirmed mean does (`null`: off; no effect where the preset "
        "is over the budget or not among the study's presets)",
        lambda: optional(one_of(*preset_names())),
    )

    def __post_init__(self):
        check_fields(self, "final: ", field_rules(FinalEval))


@dataclass(frozen=True)
class Rates:
    """Each family's learning rate, measured before the search (`petl_nas.search.rates`).

    Attributes:
        calibrate: ``auto`` (the default for a new study): before the trials, each family of
            modules the space holds (LoRA, adapters, Compacter, prefixes, ...) is trained on one
            of its presets at the trial recipe, climbing from its paper rate in steps of 3 while
            the search-dev score rises; every trial then trains each family at its measured rate,
            and the sampler draws one multiplier ``lr_scale`` of all of them. ``off``: one rate per
            trial, drawn from the space's ``lr`` range (what studies did before). A resumed study
            keeps what it recorded.
        file: a ``rates.json`` an earlier calibration wrote (``runs/NAME/rates.json``) to reuse
            instead of measuring again: the same backbone; another task is allowed and said.
        spread: ``lr_scale`` ranges over [1/spread, spread] (log); 1 trains every trial at exactly
            the measured rates.
        share: calibration may take at most this share of the runs the study will train (its
            trials, presets, sweep and baselines, a supernet's proposals, confirmation and final
            runs: `rates.planned_runs`); the families it cannot afford to measure take their paper
            rate times the factor measured on the others.
    """

    calibrate: str = option(
        "auto",
        "`auto`: measure each family's rate on search-dev before the trials, which then "
        "draw only `lr_scale`; `off`: one rate per trial from the space's `lr`",
        one_of("auto", "off"),
    )
    file: str | None = option(
        None,
        "a `rates.json` of an earlier study on the same backbone to reuse instead of "
        "measuring (rates in (0, 1], scales in (0, 1000])",
        optional(TEXT),
    )
    spread: float = option(
        2.0, "`lr_scale` ranges over [1/spread, spread] around the measured rates (`1`: exactly them)", number(1, False)
    )
    share: float = option(
        0.15,
        "calibration takes at most this share of the runs the study will train (trials, "
        "presets, sweep, baselines, one-shot proposals, confirmation, finals)",
        Rule(
            (lambda v: number(0, True)[0](v) and v < 1),
            "a number between 0 and 1",
            {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        ),
    )
    FILE = "rates.json"  # what a study that measures the rates writes in its run folder

    def __post_init__(self):
        check_fields(self, "rates: ", field_rules(Rates))
        if self.file is not None and self.calibrate == "off":
            raise ConfigError("rates: file gives measured rates, and calibrate: off asks for none; drop one of them")

    @property
    def on(self) -> bool:
        return self.calibrate != "off"


@dataclass(frozen=True)
class OneShot:
    """The one-shot supernet run of ``strategy: oneshot`` or ``both`` (`petl_nas.search.oneshot`).

    Attributes:
        rungs: budgets on the ladder (from the smallest one-unit count to the budget), each read off
            the trained supernet as one proposal (identical ones are proposed once).
        lr: the supernet's learning rate. In a study whose families train at measured rates
            (``rates``), each family of the supernet trains at its measured rate instead, as trials
            do; a knob search's ``lr`` then moves them all by ``lr`` / this value.
        proposal_lr: the proposals' learning rate when they are trained as trials: ``supernet``
            (the default: ``lr``), ``sampler`` (the study's sampler draws it from the space's ``lr``
            range, as for the LoRA rank sweep; before the sampler has seen trials that is a random
            draw), or a number. In a study whose families train at measured rates (``rates``),
            ``sampler`` draws ``lr_scale`` and the others train every family at its measured rate.
        gate_lr: the gates' learning rate (they must decide within a short run).
        epochs: the supernet's training length (None: the trials' fidelity epochs).
        init_open: every gate's starting chance of being open.
        penalty_step: how fast the count's Lagrange multiplier rises while the expected count is
            over the budget (the penalty's strength).
        warmup: the share of the supernet's steps trained before the count's penalty starts, so
            its weights and gates learn the task before the penalty closes gates (without it, on
            QNLI the penalty shut every form's gates alike before the task was learned and the
            supernet scored at the trivial baseline: experiments/oneshot/README.md).
        temperature: the hard-concrete gates' β (lower: samples nearer a coin flip of 0 and 1).
        runs: supernet runs. With more than one, Optuna searches the knobs named in ``search``
            across them (`petl_nas.search.oneshot.knobs`: the first run at the values above) and the
            run whose proposals score best with the supernet's own weights proposes.
        search: ``{knob: [low, high]}`` for any of `KNOBS` (the others stay at the values above);
            None with ``runs`` > 1: `DEFAULT_SEARCH`.
        budgets: smaller budgets (``0.01%`` or a count) the supernet also proposes for, each with
            its own ladder, written with its proposals to ``runs/NAME/oneshot.json`` (a suite's
            largest budget serving the others: `petl_nas.suite`).
        file: a ``oneshot.json`` another study's supernet wrote: this study trains no supernet and
            enqueues the proposals it holds for this study's budget (the same backbone, task, data
            and space; refused otherwise).
        anchors: also propose, at the budget, the largest baseline of each kind that fits (LoRA
            on q, v; on every linear layer; on the top layers; a soft prompt; BitFit; LayerNorms)
            with what the supernet keeps beside it in the rest of the budget
            (`petl_nas.search.oneshot.derive.anchored`).
        retry_lr: a supernet that did not learn (search-dev within noise of the trivial baseline)
            or whose loss diverged is trained once more with every rate times this (0: not
            retried, a divergence is an error; not in a knob search).
            A supernet sums every candidate of a sublayer, so the rates measured for one module at
            a time can be too fast for it: on CoLA (0.5%) it scored MCC 0.000 at the trials' rates
            and 0.090 at a third of them (experiments/oneshot/README.md).
    """

    FILE = "oneshot.json"  # what ``budgets`` writes in the study's run folder and ``file`` reads
    KNOBS = {"lr": "log", "gate_lr": "log", "penalty_step": "log", "temperature": "linear", "init_open": "linear"}
    DEFAULT_SEARCH = {
        "lr": (3e-4, 3e-3),
        "gate_lr": (0.01, 0.2),
        "penalty_step": (0.005, 0.08),
        "temperature": (1 / 3, 1.0),
    }

    rungs: int = option(
        10, "budgets on the ladder up to the budget, each read off the supernet as one proposal", whole(1)
    )
    lr: float = option(
        1e-3,
        "the supernet's learning rate; in a study with measured rates (`rates: auto`), each "
        "family of the supernet trains at its measured rate instead (a knob search's `lr` moves "
        "them all by `lr` / this value)",
        number(0, True),
    )
    proposal_lr: str | float = option(
        "supernet",
        "the proposals' rate as trials: `supernet` (its `lr`), `sampler`, or a number",
        Rule(
            (
                lambda v: (
                    v in ("sampler", "supernet") or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)
                )
            ),
            "sampler, supernet or a positive number",
            {"anyOf": [{"enum": ["sampler", "supernet"]}, {"type": "number", "exclusiveMinimum": 0}]},
        ),
    )
    gate_lr: float = option(0.05, "the gates' learning rate", number(0, True))
    epochs: float | None = option(
        None, "the supernet's training length (default: the trials' epochs)", optional(number(0, True))
    )
    init_open: float = option(
        0.9,
        "every gate's starting chance of being open",
        Rule(
            (lambda v: isinstance(v, (int, float)) and 0 < v < 1),
            "a number between 0 and 1",
            {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        ),
    )
    penalty_step: float = option(0.02, "how fast the count's penalty rises while over the budget", number(0, True))
    warmup: float = option(
        0.5,
        "the share of the supernet's steps trained before the count's penalty starts (its "
        "weights and gates learn the task first; `0`: the penalty from the first step, as "
        "before 2026-11-29)",
        _SHARE_FROM_0,
    )
    temperature: float = option(2 / 3, "the hard-concrete gates' β (2/3)", number(0, True))
    runs: int = option(1, "supernet runs; with more, Optuna searches the knobs in `search` across them", whole(1))
    search: dict | None = option(
        None,
        "`{knob: [low, high]}` for `lr`, `gate_lr`, `penalty_step`, `temperature`, `init_open` (default with "
        "`runs` > 1: the first four)",
        accepts="a mapping of knob: [low, high], or null",
        schema={
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "minProperties": 1,
                    "propertyNames": {"enum": ["lr", "gate_lr", "penalty_step", "temperature", "init_open"]},
                    "additionalProperties": {
                        "type": "array",
                        "minItems": 2,
                        "maxItems": 2,
                        "items": {"type": "number", "exclusiveMinimum": 0},
                    },
                },
            ]
        },
    )
    budgets: list | None = option(
        None,
        "smaller budgets (`0.01%` or counts) the supernet also proposes for, each with its own ladder, written "
        "to `runs/NAME/oneshot.json`",
        accepts="a list of budgets (0.01% or counts), or null",
        schema={"anyOf": [{"type": "null"}, {"type": "array", "minItems": 1, "items": BUDGET_SCHEMA}]},
    )
    file: str | None = option(
        None,
        "an `oneshot.json` of another study: enqueue its proposals for this budget and "
        "train no supernet (same backbone, task, data and space)",
        optional(TEXT),
    )
    anchors: bool = option(
        True,
        "also propose, at each budget, the largest baseline of each kind that fits (LoRA on "
        "q, v; on every linear layer; on the top layers; a prompt; BitFit; LayerNorms) "
        "whole, with what the supernet keeps beside it in the rest of the budget",
        BOOL,
    )
    retry_lr: float = option(
        1 / 3,
        "a supernet that did not learn (search-dev within noise of the trivial baseline) "
        "or whose loss diverged is trained once more with every rate times this (`0`: not "
        "retried; a knob search is not retried); the record keeps the first run's score",
        _SHARE_FROM_0,
    )

    def __post_init__(self):
        check_fields(self, "oneshot: ", field_rules(OneShot))
        if self.budgets is not None:
            object.__setattr__(self, "budgets", check_budget_list(self.budgets, "oneshot: budgets"))
        if self.file is not None and (self.budgets or self.runs > 1):
            raise ConfigError(
                "oneshot: file reads another study's proposals and trains no supernet: "
                "budgets and runs apply to a study that trains one"
            )
        if self.search is not None:
            if not isinstance(self.search, dict) or not self.search:
                raise ConfigError(f"oneshot: search: expected a mapping of knob: [low, high], got {self.search!r}")
            if self.runs < 2:
                raise ConfigError(
                    "oneshot: search: knob ranges need runs >= 2 (runs: 1 trains one supernet at the fixed knobs)"
                )
            for name, bounds in self.search.items():
                if name not in self.KNOBS:
                    raise ConfigError(f"oneshot: search: unknown knob {name!r} (knobs: {', '.join(self.KNOBS)})")
                ok = (
                    isinstance(bounds, (list, tuple))
                    and len(bounds) == 2
                    and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
                    and 0 < bounds[0] < bounds[1]
                    and (name != "init_open" or bounds[1] < 1)
                )
                if not ok:
                    raise ConfigError(
                        f"oneshot: search: {name}: expected [low, high] with 0 < low < high"
                        f"{' < 1' if name == 'init_open' else ''}, got {bounds!r}"
                        + (
                            next((h for h in map(yaml_hint, bounds) if h), "")
                            if isinstance(bounds, (list, tuple))
                            else ""
                        )
                    )
        for name, (low, high) in self.knob_ranges().items():  # the knob search's first run takes them
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(
                    f"oneshot: {name} {value:g} is outside the knob search's range [{low:g}, {high:g}] "
                    f"(its first run trains at the fixed knobs): widen oneshot.search.{name} or "
                    f"change {name}"
                )

    def knob_ranges(self) -> dict[str, tuple[float, float]]:
        """What the knob search varies: ``search``, else `DEFAULT_SEARCH`; nothing for one run."""
        if self.runs < 2:
            return {}
        return {k: tuple(v) for k, v in (self.search or self.DEFAULT_SEARCH).items()}

    def knobs(self) -> dict[str, float]:
        """The fixed value of every knob (the first run's)."""
        return {k: getattr(self, k) for k in self.KNOBS}


@dataclass(frozen=True)
class Experiment:
    name: str = option(
        "search", "the study's name and its `runs/NAME/` folder: letters, digits, `.`, `_`, `-`", _RUN_NAME
    )
    backbone: Any = option(
        "all-MiniLM-L6-v2",
        "a local folder, a hub name, or `{tiny: {hidden_size: 32, ...}}` (a random model built from a config)",
        accepts="a folder, a hub name or a mapping",
        schema=_NAME_OR_MAPPING,
    )
    task: Any = option(
        "sst2",
        "a GLUE task, `xsum`, `wmt16_en_ro`, a demo (`demo_sentiment`, `demo_keyword`, "
        "`demo_copy`, `demo_reverse`), or your own files: `{train: f.csv, dev: g.csv, ...}`",
        accepts="a task name or a mapping of files",
        schema=_NAME_OR_MAPPING,
    )
    data_dir: str | None = option(
        None, "the folder of a built-in task's files (else the usual places are looked in)", optional(TEXT)
    )
    budget: str | int | None = option(
        "0.5%",
        "deployable parameters: a share of the backbone, or a count such as `120000`; at most the whole "
        "backbone (over 10% warns)",
        Rule(
            (lambda v: v is None or (isinstance(v, (str, int, float)) and not isinstance(v, bool))),
            "a count or a percentage such as 0.5%",
            {"anyOf": [*BUDGET_SCHEMA["anyOf"], {"type": "null"}]},
        ),
    )
    space: str = option("unified", "a space file, or a name from `search_space/`", TEXT)
    trials: int = option(
        24,
        "trained trials the study should hold, presets and warm starts among them",
        Rule(whole(0)[0], "a whole number >= 1", {"type": "integer", "minimum": 0}),
    )  # 0: oneshot
    sampler: str = option("tpe", "`tpe`, `nsga2`, `random`, `gp` or `presets` (the presets alone)", TEXT)
    startup_trials: int = option(10, "TPE's and GP's random proposals before their model takes over", whole(1))
    presets: Any = option(
        "auto",
        "`auto` (every preset that fits the budget), a list of names, or `none`",
        Rule(
            (lambda v: v in ("auto", "none") or (isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v))),
            "auto, none or a list of preset names",
            {"anyOf": [{"enum": ["auto", "none"]}, {"type": "array", "items": {"type": "string"}}]},
        ),
    )
    warm_start: str | None = option(
        None, "`URL[#STUDY]`: an earlier study's front as the first proposals", optional(TEXT)
    )
    objectives: tuple = option(
        ("score", "params"),
        "then any of `step_time`, `memory`, `latency`, minimised too",
        accepts="[score, params], then any of step_time, memory, latency",
        schema={
            "type": "array",
            "minItems": 2,
            "prefixItems": [{"const": "score"}, {"const": "params"}],
            "items": {"enum": ["step_time", "memory", "latency"]},
        },
    )
    strategy: str = option(
        "sampler", "`sampler`, `oneshot` (a supernet's proposals) or `both`", one_of("sampler", "oneshot", "both")
    )
    oneshot: OneShot = option(meaning="the supernet of `strategy: oneshot` or `both`", factory=OneShot)
    seed: int = option(0, "the sampler's and the trials' seed", whole(0))
    data_seed: int = option(111, "which K rows train, and which rows the search dev takes", whole(0))
    executor: str = option("ray", "`ray` (Ray Tune) or `local` (trials in this process)", TEXT)
    ray_address: str | None = option(None, "an existing Ray cluster to join (else a local one)", optional(TEXT))
    cpus_per_trial: float = option(1.0, "CPUs Ray gives each trial", number(0, True))
    gpus_per_trial: float | str = option(
        "auto",
        "`auto` (none without a GPU, else trials packed by their measured memory) or a share of one GPU",
        auto_or(_ONE_GPU_AT_MOST),
    )
    concurrent: int | None = option(
        None, "trials in flight at once (default: the slots the CPUs and GPUs give)", optional(whole(1))
    )
    scheduler: str = option(
        "fifo",
        "`fifo` (every trial trains to its end; with `score: last` it evaluates once) or `asha` (stops "
        "trials whose early scores are low, that is, those that learn slowly; reads every evaluation)",
        one_of("asha", "fifo"),
    )
    storage: str | None = option(
        None, "the study's SQLAlchemy URL (default: SQLite in `runs/NAME/study.db`)", optional(TEXT)
    )
    study: str | None = option(None, "the study's name in the storage (default: `name`)", optional(TEXT))
    fidelity: Fidelity = option(meaning="how each trial trains and is scored", factory=Fidelity)
    final: FinalEval = option(meaning="the re-evaluation on the test split", factory=FinalEval)
    rates: Rates = option(meaning="each family's learning rate", factory=Rates)
    heartbeat_interval: int = option(20, "seconds between a running trial's heartbeats", whole(1))
    grace_period: int = option(
        60, "a running trial silent this long lost its worker: failed, then trained again", whole(2)
    )
    stale_retries: int = option(1, "how many times a lost trial is trained again", whole(0))
    source: str = "<flags>"

    def __post_init__(self):
        where = "" if self.source == "<flags>" else f"{self.source}: "
        check_fields(self, where, field_rules(Experiment))
        if isinstance(self.presets, (list, tuple)):
            try:
                check_preset_names(self.presets)
            except ConfigError as e:
                raise ConfigError(f"{where}{e}") from None
        if self.trials == 0 and self.strategy != "oneshot":  # oneshot trains its proposals, not `trials`
            raise ConfigError(f"{where}trials: expected a whole number >= 1, got 0 (0 only with strategy: oneshot)")
        try:
            object.__setattr__(self, "objectives", check_objectives(self.objectives))
        except ConfigError as e:
            raise ConfigError(f"{where}{e}") from None
        if self.grace_period <= self.heartbeat_interval:
            raise ConfigError(
                f"{where}grace_period: must be longer than heartbeat_interval "
                f"({self.heartbeat_interval}s), got {self.grace_period}s"
            )

    @property
    def study_name(self) -> str:
        return self.study or self.name

    @property
    def storage_url(self) -> str:
        return as_url(self.storage) if self.storage else f"sqlite:///runs/{self.name}/{STUDY_FILE}"

    @property
    def run_dir(self) -> Path:
        return Path("runs") / self.name

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    @classmethod
    def from_dict(cls, data: dict, source: str = "<experiment>") -> Experiment:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: an experiment file is a mapping of fields")
        check_keys(source, data, [f.name for f in dataclasses.fields(cls) if f.name != "source"], sep=": ")
        kw = dict(data)
        if kw.get("fidelity") == "auto":
            kw["fidelity"] = {"epochs": "auto"}
        if kw.get("rates") in ("auto", "off", False):  # YAML 1.1 reads a bare off as false
            kw["rates"] = {"calibrate": kw["rates"] or "off"}
        for key, sub in (("fidelity", Fidelity), ("final", FinalEval), ("oneshot", OneShot), ("rates", Rates)):
            if key in kw:
                kw[key] = _sub(sub, kw[key], f"{source}: {key}")
        return cls(**kw, source=source)

    @classmethod
    def load(cls, path: str | Path) -> Experiment:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"experiment {str(path)!r}: no such file")
        data = read_yaml(read_text(path), path)
        if data is None:  # an empty file is a mistake, not "every default"
            raise ConfigError(f"{path}: the file is empty (an experiment names at least its task and backbone)")
        return cls.from_dict(data, str(path))

    def override(self, **kw) -> Experiment:
        """Flags win over the file; ``None`` means "not given"."""
        kw = {k: v for k, v in kw.items() if v is not None}
        fid = {k[len("fidelity_") :]: kw.pop(k) for k in list(kw) if k.startswith("fidelity_")}
        one = {k[len("oneshot_") :]: kw.pop(k) for k in list(kw) if k.startswith("oneshot_")}
        try:
            out = dataclasses.replace(self, **kw)
        except ConfigError as e:  # the file's values were checked when it loaded: a flag's is wrong
            raise ConfigError(str(e).removeprefix(f"{self.source}: ") + " (from the command line)") from None
        if fid:
            out = dataclasses.replace(out, fidelity=dataclasses.replace(out.fidelity, **fid))
        if one:
            try:
                out = dataclasses.replace(out, oneshot=dataclasses.replace(out.oneshot, **one))
            except ConfigError as e:
                raise ConfigError(f"--oneshot-{next(iter(one))}: {e}") from None
            if out.strategy == "sampler":  # it would be ignored: no supernet trains
                raise ConfigError(
                    f"--oneshot-{next(iter(one))}: applies to strategy oneshot or both, and this "
                    f"search's strategy is sampler (add --strategy both)"
                )
        return out


def _sub(cls, data, where):
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping")
    check_keys(where, data, [f.name for f in dataclasses.fields(cls)])
    try:
        return cls(**data)
    except ConfigError as e:
        raise ConfigError(f"{where.rsplit(': ', 1)[0]}: {e}") from None


__all__ = [
    "Experiment",
    "Fidelity",
    "FinalEval",
    "OneShot",
    "Rates",
    "BUDGET_SCHEMA",
    "parse_budget",
    "check_budget_text",
    "check_budget_list",
    "large_budget_warning",
]
