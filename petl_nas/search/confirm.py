"""Confirm before choosing: re-score the best few trials over extra seeds on search-dev.

With ``final.confirm: N``, the trials `petl_nas.study.pick.candidates` names (the N with the highest
search scores that learned, the best baselines and the reference preset) are trained again with
``final.confirm_seeds`` other seeds (each seed changes the initialisation and the data order), with
the trial recipe, and scored on search-dev; the pick rule over their means is
`petl_nas.study.pick.verdict`. Nothing here reads the test split.

The scores are stored on the study (``confirm:<trial number>``: the search score first, then one
per extra seed; a finished trial's own attributes cannot change), the per-row predictions beside
them (``confirm_rows:<trial number>``); a resumed study does not train them again.
"""

from __future__ import annotations

import dataclasses
import statistics

from ..console import table
from ..core.describe import short_name
from ..study.pick import candidates, is_baseline, mean_score, trial_name, verdict
from ..study.records import CONFIRMED as PREFIX
from ..study.records import CONFIRMED_ROWS, CONFIRMED_TEST, stored_trial
from .progress import Stage
from .side_by_side import describe, for_stage, run_all


def confirm(study, exp, recipe, printer) -> list:
    """Re-score the top ``exp.final.confirm`` trials over extra seeds; returns them, best mean first."""
    from .specs import trial_spec  # torch: only where trials are trained
    from .worker import run_trial

    n, extra = exp.final.confirm, exp.final.confirm_seeds
    top = candidates(study, n, exp.final.confirm_baselines, exp.final.reference)
    todo = [t for t in top if stored_trial(study, t).confirmed is None]
    jobs = [(t, i) for t in todo for i in range(1, extra + 1)]
    specs = []
    for t, i in jobs:
        stored = stored_trial(study, t)
        run = recipe.with_overrides(lr=stored.lr, seed=exp.seed + i)
        if exp.fidelity.score == "last":  # one evaluation, at the end, is all "last" reads
            run = dataclasses.replace(run, evals_per_epoch=0)
        specs.append(trial_spec(exp, stored.petl_config, run, number=t.number))
    where = for_stage(len(specs), exp.executor, exp.cpus_per_trial)
    if jobs:
        printer(
            f"confirming {len(todo)} candidate(s) with {extra} more seed(s) each on search-dev, {describe(where)} ..."
        )
    stage = Stage(printer, len(jobs))
    got: dict[int, dict[int, object]] = {t.number: {} for t in todo}
    labels = [f"confirming trial {t.number}, seed {exp.seed + i}" for t, i in jobs]
    for index, result in run_all(specs, labels, where, stage, run_trial):
        t, i = jobs[index]
        got[t.number][i] = result
        if len(got[t.number]) == extra:  # all its seeds: stored at once, as one record
            _store(study, t, [got[t.number][j] for j in range(1, extra + 1)])
            printer(f"  confirming: trial {t.number} done ({stage.left()})")
    ranked = sorted(top, key=lambda t: -mean_score(study, t))
    rows = []
    for t in ranked:
        stored = stored_trial(study, t)
        s = stored.confirmed
        rows.append(
            [
                t.number,
                trial_name(t) if is_baseline(t) else short_name(stored.petl_config),
                f"{s[0]:.4f}",
                f"{statistics.fmean(s):.4f}",
                len(s),
                ", ".join(f"{v:.4f}" for v in s[1:]),
            ]
        )
    if rows:
        printer("confirmed on search-dev, best mean first:")
        printer(
            "\n".join(
                table(
                    ["trial", "configuration", "search", "mean", "seeds", "other seeds' scores"],
                    rows,
                    right=(0, 2, 3, 4),
                )
            )
        )
    if (said := verdict(study)) is not None:
        printer(said.line)
    return ranked


def _store(study, t, results: list) -> None:
    """One confirmed trial's extra seeds' scores, per-row predictions and test runs, on the study."""
    stored = stored_trial(study, t)
    scores, rows = [t.values[0]] + [r.score for r in results], [stored.rows] + [r.rows for r in results]
    tested = [r.test_run for r in results if r.test_run]  # for the final re-evaluation only
    if all(r is not None for r in rows):  # a trial trained before rows were kept has none
        study.set_user_attr(CONFIRMED_ROWS + str(t.number), rows)
    if tested:
        study.set_user_attr(CONFIRMED_TEST + str(t.number), tested)
    study.set_user_attr(PREFIX + str(t.number), scores)


__all__ = ["confirm", "PREFIX"]
