"""What the report shows, as plain values computed from a study (no plotting here).

`StudyView` holds the complete trials as `Point`s (search score, counts, preset, configuration,
the held-out re-evaluation stored as study attribute ``final:<trial number>``) and the study's
facts. `hypervolume_history`, `importances` and `modules_by_position` derive the report's other
views from it.

Hypervolume is measured in the Pareto plot's own coordinates: metric (up) against log10 deployable
parameters (left), from the reference point (the trivial baseline's score, else the worst
complete score; the budget, or the largest complete trial when the study has no budget). Its
unit is "metric × decades of parameters".
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from ..errors import ConfigError
from ..search.confirm import confirmed_scores
from ..training.costs import COSTS
from ..search.fronts import group_of, hypervolume, reference_from, source_of, sweep_line
from ..search.records import StoredTrial
from ..search.study import state_counts
from ..core.describe import describe_config

MIN_TRIALS_FOR_IMPORTANCE = 5


@dataclass(frozen=True)
class Point:
    """One complete trial as the report sees it."""

    number: int
    score: float                      # search score (the study's first objective)
    deployable: int
    trainable: int | None
    preset: str | None
    config: dict | None
    config_text: str
    lr: float | None
    final: dict | None                # held-out re-evaluation: mean, std, scores, seeds, ...
    on_front: bool
    finished_s: float                 # seconds from the study's first trial start to completion
    train_s: float | None
    se: float | None = None           # the search score's standard error
    did_not_learn: bool = False       # within noise of the trivial baseline
    group: str = "searched"           # searched, oneshot, preset or sweep (fronts.py)
    baseline: str | None = None       # the sweep point's name (lora_qv_r8, ...)
    costs: dict = field(default_factory=dict)   # measured costs by objective name (costs.py): latency, ...
    source: str = "-"                 # what proposed it, as the summary names it (fronts.source_of)
    confirmed: list | None = None     # final.confirm's scores: the search score, then one per extra seed
    trial: StoredTrial | None = field(default=None, compare=False, repr=False)   # all the study holds of it


@dataclass
class StudyView:
    name: str
    storage: str
    metric: str
    budget: int | None
    backbone_params: int | None
    attrs: dict
    counts: dict
    points: list[Point] = field(default_factory=list)
    sweep_line: str | None = None     # the searched front against the LoRA rank sweep (fronts.py)

    @property
    def cost_objectives(self) -> list[str]:
        """The measured costs the study minimises besides parameters (``objectives`` after the first two)."""
        return list(self.attrs.get("objectives", ["score", "params"]))[2:]

    @property
    def baseline(self) -> dict | None:
        """The task's trivial baseline on search-dev (score, what), when the study recorded one."""
        return self.attrs.get("baseline")

    @property
    def front(self) -> list[Point]:
        return sorted((p for p in self.points if p.on_front), key=lambda p: p.deployable)

    @property
    def sweep(self) -> list[Point]:
        """The LoRA rank sweep's points, by size."""
        return sorted((p for p in self.points if p.group == "sweep"), key=lambda p: p.deployable)

    @property
    def presets(self) -> list[Point]:
        return sorted((p for p in self.points if p.preset), key=lambda p: p.deployable)

    @property
    def confirmed_off_front(self) -> list[Point]:
        """The trials ``final.confirm`` re-scored that are not on the front (presets have their own table)."""
        return sorted((p for p in self.points if p.confirmed and not p.on_front and not p.preset),
                      key=lambda p: p.deployable)

    @property
    def reevaluated(self) -> list[Point]:
        return [p for p in self.points if p.final]

    def pct(self, n: float) -> float | None:
        return 100 * n / self.backbone_params if self.backbone_params else None


def study_view(study: optuna.Study, storage_url: str) -> StudyView:
    """The report's view of ``study``; a study without a complete trial is refused."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    if not complete:
        raise ConfigError(f"study {study.study_name!r} has no complete trial yet: nothing to report "
                          f"({', '.join(f'{v} {k}' for k, v in state_counts(study).items() if v) or 'no trials'})")
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    t0 = min(starts)
    front = {t.number for t in study.best_trials}
    a = study.user_attrs
    names = study.metric_names or ["score", "deployable_params"]
    confirmed = confirmed_scores(study)
    return StudyView(
        name=study.study_name, storage=storage_url, metric=a.get("metric") or names[0],
        budget=a.get("budget"), backbone_params=a.get("backbone_params"), attrs=a,
        counts=state_counts(study),
        points=[_point(StoredTrial.of(t, a), t.datetime_complete, t0, t.number in front, confirmed.get(t.number))
                for t in complete],
        sweep_line=sweep_line(study))


def _point(t: StoredTrial, completed, t0, on_front: bool, confirmed: list | None) -> Point:
    config = t.petl_config
    text = t.config_text or (describe_config(config) if config is not None else "?")
    finished = (completed - t0).total_seconds() if completed else math.nan
    return Point(number=t.number, score=float(t.values[0]), deployable=int(t.values[1]),
                 trainable=t.trainable, preset=t.preset, config=config, config_text=text,
                 lr=t.lr, final=t.final, on_front=on_front, finished_s=finished, train_s=t.train_s, se=t.score_se,
                 did_not_learn=t.did_not_learn, group=group_of(t), baseline=t.sweep,
                 costs={name: t.cost(name) for name in COSTS if t.cost(name) is not None},
                 source=source_of(t), confirmed=confirmed, trial=t)


# ---- hypervolume ----------------------------------------------------------------------------
def reference_point(view: StudyView) -> tuple[float, float]:
    """(score, deployable parameters) the hypervolume is measured from: the trivial baseline's score
    when the study has one (a trial no better than it adds nothing), else the worst complete score."""
    return reference_from([(p.score, p.deployable) for p in view.points], view.baseline, view.budget)


def hypervolume_history(view: StudyView) -> dict:
    """Hypervolume after each complete trial, by trial number and by wall time since the start; a
    trial that did not learn (within noise of the trivial baseline) adds nothing to it."""
    ref = reference_point(view)
    by_number, by_time = [], []
    seen: list[tuple[float, float]] = []
    for p in sorted(view.points, key=lambda p: p.number):
        seen += [] if p.did_not_learn else [(p.score, p.deployable)]
        by_number.append((p.number, hypervolume(seen, ref)))
    seen = []
    for p in sorted(view.points, key=lambda p: p.finished_s):
        seen += [] if p.did_not_learn else [(p.score, p.deployable)]
        by_time.append((p.finished_s, hypervolume(seen, ref)))
    return {"reference": ref, "by_number": by_number, "by_time": by_time}


# ---- parameter importances --------------------------------------------------------------------
def importances(study: optuna.Study) -> tuple[list[tuple[str, float]], str]:
    """(parameter, importance) for reaching a high search score, largest first, and a note.

    Uses Optuna's default evaluator (PED-ANOVA), which handles conditional (define-by-run)
    parameters. Presets outside the space carry no parameters and are left out. With too few
    trials, or no spread in the scores, the list is empty and the note says why.
    """
    trials = [t for t in study.get_trials(deepcopy=False)
              if t.state == TrialState.COMPLETE and t.values is not None and t.params]
    if len(trials) < MIN_TRIALS_FOR_IMPORTANCE:
        return [], (f"not computed: {len(trials)} complete trials with sampled parameters "
                    f"(at least {MIN_TRIALS_FOR_IMPORTANCE} are needed)")
    if len({t.values[0] for t in trials}) < 2:
        return [], f"not computed: all {len(trials)} complete trials have the same score"
    sub = optuna.create_study(directions=study.directions)
    sub.add_trials(trials)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # PED-ANOVA ranks parameters by how they set apart *low* targets: negate the score.
            found = optuna.importance.get_param_importances(sub, target=lambda t: -t.values[0])
    except (ValueError, RuntimeError) as e:
        return [], f"not computed: {str(e).splitlines()[0]}"
    ranked = [(k, float(v)) for k, v in found.items() if v == v]
    return ranked, (f"PED-ANOVA (Optuna's default evaluator; conditional parameters included) over "
                    f"{len(trials)} complete trials: how much each parameter sets apart the top 10% "
                    f"by search score")


# ---- forms per position ---------------------------------------------------------------------
def modules_by_position(view: StudyView) -> dict[str, list[dict]]:
    """For ``attn`` and ``ffn``: one row per module of each complete trial (form, size, layers
    used, the trial's score and front membership); a trial with no module at a position adds a
    row of form ``none``."""
    out: dict[str, list[dict]] = {"attn": [], "ffn": []}
    for p in view.points:
        if p.config is None:
            continue
        config = p.trial.config(resolved=False)
        for pos, rows in out.items():
            mods = [m for m in config.modules if m.position == pos]
            for m in mods or [None]:
                rows.append({"form": m.form if m else "none", "size": m.size if m else None,
                             "layers": len(m.layers) if m and m.layers else None,
                             "score": p.score, "number": p.number, "on_front": p.on_front,
                             "preset": p.preset})
    return out


__all__ = ["Point", "StudyView", "study_view", "reference_point", "hypervolume", "hypervolume_history",
           "importances", "modules_by_position"]
