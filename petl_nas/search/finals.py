"""The final re-evaluation: the front's best (or confirmation's ranking) and the presets, trained at
the final recipe over ``final.seeds`` seeds and scored on the held-out test split.

Nothing here chooses: the test split only reports. Each trial's scores go to the study attribute
``final:<trial number>`` once all its seeds are in, so a stopped re-evaluation goes on from the
trials it had finished. Runs that already trained as these do (a trial or a confirmation run at the
final recipe, scored on test then) are read, not trained again; the rest train side by side on the
free cores, as confirmation's do (`side_by_side`).
"""

from __future__ import annotations

import statistics

from optuna.trial import TrialState

from ..study.header import StudyHeader
from ..study.pick import verdict
from ..study.records import FINAL, StoredTrial, stored_trial, stored_trials
from ..tasks.significance import mean_std
from ..training.loop import Recipe
from .baselines import best_2022_baseline
from .confirm import confirm
from .progress import Stage
from .side_by_side import describe, for_stage, run_all
from .specs import final_k, final_recipe, trial_spec
from .study import front
from .worker import run_trial


def reevaluate_front(study, exp, task, recipe: Recipe, printer) -> None:
    """Re-train front members (and presets, for comparison) at full fidelity with several seeds,
    scored on the held-out test split; results go to study attributes ``final:<trial number>``.
    With ``final.confirm``, the confirmed pick, the best baseline and the best 2021–22 baseline are
    always among them."""
    todo = _members(study, exp, recipe, printer)
    k, seeds = final_k(exp), range(exp.final.seeds)
    ran = {
        (t.number, seed): t.test_run(final_recipe(exp, recipe, t.lr, seed).to_dict(), k) for t in todo for seed in seeds
    }
    jobs = [(t, seed) for t in todo for seed in seeds if ran[(t.number, seed)] is None]
    specs = [
        trial_spec(exp, t.petl_config, final_recipe(exp, recipe, t.lr, seed), number=t.number, final=True)
        for t, seed in jobs
    ]
    where = for_stage(len(specs), exp.executor, exp.cpus_per_trial)
    if todo:
        kept = len(ran) - len(jobs)
        printer(
            f"final: {len(todo)} configuration(s) x {exp.final.seeds} seed(s) on the test split, {describe(where)}"
            + (
                f"; {kept} of the {len(ran)} runs are trials or confirmations that trained as the final runs "
                f"do and were scored on test then, so they are read, not trained again"
                if kept
                else ""
            )
        )
    stage = Stage(printer, len(jobs))
    for t in todo:  # those read in full are stored first
        if (runs := _all_seeds(ran, t, seeds)) is not None:
            _store(study, exp, task, t, runs, stage)
    labels = [f"final: trial {t.number}, seed {seed}, on the test split" for t, seed in jobs]
    for index, result in run_all(specs, labels, where, stage, run_trial):
        t, seed = jobs[index]
        ran[(t.number, seed)] = result.history[-1]  # the last evaluation: no checkpoint picking
        if (runs := _all_seeds(ran, t, seeds)) is not None:
            _store(study, exp, task, t, runs, stage)


def _all_seeds(ran: dict, t: StoredTrial, seeds) -> list[dict] | None:
    """``t``'s last evaluations in seed order once every seed is in, else None."""
    runs = [ran[(t.number, seed)] for seed in seeds]
    return runs if all(r is not None for r in runs) else None


def _members(study, exp, recipe: Recipe, printer) -> list[StoredTrial]:
    """The trials to re-evaluate that have no final scores yet: confirmation's best (its pick, best
    baseline and the best baseline of the 2021–22 methods, `best_2022_baseline`, always among them)
    or the front's best, then the presets ``final.presets`` names. A study finished before the last
    was added trains just its runs when it is run again."""
    if exp.final.confirm:  # chosen by the mean over extra seeds on search-dev
        ranked = confirm(study, exp, recipe, printer)
        members = ranked[: exp.final.max_front]
        said = verdict(study)  # its pick, the best baseline and the reference are re-evaluated, wherever
        members += [
            t
            for t in ranked[exp.final.max_front :]  # their means rank them: paired on test
            if said is not None and t.number in (said.pick, said.baseline, said.reference)
        ]
        older = best_2022_baseline(study)  # the best of the 2021–22 methods: Δ to it, paired on test
        if older is not None and older.number not in {t.number for t in members}:
            members.append(older)
    else:
        members = sorted(front(study), key=lambda t: -t.values[0])[: exp.final.max_front]
    members = [stored_trial(study, t) for t in members]  # with their confirmation's test runs
    presets = sorted((t for t in stored_trials(study, (TrialState.COMPLETE,)) if t.preset), key=lambda t: -t.values[0])
    if exp.final.presets == "best":
        presets = presets[:1]
    elif exp.final.presets == "none":
        presets = []
    chosen = {m.number for m in members}
    return [t for t in members + [p for p in presets if p.number not in chosen] if t.final is None]


def _store(study, exp, task, t: StoredTrial, runs: list[dict], stage: Stage) -> None:
    """One trial's test scores over its seeds, as one record, and the line that reports them."""
    beside = task.customary_metric if task.customary_metric != task.main_metric else None  # F1 beside accuracy
    scores = [last[task.main_metric] for last in runs]  # on the test split
    customary = [last[beside] for last in runs if beside is not None and beside in last]
    mean = statistics.fmean(scores)
    std = statistics.stdev(scores) if len(scores) > 1 else None  # one seed has no spread
    reported = {beside: customary} if customary and len(customary) == len(scores) else {}
    study.set_user_attr(
        f"{FINAL}{t.number}",
        {
            "mean": mean,
            "std": std,
            "scores": scores,
            "seeds": exp.final.seeds,
            "epochs": exp.final.epochs,
            "k": final_k(exp),
            "split": "test",
            **({"customary": reported} if reported else {}),
        },
    )
    tag = f" [{t.preset}]" if t.preset else ""
    floor = (StudyHeader.of(study).baseline or {}).get("test_score")
    printer = stage.printer
    printer(
        f"re-evaluated trial {t.number}{tag}: test {task.main_metric} {mean_std(mean, std, len(scores))}"
        + (f" over {len(scores)} seeds" if len(scores) != 1 else "")
        + "".join(f" ({name} {statistics.fmean(v):.4f}, as papers report it)" for name, v in reported.items())
        + (f" (the trivial baseline scores {floor:.4f} on test)" if floor is not None else "")
        + (f"; {stage.left()}" if stage.total else "")
    )  # every run read: nothing to count
