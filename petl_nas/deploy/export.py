"""Choose a configuration from a study's Pareto front and write it as a self-contained record.

A record (YAML) holds everything `petl-nas train` needs and where it came from: the PetlConfig,
backbone, task and data, the training recipe and seeds, the counts, and provenance (storage,
study, trial, metric ± std, petl-nas version, space hash).

Choice rules (`choose`; the candidates and the default pick are `petl_nas.study.exportable`'s, which the
report names too): candidates are the front's members at or under the budget, and the trials
`final.confirm` re-scored over extra seeds (on the front or not, as the search's own pick), ranked
by their search score (measured on the search-dev split carved from the training data; the mean
over seeds where confirmed). The held-out
test split never decides: its scores (the final re-evaluation) are reported beside the choice, so
the number `petl-nas train` reports on that split is not inflated by having picked on it.
``best`` takes the highest search score, ties to fewer parameters; with ``final.confirm``, the
search's own pick where the budget admits it (`study.pick.verdict`): the best searched configuration
that beats the best baseline beyond noise over paired seeds, or else that baseline, so the
default never trails it. ``best-mean`` (``final.confirm`` only) takes the best confirmed mean, a
baseline or not; ``smallest-within-noise`` (``final.confirm`` only) the confirmed trial with the
fewest deployable parameters within noise of the best confirmed mean over paired seeds;
``smallest-within=X`` takes the fewest parameters among those within X points (×100 of a 0-1 metric; ROUGE and
BLEU are already in points) of the best (the best confirmed mean under ``final.confirm``); ``fastest-within=X``
the lowest inference latency of the deployed form (measured by every trial, `costs.py`; or, as `petl-nas export`
does, timed again side by side here, `petl_nas.deploy.retime`) among them, where latencies within `LATENCY_TIE`
(10%) of the lowest count as equal: of those, the highest search score. With ``objectives: [score, params,
latency]`` the front holds the fast configurations too; with two objectives, the fastest of the (score,
parameters) front.

The record itself, its reading and writing, is `petl_nas.deploy.record`; its recipe's defaults are
`training.recipe.Recipe`'s and the experiment's (`study.experiment`), never typed here again.

Example:
    >>> trial = choose(study, budget=120_000, pick="smallest-within=0.5")   # doctest: +SKIP
    >>> write_record(record(study, trial), "best.yaml")                     # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import __version__
from ..errors import ConfigError
from ..study.experiment import FinalEval
from ..study.exportable import best_of, candidates
from ..study.fronts import group_of, source_of
from ..study.header import StudyHeader
from ..study.pick import confirmed_now, confirmed_text, verdict
from ..study.records import StoredTrial, stored_trial, stored_trials
from ..study.storage import redact
from ..tasks.metrics import points_per_unit
from ..tasks.significance import mean_std
from .record import RECORD_KEYS, ExportRecord, make_parent, read_record, write_record

_WITHIN = re.compile(r"^(smallest|fastest)-within=(\d+(?:\.\d+)?)$")
PICKS = (
    "'best', 'best-mean', 'smallest-within-noise', 'smallest-within=X' or 'fastest-within=X' (X in points, e.g. 0.5)"
)
WITHIN_NOISE = "smallest-within-noise"
BEST_MEAN = "best-mean"
LATENCY_TIE = 0.10
"""Latencies within this share of the fastest count as equal for ``fastest-within``: timed quietly
on 2 CPU cores, configurations doing the backbone's work (merged LoRA) and little more spread 14%
(`experiments/sst2_latency/README.md`)."""


def _named_by_verdict(study: optuna.Study, pool: list[tuple[FrozenTrial, float]], pick: str) -> FrozenTrial:
    """``--pick smallest-within-noise`` (the verdict's smallest confirmed trial within noise of the
    best confirmed mean) or ``--pick best-mean`` (the best confirmed mean itself); it must be within
    the budget."""
    said = verdict(study)
    if said is None:
        raise ConfigError(
            f"--pick {pick}: study {study.study_name!r} confirmed no trial over extra seeds "
            f"(final.confirm); use best or smallest-within=X"
        )
    number, what = (
        (said.smallest, "the smallest within noise") if pick == WITHIN_NOISE else (said.best, "the best confirmed mean")
    )
    chosen = [c[0] for c in pool if c[0].number == number]
    if not chosen:
        raise ConfigError(f"--pick {pick}: trial {number}, {what}, is over --budget")
    return chosen[0]


def choose(
    study: optuna.Study,
    budget: int | None = None,
    pick: str = "best",
    retime: Callable[[list[FrozenTrial]], dict[int, float]] | None = None,
) -> FrozenTrial:
    """The trial to export (see the module docstring for the rules). With ``retime``,
    ``fastest-within`` ranks the candidates within the margin by ``retime(candidates)``, ``{trial
    number: ms}`` (`petl_nas.deploy.retime`), instead of the latencies the trials measured; a candidate it
    leaves out is not chosen."""
    m = _WITHIN.match(pick)
    if pick not in ("best", WITHIN_NOISE, BEST_MEAN) and not m:  # the flag first: before the study is read
        raise ConfigError(f"--pick: expected {PICKS}, got {pick!r}")
    pool = candidates(study, budget)
    if pick in (WITHIN_NOISE, BEST_MEAN):
        return _named_by_verdict(study, pool, pick)
    if pick == "best":  # the search's own pick where the budget admits it
        return best_of(study, pool)
    top = max(pool, key=lambda c: (c[1], -c[0].values[1]))
    said = verdict(study)
    by_number = {c[0].number: c for c in pool}
    if said is not None and said.best in by_number:  # "within X of the best": its confirmed mean
        top = by_number[said.best]
    floor = top[1] - float(m.group(2)) / points_per_unit(StudyHeader.of(study).metric or "accuracy")
    within = [c for c in pool if c[1] >= floor]
    if m.group(1) == "smallest":
        return min(within, key=lambda c: (c[0].values[1], -c[1]))[0]
    if retime is not None:
        latency = retime([c[0] for c in within])
        within = [c for c in within if c[0].number in latency]
    else:
        latency = {c[0].number: StoredTrial.of(c[0]).latency_ms for c in within}
        unmeasured = [n for n, ms in latency.items() if ms is None]
        if unmeasured:
            raise ConfigError(
                f"--pick {pick}: trial {unmeasured[0]} of study {study.study_name!r} has no latency "
                f"measured (a study from before petl-nas measured it); use best or smallest-within"
            )
    fastest = min(latency[c[0].number] for c in within)
    tied = [c for c in within if latency[c[0].number] <= fastest * (1 + LATENCY_TIE)]
    return max(tied, key=lambda c: (c[1], -c[0].values[1]))[0]


def nearest_that_exports(study: optuna.Study, params: float, exports: Callable[[dict], bool]) -> str | None:
    """The front member nearest in deployable parameters to ``params`` whose configuration
    ``exports(config dict)`` accepts, as a phrase naming it; None when none does."""
    fits = [t for t in study.best_trials if exports(StoredTrial.of(t).config_dict())]
    if not fits:
        return None
    t = min(fits, key=lambda t: (abs(t.values[1] - params), t.number))
    return f"trial {t.number} ({int(t.values[1]):,} deployable parameters, search score {t.values[0]:.4f})"


RECIPES = ("final", "search")


def record(
    study: optuna.Study, trial: FrozenTrial, storage_url: str | None = None, recipe: str = "final"
) -> ExportRecord:
    """The self-contained export record of ``trial``: trained with the study's final recipe, or with
    ``recipe="search"`` the length and data its search score was measured at."""
    t = stored_trial(study, trial)
    final = t.final or {}
    counts = {"deployable": t.deployable, "trainable": t.trainable, "pct_of_backbone": t.pct_of_backbone}
    origin = {"source": group_of(t)}  # preset, sweep, oneshot or searched
    if t.oneshot:  # which supernet run proposed it, at which budget
        origin.update(
            oneshot=t.oneshot,
            oneshot_budget=t.oneshot_budget,
            **({"oneshot_anchor": t.oneshot_anchor} if t.oneshot_anchor else {}),
        )
    if t.number in confirmed_now(study):  # its search score, then one per extra seed
        origin.update(confirmed_scores=t.confirmed)
    costs = t.measured_costs()  # what it measured (`costs.py`), if anything
    return _record(
        study,
        t.config_dict(),
        t.lr,
        counts,
        storage_url,
        recipe,
        trial=t.number,
        preset=t.preset,
        search_score=t.values[0],
        test_mean=final.get("mean"),
        test_std=final.get("std"),
        test_n=len(final.get("scores", [])) or None,
        **origin,
        **({"costs": costs} if costs else {}),
    )


def _study_space(study: optuna.Study):
    """The study's search space: its file if it is still there, else the shipped space of that name."""
    from ..study.space import SearchSpace

    header = StudyHeader.of(study)
    source, name = header.space, header.space_name
    return SearchSpace.load(source if source and Path(source).exists() else name)


def preset_record(
    study: optuna.Study, name: str, storage_url: str | None = None, recipe: str = "final"
) -> ExportRecord:
    """A record of preset ``name`` on the study's backbone, task and final recipe: the fair
    hand-designed baseline to train beside an exported trial. A preset the study trained is that
    trial (its configuration and learning rate, at the space's nearest point where it was mapped:
    what the study measured and compared); one it did not train is the preset at the rates the
    study measured for its families (``rates: auto``), as the study trains its baselines, else at
    its paper rate (``provenance.rates``: ``measured`` or ``paper``)."""
    trained = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if StoredTrial.of(t).preset == name
    ]
    if trained:
        return record(study, trained[0], storage_url, recipe)
    from ..core.budget import count_parameters  # torch: a preset the study did not train is counted
    from ..core.family_rates import at_rates
    from ..core.presets import preset, preset_lr
    from ..tasks import resolve_task
    from ..training.loading import model_config_for

    header = StudyHeader.of(study)
    task = resolve_task(header.task_ref)
    model_config = model_config_for(header.backbone_spec, task)
    config = _study_space(study).with_head(preset(name, model_config))  # the head the trials had
    n = count_parameters(model_config, config, num_labels=task.num_labels)
    counts = {
        "deployable": n.deployable,
        "trainable": n.trainable,
        "pct_of_backbone": round(100 * n.deployable / n.backbone, 4),
    }
    rates = header.rate_calibration or {}
    measured = rates.get("rates")
    config, lr = at_rates(measured, config, 1.0, rates.get("scales")) if measured else (config, preset_lr(name))
    return _record(
        study,
        config.to_dict(),
        lr,
        counts,
        storage_url,
        recipe,
        trial=None,
        preset=name,
        search_score=None,
        test_mean=None,
        test_std=None,
        test_n=None,
        rates="measured" if measured else "paper",
    )


def _record(
    study, petl_config: dict, lr: float, counts: dict, storage_url, recipe_source: str, **provenance
) -> ExportRecord:
    if recipe_source not in RECIPES:
        raise ConfigError(f"--recipe: expected one of {', '.join(RECIPES)}, got {recipe_source!r}")
    header = StudyHeader.of(study)
    fidelity, final_cfg = header.fidelity, header.final
    # "search": the trial's own length and data, where its score says it is good; "final": the study's
    # final recipe, where the search's ranking may not hold (a longer run can overfit a high rate)
    length = fidelity if recipe_source == "search" else final_cfg
    k = fidelity.get("k") if recipe_source == "search" or final_cfg.get("k", FinalEval.k) == -1 else final_cfg.get("k")
    return ExportRecord(
        petl_nas_version=__version__,
        backbone=header.backbone_spec,
        task=header.task_spec if header.task_spec is not None else header.task,
        data_dir=header.data_dir,
        data_seed=header.data_seed,
        k=k,
        search_dev=fidelity.get("search_dev"),  # with K, the rows carved beside (or out of) it
        petl_config=petl_config,
        recipe=record_recipe(lr, fidelity, length),
        seeds=final_cfg.get("seeds", FinalEval.seeds),
        counts={**counts, "backbone": header.backbone_params},
        provenance={
            "storage": redact(storage_url),
            "study": study.study_name,
            "recipe": recipe_source,
            **provenance,
            "metric": header.metric,
            "space": header.space_name,
            "space_hash": header.space_hash,
            "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )


# Written only where the study set them to something other than `Recipe`'s default: a record reads as
# short as the experiment file that made it, and as records written before these settings existed.
_LENGTH_CAPS = ("max_steps", "eval_rows")  # of the length trained: final or search
_HOW_IT_RUNS = ("length_buckets", "frozen_cache_mb", "precision", "compile", "cuda_graphs")  # the trials'


def record_recipe(lr: float, fidelity: dict, length: dict) -> dict:
    """A record's recipe: ``lr``; the epochs and caps of ``length`` (the study's stored ``final``, or
    its ``fidelity`` for ``--recipe search``); the trials' batch size and token length; AdamW's and
    the schedule's settings and one evaluation per epoch as `Recipe` has them; and how the trials ran
    where that is not `Recipe`'s default. What a study did not store takes `Recipe`'s default
    (`FinalEval`'s for the epochs)."""
    from ..training.recipe import Recipe

    default = Recipe()
    recipe = {
        "lr": lr,
        "epochs": length.get("epochs", FinalEval.epochs),
        "batch_size": fidelity.get("batch_size", default.batch_size),
        "max_length": fidelity.get("max_length", default.max_length),
        **{key: getattr(default, key) for key in ("warmup_ratio", "weight_decay", "max_grad_norm", "evals_per_epoch")},
    }
    chosen = {**{key: length.get(key) for key in _LENGTH_CAPS}, **{key: fidelity.get(key) for key in _HOW_IT_RUNS}}
    return {**recipe, **{k: v for k, v in chosen.items() if v is not None and v != getattr(default, k)}}


def front_table(study: optuna.Study) -> str:
    """The front as text: trial, source, scores, counts and the study's cost objectives (what
    ``export --list`` prints), and the trials ``final.confirm`` re-scored with their means (export
    candidates even off the front)."""
    from ..training.costs import COSTS, UNITS

    header = StudyHeader.of(study)
    backbone = header.backbone_params or 1
    costs = [o for o in header.cost_objectives if o in COSTS]
    lines = [
        f"{'trial':>5}  {'source':<14}{'search':>9}{'test (±std)':>20}{'deployable':>12}{'%':>8}"
        + "".join(f"{f'{o} {UNITS[o]}':>16}" for o in costs)
    ]
    now, stored = confirmed_now(study), {t.number: t for t in stored_trials(study)}
    on_front = {t.number for t in study.best_trials}
    off = [t for t in study.get_trials(deepcopy=False) if t.number in now and t.number not in on_front]
    for t in sorted((stored[t.number] for t in study.best_trials + off), key=lambda t: t.values[1]):
        f = t.final or {}
        test = mean_std(f["mean"], f["std"], len(f.get("scores", []))) if f else "-"
        values = [t.cost(o) for o in costs]
        confirmed = f"  {confirmed_text(t.confirmed, t.number in on_front)}" if t.number in now else ""
        lines.append(
            f"{t.number:>5}  {source_of(t):<14}{t.values[0]:>9.4f}{test:>20}"
            f"{int(t.values[1]):>12,}{100 * t.values[1] / backbone:>8.3f}"
            + "".join(f"{f'{v:.1f}' if v is not None else '-':>16}" for v in values)
            + confirmed
        )
    if len(lines) == 1:  # the header alone would read as a silent success
        complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
        lines.append(
            "(no trial on the front: "
            + (
                "no trial has completed yet)"
                if not complete
                else f"none of the {complete} complete trials learned: each scored within noise of the "
                f"trivial baseline)"
            )
        )
    return "\n".join(lines)


__all__ = [
    "candidates",
    "choose",
    "nearest_that_exports",
    "record",
    "record_recipe",
    "preset_record",
    "write_record",
    "make_parent",
    "read_record",
    "front_table",
    "ExportRecord",
    "RECORD_KEYS",
    "LATENCY_TIE",
]
