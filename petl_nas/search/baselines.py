"""The LoRA rank sweep: the baseline front a searched front must rise above.

The most common objection to a PEFT search is that its front is not above a plain LoRA rank sweep. With ``final:
{baselines: true}`` (the default; ``false`` leaves it out) a study also trains LoRA at r = 1, 2, 4, ... 32 on
q,v and on every linear layer (q, k, v, o and both FFN matrices), s = 2 as the LoRA preset, with the space's
head, at every rank whose deployable count fits the budget. Each sweep point is enqueued as a
point of the space with its learning rate left to the sampler, so it is chosen the same way as every
searched trial's, trained and scored the same way, and marked ``baseline: lora_<targets>_r<r>``.
Sweep trials come on top of ``trials``. `fronts.py` compares the fronts.

Below the smallest LoRA that covers every layer (r = 1 on q, v), no sweep point fits, and the
baselines a reviewer would ask for at that size are queued instead (`budget_baselines`): LoRA r=1
on q, v of the top layers that fit, prompt tuning of the longest length that fits (up to the
preset's 20 tokens), BitFit and the LayerNorms where they fit, and the head alone (a linear probe
on the frozen features). Each is a point of the space where the space holds it, else trained
given whole (its configuration stored on the trial), at the same rates as every baseline.

Today's small-budget methods ((IA)³, VeRA, FourierFT, LN-tuning, LoKr, DoRA: the presets marked
``budget_baseline: true``) are baselines at every budget (`family_baselines`): each preset as its
paper sets it where it fits, else its largest shape that fits (`petl_nas.core.budget.fitted`: the
most top layers, then the largest size), and none where no shape of it fits.

`best_2022_baseline` is the best baseline among the methods the space held before those (no form
of `petl_nas.core.eras.RECENT_FORMS`, no DoRA): what the pick is also compared with, so a suite shows
what today's methods changed.

`anchors` names the largest baseline of each kind that fits a budget: what a one-shot supernet
builds around (`petl_nas.search.oneshot.derive.anchored`), so that a proposal can be a baseline
plus what the supernet finds for the rest of the budget.
"""

from __future__ import annotations

import re

from optuna.trial import TrialState

from ..core.budget import count_parameters, fits, fitted
from ..core.config import ModuleSpec, PetlConfig
from ..core.eras import uses_recent_method
from ..errors import ConfigError
from ..study.records import LR_FROM_SAMPLER, StoredTrial

RANKS = (1, 2, 4, 8, 16, 32)
PROMPT_TOKENS = 20  # the prompt_tuning preset's length: the longest tried here


def _lora_qv(r: int, layers=None) -> PetlConfig:
    return PetlConfig(
        modules=(ModuleSpec(form="lora", targets=("q", "v"), size=r, composition="scaled", scale=2.0, layers=layers),)
    )


def budget_baselines(model_config, budget: int | None, n_layers: int) -> list[tuple[str, PetlConfig]]:
    """(name, configuration) of the small-budget baselines, smallest first; none when LoRA r=1 on q, v
    of every layer fits (the sweep's points are the baselines there). See the module docstring."""
    if budget is None or fits(model_config, _lora_qv(1), budget):
        return []
    found = [("head_only", PetlConfig())]
    top = [
        k
        for k in range(n_layers - 1, 0, -1)
        if fits(model_config, _lora_qv(1, tuple(range(n_layers - k, n_layers))), budget)
    ]
    if top:
        found.append((f"lora_qv_r1_top{top[0]}", _lora_qv(1, tuple(range(n_layers - top[0], n_layers)))))
    prompt = [n for n in range(PROMPT_TOKENS, 0, -1) if fits(model_config, PetlConfig(prompt_length=n), budget)]
    if prompt:
        found.append((f"prompt_l{prompt[0]}", PetlConfig(prompt_length=prompt[0])))
    for name, config in (("bitfit", PetlConfig(bitfit=True)), ("layernorms", PetlConfig(train_layernorms=True))):
        if fits(model_config, config, budget):
            found.append((name, config))
    return sorted(found, key=lambda p: count_parameters(model_config, p[1]).deployable)


def family_baselines(model_config, budget: int | None, n_layers: int, names=None) -> list[tuple[str, PetlConfig]]:
    """(name, configuration) of each budget-baseline preset (``names``; default: those marked
    ``budget_baseline``) in its largest shape within ``budget``, smallest first: the preset's own
    name where it fits as it is, else its sizes and top layers written in (``fourierft_n189``,
    ``vera_r1_top2``). A preset the backbone refuses, or of which no shape fits, is left out."""
    from ..core.forms import form_named
    from ..core.presets import budget_baseline_presets, preset

    found = []
    for name in budget_baseline_presets() if names is None else names:
        try:
            config = preset(name, model_config)
        except ConfigError:
            continue
        shaped = fitted(model_config, config, budget, n_layers)
        if shaped is None:
            continue
        label = name
        if shaped != config:
            sizes = (
                "_".join(
                    f"{form_named(m.form).size_letter}{m.size}" for m in shaped.modules if form_named(m.form).sized
                )
                or ""
            )
            layers = shaped.modules[0].layers
            top = f"top{len(layers)}" if layers is not None and layers != config.modules[0].layers else ""
            label = "_".join(p for p in (name, sizes, top) if p)
        found.append((count_parameters(model_config, shaped).deployable, label, shaped))
    return [(label, config) for _, label, config in sorted(found, key=lambda p: p[0])]


def lora_sweep(model_config, budget: int | None) -> list[tuple[str, PetlConfig]]:
    """(name, configuration) of every sweep point within ``budget``, smallest first."""
    points = []
    for r in RANKS:
        qv = PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=r, composition="scaled", scale=2.0),))
        every = PetlConfig(
            modules=(
                ModuleSpec(form="lora", targets=("q", "k", "v", "o"), size=r, composition="scaled", scale=2.0),
                ModuleSpec(form="lora", position="ffn", size=r, composition="scaled", scale=2.0),
            )
        )
        for name, config in ((f"lora_qv_r{r}", qv), (f"lora_all_r{r}", every)):
            n = count_parameters(model_config, config).deployable
            if budget is None or n <= budget:
                points.append((n, name, config))
    return [(name, config) for _, name, config in sorted(points, key=lambda p: p[0])]


def queued_baselines(model_config, budget: int | None, n_layers: int, families=None) -> list[tuple[str, PetlConfig]]:
    """(name, configuration) of every baseline a study queues at ``budget`` (`seed_sweep`): the LoRA
    rank sweep, the small-budget baselines and today's methods (``families``: as `family_baselines`)."""
    return (
        lora_sweep(model_config, budget)
        + budget_baselines(model_config, budget, n_layers)
        + family_baselines(model_config, budget, n_layers, families)
    )


def anchors(model_config, budget: int | None, n_layers: int) -> list[tuple[str, PetlConfig]]:
    """(name, configuration) of the largest baseline of each kind within ``budget`` (LoRA on q, v;
    on every linear layer; on q, v of the top layers; prompt tuning; BitFit; LayerNorms), smallest
    first; the head alone is no anchor (the supernet's own proposals build on it)."""
    largest: dict[str, tuple[str, PetlConfig]] = {}
    for name, config in lora_sweep(model_config, budget) + budget_baselines(model_config, budget, n_layers):
        if name != "head_only":
            largest[re.sub(r"\d+$", "", name)] = (name, config)  # both lists run smallest first
    return sorted(largest.values(), key=lambda p: count_parameters(model_config, p[1]).deployable)


def best_2022_baseline(study):
    """The best baseline (preset or sweep point) whose configuration uses no method added in 2023–24:
    among those that learned, the best confirmed mean where confirmation re-scored any of them, else
    the best search score; where none learned, the complete one with the best search score (as
    confirmation's best baseline falls back); None where the study has no such baseline."""
    from ..study.pick import confirmed_scores, is_baseline, mean_score

    done = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE and t.values is not None and is_baseline(t) and not _recent(t)
    ]
    learned = [t for t in done if not StoredTrial.of(t).did_not_learn]
    confirmed = set(confirmed_scores(study))
    if [t for t in learned if t.number in confirmed]:
        return max((t for t in learned if t.number in confirmed), key=lambda t: mean_score(study, t))
    return max(learned or done, key=lambda t: t.values[0], default=None)


def _recent(trial) -> bool:
    stored = StoredTrial.of(trial)
    return stored.petl_config is not None and uses_recent_method(stored.config(resolved=False))


def sweep_trials(study) -> set[str]:
    """Names of the sweep points already in the study (whatever their state)."""
    return {s.sweep for s in map(StoredTrial.of, study.get_trials(deepcopy=False)) if s.sweep}


def seed_sweep(
    study, space, model_config, budget: int | None, n_layers: int, calibrated: bool = False, presets=(), families=None
) -> tuple[int, list[str]]:
    """Enqueue the sweep points the study lacks; returns (sweep trials in the study, lines to print).

    A point the space cannot hold (a rank past its range, targets it lacks) is skipped and named.
    In a study whose families train at measured rates (``calibrated``), every point trains at
    LoRA's measured rate (``lr_scale`` 1), as the LoRA preset does; a point that is then the same
    point of the space as one of ``presets`` (the study's preset names: LoRA r=8 on q, v is the
    LoRA preset) is not queued, since the preset's trial is that run. ``families``: the presets
    `family_baselines` builds at the budget (None: those marked ``budget_baseline``).
    """
    from .study import presets_within

    have = sweep_trials(study)
    queued, skipped, same = [], [], []
    fitting = presets_within(presets, space, model_config, budget)[0] if presets else []
    twins = {}
    if calibrated:
        for name, config in fitting:
            near = space.nearest_point(config, 1.0, n_layers)
            if near is not None and not near[1]:  # the preset as it is, no sizes clamped
                twins[repr(sorted(near[0].items()))] = name
    preset_configs = {repr(config): name for name, config in fitting}
    small = []
    for name, config in budget_baselines(model_config, budget, n_layers) + family_baselines(
        model_config, budget, n_layers, families
    ):
        twin = preset_configs.get(repr(space.with_head(config)))
        if twin is None:
            small.append((name, config))
        elif name not in have:  # prompt tuning of 20 tokens, BitFit:
            same.append(f"{name} (the {twin} preset)")  # the preset's trial is that run
    for name, config in lora_sweep(model_config, budget) + small:
        if name in have:
            continue
        config = space.with_head(config)
        lr = 1.0 if calibrated else space.globals["lr"].low
        params = space.params_for(config, lr, n_layers) if "lr" in space.globals else None
        if params is None and small and name in dict(small):
            attrs = {
                "baseline": name,
                "petl_config": config.to_dict(),  # given whole, as off-space presets
                **({"recipe": {"lr_scale": 1.0}} if calibrated else {LR_FROM_SAMPLER: True}),
            }
            study.enqueue_trial({}, user_attrs=attrs, skip_if_exists=False)
            queued.append(name)
            continue
        if params is None:
            skipped.append(name)
            continue
        twin = twins.get(repr(sorted(params.items())))
        if twin is not None:
            same.append(f"{name} (the {twin} preset)")
            continue
        if not calibrated:
            params.pop("lr", None)  # the sampler chooses it, as for every searched trial
        study.enqueue_trial(params, user_attrs={"baseline": name}, skip_if_exists=False)
        queued.append(name)
    sweep = {name for name, _ in lora_sweep(model_config, budget)}
    lines = []
    for kind, names, rates in (
        ("LoRA rank sweep", [n for n in queued if n in sweep], "at LoRA's measured rate"),
        ("baselines for this budget", [n for n in queued if n not in sweep], "at their families' measured rates"),
    ):
        if names:
            rates = rates if calibrated else "learning rates from the sampler"
            lines.append(f"{kind} queued (on top of the trials; {rates}): {', '.join(names)}")
    if skipped:
        lines.append(f"LoRA rank sweep: not points of space {space.name!r}, skipped: {', '.join(skipped)}")
    for kind, names in (
        ("baselines for this budget: the same configuration", [s for s in same if s.split()[0] not in sweep]),
        ("LoRA rank sweep: the same configuration and rate", [s for s in same if s.split()[0] in sweep]),
    ):
        if names and queued:
            lines.append(f"{kind} as a preset, its trial stands for it: {', '.join(names)}")
    return len(have) + len(queued), lines


__all__ = [
    "best_2022_baseline",
    "lora_sweep",
    "budget_baselines",
    "family_baselines",
    "queued_baselines",
    "seed_sweep",
    "sweep_trials",
    "RANKS",
    "PROMPT_TOKENS",
]
