"""Which trials of a study can be exported, and the one ``petl-nas export`` writes by default: read
from the study alone (its front, its budget, what ``final.confirm`` re-scored), so the report names
the same pick as export. The other picks and the records are `petl_nas.deploy.export`'s."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..errors import ConfigError
from .pick import confirmed_now, mean_score, verdict

__all__ = ["candidates", "best_of"]


def candidates(study: optuna.Study, budget: int | None = None) -> list[tuple[FrozenTrial, float]]:
    """(trial, search score) for the front members within ``budget``, and the trials ``final.confirm``
    re-scored (`petl_nas.search.confirm`): the mean over seeds where it re-scored them. Test-split scores
    play no part."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise ConfigError(f"study {study.study_name!r} has no complete trial to export")
    front = [t for t in study.best_trials if budget is None or t.values[1] <= budget]
    if not study.best_trials:
        raise ConfigError(
            f"study {study.study_name!r} has no feasible trial: every complete trial is over its "
            f"budget or did not learn (within noise of the trivial baseline)"
        )
    if not front:
        smallest = min(t.values[1] for t in study.best_trials)
        raise ConfigError(
            f"budget {budget:,} is below every front member of study {study.study_name!r} "
            f"(the smallest has {int(smallest):,} deployable parameters)"
        )
    # A trial final.confirm re-scored is a candidate even off the front: the search's own pick is the
    # best confirmed mean wherever it lies, and export must not disagree with it. Only the trials the
    # study's current setting confirms count: an earlier run's (with a larger N) are not its pick.
    seen, now = {t.number for t in front}, confirmed_now(study)
    confirmed = [
        t for t in complete if t.number not in seen and t.number in now and (budget is None or t.values[1] <= budget)
    ]
    return [(t, mean_score(study, t) if t.number in now else t.values[0]) for t in front + confirmed]


def best_of(study: optuna.Study, pool: list[tuple[FrozenTrial, float]]) -> FrozenTrial:
    """The default pick among ``pool`` (`candidates`): the search's own pick (`pick.verdict`) where
    the pool holds it, else the highest score, ties to fewer parameters."""
    top = max(pool, key=lambda c: (c[1], -c[0].values[1]))
    said = verdict(study)
    return {c[0].number: c for c in pool}.get(said.pick if said else None, top)[0]
