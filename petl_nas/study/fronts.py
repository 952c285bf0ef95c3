"""Fronts of groups of trials and how they compare: the searched front against its baselines.

A study holds four kinds of complete trial: ``searched`` (proposed by the sampler), ``oneshot``
(read off a trained supernet, `petl_nas.search.oneshot`), ``preset`` (the hand-designed methods) and
``sweep`` (the LoRA rank sweep, `baselines.py`). Each group has a
Pareto front of search score against deployable parameters and a hypervolume, measured in the
report's coordinates: score above the reference (the trivial baseline's score when there is one)
times decades of parameters up to the budget. `compare_to_sweep` asks, at each sweep point's size,
whether the searched front is higher there, and by more than noise.

Example:
    >>> hypervolume([(0.8, 100), (0.9, 1000)], (0.5, 10000))   # doctest: +ELLIPSIS
    1.1...
"""

from __future__ import annotations

import math
from collections import Counter

from optuna.trial import FrozenTrial, TrialState

from ..tasks.significance import clearly_better
from .header import StudyHeader
from .records import StoredTrial, stored_trials

GROUPS = ("searched", "oneshot", "preset", "sweep")
FOUND = ("searched", "oneshot")  # what the tool proposed, against its baselines


def _stored(t: FrozenTrial | StoredTrial) -> StoredTrial:
    return t if isinstance(t, StoredTrial) else StoredTrial.of(t)


def group_of(t: FrozenTrial | StoredTrial) -> str:
    """``sweep``, ``preset``, ``oneshot`` or ``searched``."""
    s = _stored(t)
    if s.sweep:
        return "sweep"
    if s.preset:
        return "preset"
    return "oneshot" if s.oneshot else "searched"


def source_of(t: FrozenTrial | StoredTrial) -> str:
    """What proposed a trial, as the tables show it: the preset's or sweep point's name, ``one-shot``
    (``one-shot on NAME``: built on the baseline NAME), ``warm start`` (a front member of an earlier
    study), or ``-`` for the sampler."""
    s = _stored(t)
    oneshot = ("one-shot" + (f" on {s.oneshot_anchor}" if s.oneshot_anchor else "")) if s.oneshot else None
    return s.preset or s.sweep or oneshot or ("warm start" if s.warm_start else "-")


def learned_trials(study, group: str | None = None) -> list[FrozenTrial]:
    """Complete trials that learned (not within noise of the trivial baseline), of one group or all."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE
        and t.values is not None
        and not StoredTrial.of(t).did_not_learn
        and (group is None or group_of(t) == group)
    ]


def pareto(items: list, score=lambda t: t.values[0], size=lambda t: t.values[1]) -> list:
    """The non-dominated items (higher score, fewer parameters), by parameters: trials by default,
    anything else with its own ``score`` and ``size``."""
    out = []
    for t in sorted(items, key=lambda t: (size(t), -score(t))):
        if not out or score(t) > score(out[-1]):
            out.append(t)
    return out


def hypervolume(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by (score, deployable) ``points`` up to ``reference``, in (metric, log10
    parameters): the sum of the front's staircase steps. Points beyond the reference add nothing."""
    ref_score, ref_x = reference[0], math.log10(reference[1])
    pts = sorted((math.log10(max(d, 1)), s) for s, d in points if s >= ref_score and d <= reference[1])
    area, best = 0.0, ref_score
    for i, (x, s) in enumerate(pts):
        best = max(best, s)
        right = pts[i + 1][0] if i + 1 < len(pts) else ref_x
        area += (right - x) * (best - ref_score)
    return area


def reference_from(points: list[tuple[float, float]], baseline: dict | None, budget: int | None) -> tuple[float, float]:
    """(score, parameters) hypervolumes are measured from, given complete (score, parameters)
    points: the trivial baseline's score (else the worst point's) and the budget (else the largest point)."""
    score = baseline["score"] if baseline else min(s for s, _ in points)
    return score, float(budget or max(d for _, d in points))


def reference_point(study) -> tuple[float, float] | None:
    """`reference_from` for a study's complete trials (None when it has none)."""
    complete = [
        (t.values[0], t.values[1])
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE and t.values
    ]
    if not complete:
        return None
    header = StudyHeader.of(study)
    return reference_from(complete, header.baseline, header.budget)


def group_hypervolumes(study) -> dict[str, float]:
    """Hypervolume of each group's trials that learned (groups with none are left out)."""
    ref = reference_point(study)
    out = {}
    for g in GROUPS:
        trials = learned_trials(study, g)
        if ref is not None and trials:
            out[g] = hypervolume([(t.values[0], t.values[1]) for t in trials], ref)
    return out


def compare_to_sweep(study) -> list[dict]:
    """At each sweep point's size: the best searched trial no larger, and whether it is higher
    (and beyond noise). Sweep points that did not learn are compared too: beating those is easy."""
    searched = [StoredTrial.of(t) for t in learned_trials(study) if group_of(t) in FOUND]
    rows = []
    sweep = [t for t in stored_trials(study, (TrialState.COMPLETE,)) if t.values is not None and group_of(t) == "sweep"]
    for s in sorted(sweep, key=lambda t: t.values[1]):
        fits = [t for t in searched if t.values[1] <= s.values[1]]
        best = max(fits, key=lambda t: t.values[0]) if fits else None
        rows.append(
            {
                "sweep": s.sweep,
                "params": int(s.values[1]),
                "sweep_score": s.values[0],
                "searched": best.number if best else None,
                "searched_score": best.values[0] if best else None,
                "higher": bool(best and best.values[0] > s.values[0]),
                "beyond_noise": bool(best and clearly_better(best.values[0], best.score_se, s.values[0], s.score_se)),
            }
        )
    return rows


def sweep_line(study) -> str | None:
    """The summary's one line: is the searched front above the LoRA rank sweep? (None when the study
    has no sweep; says so when none of its points completed.)"""
    rows = compare_to_sweep(study)
    if not rows:
        points = [t for t in study.get_trials(deepcopy=False) if group_of(t) == "sweep"]
        if not points:
            return None
        states = Counter(t.state.name.lower() for t in points)
        return (
            f"LoRA rank sweep: none of its {len(points)} points completed "
            f"({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}); nothing to compare the searched front with"
        )
    hv = group_hypervolumes(study)
    higher, clear = sum(r["higher"] for r in rows), sum(r["beyond_noise"] for r in rows)
    volumes = ", ".join(f"{g} {hv[g]:.3f}" for g in GROUPS if g in hv)
    return (
        f"searched front vs the LoRA rank sweep (search-dev): higher at {higher} of {len(rows)} sweep sizes, "
        f"beyond noise at {clear}; hypervolume {volumes or 'n/a'}"
    )


__all__ = [
    "GROUPS",
    "group_of",
    "source_of",
    "learned_trials",
    "pareto",
    "hypervolume",
    "reference_from",
    "reference_point",
    "group_hypervolumes",
    "compare_to_sweep",
    "sweep_line",
]
