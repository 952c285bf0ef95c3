"""Confirm before choosing: re-score the best few trials over extra seeds on search-dev.

The best of many noisy scores is the best draw as much as the best configuration. On SST-2 (v5:
29 trials at the final length, standard errors of 1.2 points), the top search score was 1.5
points above LoRA r=8's and ended 0.65 points below it on test. With ``final.confirm: N``, the
N trials with the highest search scores that learned are trained again with
``final.confirm_seeds`` other seeds (each seed changes the initialisation and the data order),
with the trial recipe and scored on search-dev. The final re-evaluation then takes the one with
the best mean over all its seeds, not the best single score. Nothing here reads the test split.

The scores are stored on the study (``confirm:<trial number>``: the search score first, then one
per extra seed; a finished trial's own attributes cannot change); a resumed study does not train
them again.
"""

from __future__ import annotations

import dataclasses
import statistics

from optuna.trial import TrialState

from .records import CONFIRMED as PREFIX, StoredTrial


def candidates(study, n: int) -> list:
    """The ``n`` completed trials that learned with the highest search scores (front membership is
    itself decided by single scores, so it does not limit them)."""
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE and not StoredTrial.of(t).did_not_learn]
    return sorted(done, key=lambda t: -t.values[0])[:n]


def confirm(study, exp, recipe, printer) -> list:
    """Re-score the top ``exp.final.confirm`` trials over extra seeds; returns them, best mean first."""
    from .specs import trial_spec                 # torch: only where trials are trained
    from .worker import run_trial

    n, extra = exp.final.confirm, exp.final.confirm_seeds
    top = candidates(study, n)
    for t in top:
        stored = StoredTrial.of(t, study.user_attrs)
        if stored.confirmed is not None:
            continue
        scores = [t.values[0]]
        for i in range(1, extra + 1):
            run = recipe.with_overrides(lr=stored.lr, seed=exp.seed + i)
            if exp.fidelity.score == "last":              # one evaluation, at the end, is all "last" reads
                run = dataclasses.replace(run, evals_per_epoch=0)
            scores.append(run_trial(trial_spec(exp, stored.petl_config, run, number=t.number)).score)
        study.set_user_attr(PREFIX + str(t.number), scores)
    ranked = sorted(top, key=lambda t: -mean_score(study, t))
    attrs = study.user_attrs
    for t in ranked:
        s = StoredTrial.of(t, attrs).confirmed
        seeds = f"{len(s)} seed{'s' if len(s) != 1 else ''}"
        printer(f"confirmed trial {t.number}: search score {s[0]:.4f}, mean over {seeds} "
                f"{statistics.fmean(s):.4f} (" + ", ".join(f"{v:.4f}" for v in s) + ")")
    return ranked


def confirmed_now(study) -> set[int]:
    """The trials the study's current ``final.confirm`` (the last run's setting) re-scored: its top N
    that learned. Scores an earlier run stored for others (with a larger N) are not the search's."""
    return set(confirmed_scores(study))


def confirmed_scores(study) -> dict[int, list[float]]:
    """{trial number: its search score, then one per extra seed} for the trials `confirmed_now` names."""
    attrs = study.user_attrs
    n = (attrs.get("final") or {}).get("confirm") or 0
    stored = [StoredTrial.of(t, attrs) for t in candidates(study, n)] if n else []
    return {s.number: s.confirmed for s in stored if s.confirmed is not None}


def confirmed_text(scores: list[float], on_front: bool = True) -> str:
    """A confirmed trial's mean as the summary, the report and ``export --list`` show it beside its
    single search score."""
    seeds = f"{len(scores)} seed{'s' if len(scores) != 1 else ''}"
    return f"confirmed: mean {statistics.fmean(scores):.4f} over {seeds}" + ("" if on_front else ", off the front")


def mean_score(study, trial) -> float:
    """A trial's confirmed mean search score (its single score when it was not confirmed)."""
    scores = StoredTrial.of(trial, study.user_attrs).confirmed
    return statistics.fmean(scores) if scores else trial.values[0]


__all__ = ["confirm", "candidates", "confirmed_now", "confirmed_scores", "confirmed_text", "mean_score", "PREFIX"]
