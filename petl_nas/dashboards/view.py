"""What the report shows, as plain values computed from a study (no plotting here).

`StudyView` holds the complete trials as `Point`s (search score, counts, preset, configuration,
the held-out re-evaluation stored as study attribute ``final:<trial number>``) and the study's
facts. `hypervolume_history`, `importances` and `modules_by_position` derive the report's other
views from it; `importances` ranks parameters only where the trials can support a ranking (enough
of them, scores spread beyond their noise: `importance_refusal`), and otherwise says why not.

Hypervolume is measured in the Pareto plot's own coordinates: metric (up) against log10 deployable
parameters (left), from the reference point (the trivial baseline's score, else the worst
complete score; the budget, or the largest complete trial when the study has no budget). Its
unit is "metric × decades of parameters".
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from ..core.describe import describe_config
from ..errors import ConfigError
from ..study.fronts import group_of, hypervolume, reference_from, source_of, sweep_line
from ..study.header import StudyHeader
from ..study.pick import confirmed_scores, verdict
from ..study.records import StoredTrial, state_counts, stored_trials
from ..training.costs import COSTS

MIN_TRIALS_FOR_IMPORTANCE = 20  # complete sampled trials before importances are shown (`importance_refusal`)
NOISE_MULTIPLE = 2.0  # the scores' sd must exceed this many median standard errors


@dataclass(frozen=True)
class Point:
    """One complete trial as the report sees it."""

    number: int
    score: float  # search score (the study's first objective)
    deployable: int
    trainable: int | None
    preset: str | None
    config: dict | None
    config_text: str
    lr: float | None
    final: dict | None  # held-out re-evaluation: mean, std, scores, seeds, ...
    on_front: bool
    finished_s: float  # seconds from the study's first trial start to completion
    train_s: float | None
    se: float | None = None  # the search score's standard error
    did_not_learn: bool = False  # within noise of the trivial baseline
    group: str = "searched"  # searched, oneshot, preset or sweep (fronts.py)
    baseline: str | None = None  # the sweep point's name (lora_qv_r8, ...)
    costs: dict = field(default_factory=dict)  # measured costs by objective name (costs.py): latency, ...
    source: str = "-"  # what proposed it, as the summary names it (fronts.source_of)
    confirmed: list | None = None  # final.confirm's scores: the search score, then one per extra seed
    trial: StoredTrial | None = field(default=None, compare=False, repr=False)  # all the study holds of it


@dataclass
class StudyView:
    name: str
    storage: str
    metric: str
    budget: int | None
    backbone_params: int | None
    header: StudyHeader
    counts: dict
    points: list[Point] = field(default_factory=list)
    sweep_line: str | None = None  # the searched front against the LoRA rank sweep (fronts.py)
    verdict_line: str | None = None  # what confirmation concluded against the best baseline (confirm.py)

    @property
    def cost_objectives(self) -> list[str]:
        """The measured costs the study minimises besides parameters (``objectives`` after the first two)."""
        return list(self.header.cost_objectives)

    @property
    def baseline(self) -> dict | None:
        """The task's trivial baseline on search-dev (score, what), when the study recorded one."""
        return self.header.baseline

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
        return sorted(
            (p for p in self.points if p.confirmed and not p.on_front and not p.preset), key=lambda p: p.deployable
        )

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
        raise ConfigError(
            f"study {study.study_name!r} has no complete trial yet: nothing to report "
            f"({', '.join(f'{v} {k}' for k, v in state_counts(study).items() if v) or 'no trials'})"
        )
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    t0 = min(starts)
    front = {t.number for t in study.best_trials}
    header = StudyHeader.of(study)
    names = study.metric_names or ["score", "deployable_params"]
    confirmed, stored = confirmed_scores(study), {t.number: t for t in stored_trials(study)}
    return StudyView(
        name=study.study_name,
        storage=storage_url,
        metric=header.metric or names[0],
        budget=header.budget,
        backbone_params=header.backbone_params,
        header=header,
        counts=state_counts(study),
        points=[
            _point(stored[t.number], t.datetime_complete, t0, t.number in front, confirmed.get(t.number))
            for t in complete
        ],
        sweep_line=sweep_line(study),
        verdict_line=said.line if (said := verdict(study)) is not None else None,
    )


def _point(t: StoredTrial, completed, t0, on_front: bool, confirmed: list | None) -> Point:
    config = t.petl_config
    text = t.config_text or (describe_config(config) if config is not None else "?")
    finished = (completed - t0).total_seconds() if completed else math.nan
    return Point(
        number=t.number,
        score=float(t.values[0]),
        deployable=int(t.values[1]),
        trainable=t.trainable,
        preset=t.preset,
        config=config,
        config_text=text,
        lr=t.lr,
        final=t.final,
        on_front=on_front,
        finished_s=finished,
        train_s=t.train_s,
        se=t.score_se,
        did_not_learn=t.did_not_learn,
        group=group_of(t),
        baseline=t.sweep,
        costs={name: t.cost(name) for name in COSTS if t.cost(name) is not None},
        source=source_of(t),
        confirmed=confirmed,
        trial=t,
    )


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
    parameters. Presets outside the space carry no parameters and are left out. The list is empty,
    and the note says why, unless the trials can support a ranking (`importance_refusal`).
    """
    trials = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE and t.values is not None and t.params
    ]
    refusal = importance_refusal(trials)
    if refusal:
        return [], f"not shown: {refusal}"
    sub = optuna.create_study(directions=study.directions)
    sub.add_trials(trials)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # PED-ANOVA ranks parameters by how they set apart *low* targets: negate the score.
            found = optuna.importance.get_param_importances(sub, target=lambda t: -t.values[0])
    except (ValueError, RuntimeError) as e:
        return [], f"not shown: {str(e).splitlines()[0]}"
    ranked = [(k, float(v)) for k, v in found.items() if v == v]
    unchecked = "" if _median_se(trials) is not None else "; no standard errors stored: noise not ruled out"
    return ranked, (
        f"PED-ANOVA (Optuna's default evaluator; conditional parameters included) over "
        f"{len(trials)} complete trials: how much each parameter sets apart the top 10% "
        f"by search score{unchecked}"
    )


def importance_refusal(trials: list) -> str | None:
    """Why these complete trials (with sampled parameters) cannot support an importance ranking, or None.

    Two conditions, each against a way a ranking would report chance:
    - at least `MIN_TRIALS_FOR_IMPORTANCE` (20) trials. PED-ANOVA contrasts the top 10% of the
      trials (rounded up) with all of them: with 10 or fewer that top set is one trial, whose
      parameter values would be ranked as importance. Optuna advises five in the top set (50
      trials); 20, two in it, is the least taken here, so that a study of a few dozen trials can
      show a ranking, and the note names the count for the reader to weigh.
    - scores spread beyond their noise: the standard deviation of the trials' search scores above
      `NOISE_MULTIPLE` (2) times the median standard error of one score. Equally good trials would
      still spread by about one standard error; a spread of twice that leaves at least three
      quarters of the variance (sd² − se² ≥ 3·se²) to real differences between configurations.
      The standard error counts the evaluation rows' sampling, not the seed's, so this is the
      least noise there is. Scores without standard errors are checked only for ties.
    """
    if len(trials) < MIN_TRIALS_FOR_IMPORTANCE:
        return (
            f"{len(trials)} complete trials with sampled parameters; importance needs at least "
            f"{MIN_TRIALS_FOR_IMPORTANCE}"
        )
    scores = [t.values[0] for t in trials]
    if len(set(scores)) < 2:
        return f"all {len(trials)} complete trials have the same score"
    spread, se = statistics.stdev(scores), _median_se(trials)
    if se is not None and spread <= NOISE_MULTIPLE * se:
        return (
            f"the scores' spread (sd {spread:.4g}) is within {NOISE_MULTIPLE:g}x the noise of one "
            f"score (median se {se:.4g}), so a ranking would rank noise"
        )
    return None


def _median_se(trials: list) -> float | None:
    """The median standard error of the trials' search scores, over those that stored one."""
    ses = [se for se in (StoredTrial.of(t).score_se for t in trials) if se is not None]
    return statistics.median(ses) if ses else None


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
                rows.append(
                    {
                        "form": m.form if m else "none",
                        "size": m.size if m else None,
                        "layers": len(m.layers) if m and m.layers else None,
                        "score": p.score,
                        "number": p.number,
                        "on_front": p.on_front,
                        "preset": p.preset,
                    }
                )
    return out


__all__ = [
    "Point",
    "StudyView",
    "study_view",
    "reference_point",
    "hypervolume",
    "hypervolume_history",
    "importances",
    "importance_refusal",
    "modules_by_position",
    "MIN_TRIALS_FOR_IMPORTANCE",
    "NOISE_MULTIPLE",
]
