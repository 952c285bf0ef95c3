"""The pick rule: which trial a study's confirmation names (`verdict`), read from the study alone.

``final.confirm: N`` re-scores the N trials with the highest search scores that learned over extra
seeds on search-dev (`petl_nas.search.confirm` trains them), beside the baselines (presets and LoRA
rank sweep points) that learned with the highest search scores, up to ``final.confirm_baselines``
of those within noise of the best one's (`candidates`). The best baseline is the best confirmed
mean among them, so no baseline is defended by one lucky score and every comparison with it is
paired. Where no baseline learned and a searched trial did, the baseline with the best search
score is confirmed all the same.

`verdict` asks whether any searched configuration beats the best baseline beyond noise
(`beyond_noise`: the mean per-seed difference above twice its standard error, and, where the runs
kept their per-row predictions, the gain over search-dev's rows above twice its bootstrap standard
error). The pick (what ``export`` takes by default) is the best winner's mean, ties to fewer
parameters; where none wins, the best baseline itself, and the line says so. A pick with more
deployable parameters than ``final.reference`` (a preset) that does not beat it beyond noise gives
way to it, unless the best baseline or the best confirmed mean does. The line also names the best
confirmed mean (``--pick best-mean``) and the smallest configuration within noise of it
(``--pick smallest-within-noise``). Nothing here reads the test split. The evidence for each rule
is in experiments/trials_that_rank/README.md, experiments/suite/README.md and
experiments/rates/README.md.
"""

from __future__ import annotations

import dataclasses
import statistics

from optuna.trial import TrialState

from ..tasks.significance import Z, clearly_better, decode_rows, paired_difference, row_gain
from .header import StudyHeader
from .records import StoredTrial


def candidates(study, n: int, baselines: int = 1, reference: str | None = None) -> list:
    """The ``n`` completed trials that learned with the highest search scores (front membership is
    itself decided by single scores, so it does not limit them), then the baselines
    `baselines_to_confirm` names and the ``reference`` preset's trial (`reference_trial`) that are
    not among them (none when ``n`` is 0)."""
    top = sorted(_learned(study), key=lambda t: -t.values[0])[:n]
    if not n:
        return top
    seen = {t.number for t in top}
    for t in baselines_to_confirm(study, baselines) + [reference_trial(study, reference)]:
        if t is not None and t.number not in seen:
            top.append(t)
            seen.add(t.number)
    return top


def reference_trial(study, name: str | None):
    """The trial of the preset ``name`` (``final.reference``: PEFT's LoRA r=8 on q, v by default),
    when it learned; None when the study has no such trial (the preset is over the budget or not
    among the study's presets) or it did not learn."""
    if name is None:
        return None
    return next((t for t in _learned(study) if StoredTrial.of(t).preset == name), None)


def baselines_to_confirm(study, n: int) -> list:
    """Up to ``n`` baselines that learned, highest search scores first, each within noise of the best
    one's single search score (not behind it by more than two standard errors of the difference;
    one without a standard error is kept); where none learned, `_unlearned_baseline`. One search
    score cannot tell close baselines apart (at 0.05% on SST-2 prompt tuning's 0.828 was defended
    over LoRA r=1's 0.824, which then led it by 2.6 points on test), so the best baseline is the
    best confirmed mean among these."""
    learned = _learned(study)
    ranked = sorted((t for t in learned if is_baseline(t)), key=lambda t: -t.values[0])
    if not ranked:  # then whatever learned is a searched trial
        return _unlearned_baseline(study, learned)[:n]
    best = StoredTrial.of(ranked[0])
    return [t for t in ranked[:n] if not _behind_beyond_noise(StoredTrial.of(t), best)]


def _unlearned_baseline(study, learned: list) -> list:
    """Where no baseline learned and a searched trial did: the baseline with the best search score,
    confirmed all the same, so that the search's pick is still compared, paired, with the baseline
    a user would otherwise have (issue 51: the best baseline at a budget is the best by search
    score). A single score within noise of the trivial baseline is not proof of nothing learned (on
    QNLI at 0.01%, LoRA r=1 on q, v of the top layer scored 0.548 against the constant predictor's
    0.508, 0.004 short of two standard errors). Nothing when nothing learned at all (``learned``
    is empty: no baseline is among it)."""
    if not learned:
        return []
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and is_baseline(t)]
    return [max(done, key=lambda t: t.values[0])] if done else []


def _behind_beyond_noise(trial: StoredTrial, best: StoredTrial) -> bool:
    if trial.score_se is None or best.score_se is None:
        return False
    return clearly_better(best.values[0], best.score_se, trial.values[0], trial.score_se)


def _learned(study) -> list:
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE and not StoredTrial.of(t).did_not_learn
    ]


def is_baseline(trial) -> bool:
    """A preset or a point of the LoRA rank sweep: what a searched configuration must beat."""
    stored = StoredTrial.of(trial)
    return bool(stored.preset or stored.sweep)


def best_baseline(study):
    """The baseline that learned with the highest search score (None: no baseline learned)."""
    return max((t for t in _learned(study) if is_baseline(t)), key=lambda t: t.values[0], default=None)


def confirmed_now(study) -> set[int]:
    """The trials the study's current ``final.confirm`` (the last run's setting) re-scored: its top N
    that learned. Scores an earlier run stored for others (with a larger N) are not the search's."""
    return set(confirmed_scores(study))


def confirmed_scores(study) -> dict[int, list[float]]:
    """{trial number: its search score, then one per extra seed} for the trials `confirmed_now` names."""
    attrs, final = study.user_attrs, StudyHeader.of(study).final
    n = final.get("confirm") or 0  # a study from before confirm_baselines confirmed one
    stored = (
        [
            StoredTrial.of(t, attrs)
            for t in candidates(study, n, final.get("confirm_baselines", 1), final.get("reference"))
        ]
        if n
        else []
    )
    return {s.number: s.confirmed for s in stored if s.confirmed is not None}


def confirmed_text(scores: list[float], on_front: bool = True) -> str:
    """A confirmed trial's mean as the summary, the report and ``export --list`` show it beside its
    single search score."""
    seeds = f"{len(scores)} seed{'s' if len(scores) != 1 else ''}"
    return f"confirmed: mean {statistics.fmean(scores):.4f} over {seeds}" + ("" if on_front else ", off the front")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What confirmation concluded: the search's ``pick`` (a trial number), the best baseline's,
    whether a searched configuration beat it beyond noise (``beaten``), the confirmed trial with
    the fewest deployable parameters within noise of the best confirmed mean (``smallest``),
    the best confirmed mean itself (``best``, ties to fewer parameters), and the confirmed trial of
    ``final.reference`` (``reference``; None where it was not confirmed)."""

    pick: int
    baseline: int | None
    beaten: bool
    line: str
    smallest: int
    best: int
    reference: int | None = None


@dataclasses.dataclass(frozen=True)
class Rows:
    """Two confirmed trials' per-row predictions on search-dev, one array per seed, with the labels
    and the metric that scores them: what `beyond_noise` resamples."""

    a: list
    b: list
    labels: object
    metric: str


def beyond_noise(a: list[float], b: list[float], rows: Rows | None = None) -> bool:
    """Is ``a`` higher than ``b`` beyond noise, seed by seed: the mean per-seed difference above
    twice its standard error (equal differences on every seed count as beyond it); and, with
    ``rows``, over the rows too: the gain of the mean over seeds above twice its standard error in a
    paired bootstrap of search-dev's rows (`petl_nas.tasks.significance.row_gain`). Without rows
    (trials trained before they were kept) the seeds alone decide."""
    d = paired_difference(a, b)
    if d["std"] is None:
        return False  # one seed tells nothing apart
    if not d["mean"] > Z * d["std"] / d["n"] ** 0.5:
        return False
    if rows is None:
        return True
    gain, se = row_gain(rows.a, rows.b, rows.labels, rows.metric)
    return se is None or gain > Z * se


def verdict(study) -> Verdict | None:
    """The search's pick among the trials confirmation re-scored; None when it re-scored none. See
    the module docstring."""
    scores = {n: s for n, s in confirmed_scores(study).items() if len(s) > 1}
    trials = {t.number: t for t in study.get_trials(deepcopy=False) if t.number in scores}
    if not trials:
        return None
    apart = _comparer(study, scores, trials)
    best = max(trials, key=lambda n: (statistics.fmean(scores[n]), -trials[n].values[1]))
    near = [n for n in trials if not apart(best, n)]
    smallest = min(near, key=lambda n: (trials[n].values[1], -statistics.fmean(scores[n])))
    baselines = [n for n in trials if is_baseline(trials[n])]
    baseline = max(baselines, key=lambda n: statistics.fmean(scores[n])) if baselines else None
    searched = [n for n in trials if n not in baselines]
    if baseline is None:
        return Verdict(
            best,
            None,
            False,
            f"search's pick: trial {best}, the best confirmed mean (no baseline learned to compare it with)",
            smallest,
            best,
        )
    winners = [n for n in searched if apart(n, baseline)]
    reference = _confirmed_reference(study, trials)
    if winners:
        winner = max(winners, key=lambda n: (statistics.fmean(scores[n]), -trials[n].values[1]))
        pick = _no_larger_than_reference(winner, reference, trials, apart, baseline, best)
        line = (
            f"trial {winner} beats the best baseline "
            f"({trial_name(trials[baseline])}{_unlearned(trials[baseline])}) beyond noise on search-dev "
            f"({statistics.fmean(scores[winner]):.4f} against {statistics.fmean(scores[baseline]):.4f})"
        )
        line = (
            f"search's pick: {line}"
            if pick == winner
            else f"{line}, but {_reference_clause(trials, scores, reference)}"
        )
        return Verdict(pick, baseline, True, line, smallest, best, reference)
    pick = _no_larger_than_reference(baseline, reference, trials, apart, best)
    line = (
        f"no searched configuration beats the best baseline ({trial_name(trials[baseline])}"
        f"{_unlearned(trials[baseline])}, mean {statistics.fmean(scores[baseline]):.4f}) beyond noise on "
        f"search-dev: "
        + (
            f"the pick is that baseline, {_described(trials[baseline])}"
            if pick == baseline
            else f"that baseline, {_described(trials[baseline])}, {_reference_clause(trials, scores, reference)}"
        )
    )
    if best != baseline:
        line += (
            f"; the best confirmed mean, {_described(trials[best])} at {statistics.fmean(scores[best]):.4f}, "
            f"is within noise of {'it' if pick == baseline else 'the best baseline'} (export --pick best-mean)"
        )
    if smallest not in (baseline, best, pick):
        line += (
            f"; the smallest within noise of the best is {_described(trials[smallest])} "
            f"(export --pick smallest-within-noise)"
        )
    return Verdict(pick, baseline, False, line, smallest, best, reference)


def _confirmed_reference(study, trials: dict) -> int | None:
    """The confirmed trial of the study's ``final.reference`` preset (None: not set, as in studies
    from before it, or not confirmed)."""
    found = reference_trial(study, StudyHeader.of(study).final.get("reference"))
    return found.number if found is not None and found.number in trials else None


def _no_larger_than_reference(pick: int, reference: int | None, trials: dict, apart, *others: int) -> int:
    """The reference instead of a ``pick`` with more deployable parameters that does not beat it
    beyond noise on search-dev: a configuration larger than the field's default must show it is
    better to be deployed instead of it (on SST-2 at 0.5% the parallel adapter, 113,040 parameters,
    led LoRA r=8 by 2.2 points on one search score and tied it on test; experiments/suite/README.md).
    Never where one of ``others`` (the best baseline, the best confirmed mean) beats the reference
    beyond noise: the default export trails neither."""
    if (
        reference is None
        or pick == reference
        or trials[pick].values[1] <= trials[reference].values[1]
        or any(apart(n, reference) for n in (pick, *others) if n != reference)
    ):
        return pick
    return reference


def _reference_clause(trials: dict, scores: dict, reference: int) -> str:
    return (
        f"holds more deployable parameters than the reference ({trial_name(trials[reference])}, mean "
        f"{statistics.fmean(scores[reference]):.4f}) and does not beat it beyond noise: the pick is the "
        f"reference, {_described(trials[reference])}"
    )


def _comparer(study, scores: dict, trials: dict):
    """``apart(x, y)``: trial ``x`` beyond noise above trial ``y`` (`beyond_noise`), over the rows too
    where the study kept its search-dev labels and both trials' per-row predictions for every seed
    (rows of another length than the labels, under ``eval_rows``, leave the seeds to decide)."""
    attrs, header = study.user_attrs, StudyHeader.of(study)
    labels, metric = header.search_dev_labels, header.metric
    kept = {}
    if labels is not None and metric is not None:
        labels = decode_rows(labels)
        for n, t in trials.items():
            rows = StoredTrial.of(t, attrs).confirmed_rows
            if rows is not None and len(rows) == len(scores[n]):
                kept[n] = [decode_rows(r) for r in rows]

    def apart(x: int, y: int) -> bool:
        rows = Rows(kept[x], kept[y], labels[: len(kept[x][0])], metric) if x in kept and y in kept else None
        return beyond_noise(scores[x], scores[y], rows)

    return apart


def trial_name(trial) -> str:
    stored = StoredTrial.of(trial)
    return stored.preset or stored.sweep or f"trial {trial.number}"


def _unlearned(trial) -> str:
    """What a verdict says of a best baseline confirmed though its search score did not learn."""
    return (
        ", whose search score was within noise of the trivial baseline" if StoredTrial.of(trial).did_not_learn else ""
    )


def _described(trial) -> str:
    """``trial 3 (lora, 5,000 deployable parameters)``; a searched trial has no name beside its number."""
    stored, count = StoredTrial.of(trial), f"{int(trial.values[1]):,} deployable parameters"
    name = stored.preset or stored.sweep
    return f"trial {trial.number} ({name + ', ' if name else ''}{count})"


def mean_score(study, trial) -> float:
    """A trial's confirmed mean search score (its single score when it was not confirmed)."""
    scores = StoredTrial.of(trial, study.user_attrs).confirmed
    return statistics.fmean(scores) if scores else trial.values[0]


__all__ = [
    "candidates",
    "baselines_to_confirm",
    "reference_trial",
    "best_baseline",
    "is_baseline",
    "trial_name",
    "verdict",
    "Verdict",
    "Rows",
    "beyond_noise",
    "confirmed_now",
    "confirmed_scores",
    "confirmed_text",
    "mean_score",
]
