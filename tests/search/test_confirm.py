"""final.confirm: the pick is chosen by the mean over extra seeds on search-dev, never by test.

The search trains real tiny trials; only the confirmation runs are scripted, so that the trial
with the best single score does badly on its extra seeds and must lose the pick.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import optuna
import pytest
from test_search import experiment

from petl_nas import ConfigError
from petl_nas.deploy.export import choose
from petl_nas.search import confirm, worker
from petl_nas.search.driver import run_search
from petl_nas.study import pick as pick_rule
from petl_nas.study.experiment import FinalEval
from petl_nas.study.results import TrialResult


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
def test_the_pick_is_the_best_mean_over_seeds_not_the_best_draw(tmp_path, monkeypatch, capsys):
    exp = experiment(tmp_path, trials=8)
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    top = pick_rule.candidates(study, 2)
    first, second = top[:2]  # then the best preset: none learned, so the best by search score
    assert first.values[0] >= second.values[0] and [t.user_attrs.get("preset") for t in top[2:]] == ["pfeiffer"]

    calls = []

    def scripted(spec, report=None, device=None):
        calls.append((spec.number, spec.recipe["seed"], spec.eval_split))
        return TrialResult(score=1.0 if spec.number == second.number else 0.0)

    monkeypatch.setattr(worker, "run_trial", scripted)

    confirmed = dataclasses.replace(
        exp,
        final=FinalEval(seeds=1, epochs=1, max_front=1, presets="none", confirm=2, confirm_seeds=2, baselines=False),
    )
    lines = []
    run_search(confirmed, printer=lines.append)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    assert sorted(calls) == sorted((t.number, exp.seed + i, "search_dev") for t in top for i in (1, 2))
    assert study.user_attrs[f"confirm:{first.number}"] == [first.values[0], 0.0, 0.0]
    assert f"final:{second.number}" in study.user_attrs and f"final:{first.number}" not in study.user_attrs
    table = lines.index("confirmed on search-dev, best mean first:")  # a table, best mean first
    assert lines[table + 1].split()[:4] == ["trial", "configuration", "search", "mean"]
    assert lines[table + 2].split()[0] == str(second.number)
    progress = [line for line in lines if line.startswith(("confirming", "  confirming"))]  # said as it goes
    assert progress[0].startswith("confirming 3 candidate(s) with 2 more seed(s) each on search-dev, in this process")
    assert [line.split("(")[1].split(",")[0].rstrip(")") for line in progress[1:]] == [
        f"{n} of 6 runs" for n in (2, 4, 6)
    ]
    assert "min left" in progress[1] and "min left" not in progress[3]
    assert choose(study).number == second.number  # export reads the confirmed mean too
    from petl_nas.app.cli import main

    capsys.readouterr()
    assert (
        main(["export", "--storage", exp.storage_url, "--study", exp.study_name, "-o", str(tmp_path / "x.yaml")]) == 0
    )
    mean = sum(study.user_attrs[f"confirm:{second.number}"]) / 3
    assert (
        f"trial {second.number} (accuracy {mean:.4f} on search dev, the mean over 3 seeds (final.confirm; its "
        f"trial scored {second.values[0]:.4f})"
    ) in capsys.readouterr().out
    n = len(calls)
    run_search(confirmed, printer=lambda *a: None)  # resumed: nothing confirmed twice
    assert len(calls) == n


@pytest.mark.slow
def test_the_best_baseline_is_re_evaluated_beside_the_pick_wherever_it_ranks(tmp_path, monkeypatch):
    """max_front 1, no presets asked for in the finals: the best baseline (BitFit), confirmed below
    the pick, still gets its test runs, so the pick's paired test Δ to it exists (the suite's table).
    Every run is scripted: all learn, the baseline's own score and its extra seeds score lowest, so
    the searched trials beat it beyond noise and one of them is the pick."""
    from petl_nas.search import executors

    def scripted(spec, report=None, device=None):
        score = 0.9
        if spec.eval_split == "search_dev" and spec.number == 0:
            score = 0.6 if spec.recipe["seed"] else 0.85
        return TrialResult(
            score=score, score_se=0.01, last_score=score, metric="accuracy", history=[{"accuracy": score}]
        )

    monkeypatch.setattr(executors, "run_trial", scripted)
    monkeypatch.setattr(worker, "run_trial", scripted)
    exp = experiment(
        tmp_path,
        trials=3,
        presets=["bitfit"],
        final=FinalEval(seeds=2, epochs=1, max_front=1, presets="none", confirm=4, confirm_seeds=2, baselines=False),
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    said = pick_rule.verdict(study)
    assert study.trials[0].user_attrs["preset"] == "bitfit"
    assert said.baseline == 0 and said.beaten and said.pick != 0 and len(pick_rule.confirmed_scores(study)) >= 3
    finals = {int(k.split(":")[1]) for k in study.user_attrs if k.startswith("final:")}
    assert finals == {said.pick, 0}


@pytest.mark.parametrize("confirm_baselines, reference, defended", [(1, None, 0), (2, None, 1), (1, "lora", 1)])
@pytest.mark.slow
def test_the_best_baseline_is_the_best_confirmed_mean_of_the_close_ones(
    tmp_path, monkeypatch, confirm_baselines, reference, defended
):
    """Two presets one search score apart (0.90, 0.89, standard errors 0.01: within noise), the
    second steadier over seeds: confirming only the top one defends it; confirming both defends
    the steadier one, which is then the pick (the best confirmed mean) and re-evaluated on test,
    so no searched configuration is compared with a baseline that one lucky score chose. The
    reference preset (``final.reference``) is confirmed whatever the cap."""
    from petl_nas.search import executors

    def scripted(spec, report=None, device=None):
        first = spec.recipe["seed"] == 3  # the trial itself; confirmation seeds are 4, 5
        score = {0: 0.90 if first else 0.70, 1: 0.89 if first else 0.93}.get(spec.number, 0.85)
        if spec.eval_split != "search_dev":
            score = 0.8
        return TrialResult(
            score=score, score_se=0.01, last_score=score, metric="accuracy", history=[{"accuracy": score}]
        )

    monkeypatch.setattr(executors, "run_trial", scripted)
    monkeypatch.setattr(worker, "run_trial", scripted)
    exp = experiment(
        tmp_path,
        trials=3,
        presets=["bitfit", "lora"],
        budget="20%",
        final=FinalEval(
            seeds=1,
            epochs=1,
            max_front=1,
            presets="none",
            confirm=1,
            confirm_seeds=2,
            confirm_baselines=confirm_baselines,
            baselines=False,
            reference=reference,
        ),
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    assert [study.trials[n].user_attrs["preset"] for n in (0, 1)] == ["bitfit", "lora"]
    said = pick_rule.verdict(study)
    assert said.baseline == defended and said.pick == defended
    assert set(pick_rule.confirmed_scores(study)) == ({0, 1} if confirm_baselines == 2 or reference else {0})
    assert f"final:{defended}" in study.user_attrs


def _baseline_study(trials: list) -> optuna.Study:
    """Completed trials of ``(score, score_se, kind)`` (kind: preset, baseline or searched)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (score, se, kind) in enumerate(trials):
        attrs = {"preset": f"p{i}"} if kind == "preset" else {"baseline": f"b{i}"} if kind == "baseline" else {}
        study.add_trial(
            create_trial(
                values=[score, 10.0],
                params={"x": 0.5},
                distributions={"x": FloatDistribution(0, 1)},
                user_attrs={**attrs, **({"score_se": se} if se is not None else {})},
            )
        )
    return study


def test_baselines_within_noise_of_the_best_one_are_confirmed_up_to_the_cap():
    """0.85 best; 0.845 and 0.84 within two standard errors of the difference (0.028); 0.78 beyond
    them (never confirmed, whatever the cap); one without a standard error kept."""
    study = _baseline_study(
        [
            (0.84, 0.01, "baseline"),
            (0.90, 0.01, "searched"),
            (0.85, 0.01, "preset"),
            (0.78, 0.01, "preset"),
            (0.845, 0.01, "baseline"),
            (0.70, None, "preset"),
        ]
    )
    assert [t.number for t in pick_rule.baselines_to_confirm(study, 1)] == [2]
    assert [t.number for t in pick_rule.baselines_to_confirm(study, 3)] == [2, 4, 0]
    assert [t.number for t in pick_rule.baselines_to_confirm(study, 9)] == [2, 4, 0, 5]
    assert [t.number for t in pick_rule.candidates(study, 1, 3)] == [1, 2, 4, 0]
    assert [t.number for t in pick_rule.candidates(study, 2, 3)] == [1, 2, 4, 0]  # 2 is among the top already
    assert pick_rule.candidates(study, 0, 3) == []


def test_a_study_confirmed_before_confirm_baselines_reads_its_one_baseline():
    """An older study's ``final`` has no confirm_baselines: it confirmed the best baseline only, and
    its verdict is read as it was made, not with the scores a later default would add."""
    study = _baseline_study([(0.90, 0.01, "searched"), (0.85, 0.01, "preset"), (0.84, 0.01, "baseline")])
    for n, scores in ((0, [0.90, 0.80, 0.80]), (1, [0.85, 0.84, 0.84]), (2, [0.84, 0.86, 0.86])):
        study.set_user_attr(f"confirm:{n}", scores)
    study.set_user_attr("final", {"confirm": 1})
    assert set(pick_rule.confirmed_scores(study)) == {0, 1} and pick_rule.verdict(study).baseline == 1
    study.set_user_attr("final", {"confirm": 1, "confirm_baselines": 2})
    assert set(pick_rule.confirmed_scores(study)) == {0, 1, 2}
    said = pick_rule.verdict(study)
    assert (said.baseline, said.pick) == (2, 2)


def test_where_no_baseline_learned_the_best_one_by_search_score_is_confirmed_beside_a_learner():
    """QNLI at 0.01% (2026-12-06): a proposal learned (0.622) and every baseline's single score was
    within noise of the constant predictor's 0.508 (LoRA r=1 on q, v of the top layer 0.548, 0.004
    short): the best of them by search score is confirmed all the same, so the pick is compared
    with it, paired. Where nothing learned at all, nothing is confirmed."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    def study_of(trials):
        study = optuna.create_study(directions=["maximize", "minimize"])
        for score, kind, learned in trials:
            attrs = {"preset": kind} if kind == "prompt_tuning" else {"baseline": kind} if kind != "searched" else {}
            study.add_trial(
                create_trial(
                    values=[score, 1920.0],
                    params={"x": 0.5},
                    distributions={"x": FloatDistribution(0, 1)},
                    user_attrs={**attrs, "score_se": 0.022, "did_not_learn": not learned},
                )
            )
        return study

    study = study_of(
        [
            (0.514, "head_only", False),
            (0.622, "searched", True),
            (0.548, "lora_qv_r1_top1", False),
            (0.540, "prompt_tuning", False),
            (0.596, "searched", True),
            (0.502, "searched", False),
        ]
    )
    assert [t.number for t in pick_rule.baselines_to_confirm(study, 3)] == [2]
    assert [t.number for t in pick_rule.candidates(study, 3, 3)] == [1, 4, 2]
    assert pick_rule.baselines_to_confirm(study, 0) == [] and pick_rule.candidates(study, 0, 3) == []
    study.set_user_attr("final", {"confirm": 3, "confirm_baselines": 3})
    for n, scores in ((1, [0.622, 0.592, 0.608]), (4, [0.596, 0.578, 0.592]), (2, [0.548, 0.541, 0.546])):
        study.set_user_attr(f"confirm:{n}", scores)
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.beaten) == (1, 2, True)
    assert (
        "beats the best baseline (lora_qv_r1_top1, whose search score was within noise of the trivial "
        "baseline) beyond noise"
    ) in said.line

    nothing = study_of([(0.514, "head_only", False), (0.502, "searched", False)])
    assert pick_rule.baselines_to_confirm(nothing, 3) == [] and pick_rule.candidates(nothing, 3, 3) == []


def confirmed_study(storage: str | None = None) -> optuna.Study:
    """Trials 0 (the lucky draw: 0.9, 100 parameters), 1 (steady: 0.8, 200, off the front) and 2
    (small: 0.7, 50); ``final.confirm: 2`` re-scored 0 (mean 0.6333) and 1 (mean 0.8267, the pick,
    re-evaluated on test as the search does)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(study_name="confirmed", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    for score, params in ((0.9, 100.0), (0.8, 200.0), (0.7, 50.0)):
        study.add_trial(
            create_trial(values=[score, params], params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)})
        )
    study.set_user_attr("final", {"confirm": 2})
    study.set_user_attr("confirm:0", [0.9, 0.5, 0.5])
    study.set_user_attr("confirm:1", [0.8, 0.85, 0.83])
    study.set_user_attr("final:1", {"mean": 0.81, "std": 0.01, "scores": [0.8, 0.82], "seeds": 2})
    return study


def test_export_chooses_a_confirmed_trial_off_the_front():
    """Confirmation may prefer a trial its single score put off the front; export follows it."""
    study = confirmed_study()
    lucky, steady, small = study.trials
    assert steady.number not in {t.number for t in study.best_trials}  # dominated by the lucky draw
    assert choose(study).number == steady.number
    assert choose(study, budget=150).number == small.number  # the steady one is over it; the lucky one's mean 0.63
    from petl_nas.deploy.export import front_table

    listed = front_table(study).splitlines()  # export --list shows the candidates and their means
    assert any(
        line.startswith(f"{steady.number:>5}") and line.endswith("confirmed: mean 0.8267 over 3 seeds, off the front")
        for line in listed
    )
    assert any(
        line.startswith(f"{lucky.number:>5}") and line.endswith("confirmed: mean 0.6333 over 3 seeds")
        for line in listed
    )


def test_the_summary_shows_confirmed_means_and_keeps_an_off_front_trial_off_the_front():
    """The search's summary gives a confirmed trial the mean export ranks it by, in export --list's
    words, and lists a confirmed trial its single score left off the front in its own section (it
    was listed as a front member, with its single score only)."""
    from petl_nas.deploy.export import front_table
    from petl_nas.search.driver import summarize
    from petl_nas.study.experiment import Experiment

    study = confirmed_study()
    summary = summarize(study, Experiment(), None, 10_000)
    assert [r["number"] for r in summary.front] == [2, 0] and [r["number"] for r in summary.confirmed] == [1]
    lines = summary.table().splitlines()
    section = lines.index("confirmed by final.confirm, off the front (export's candidates too, by their mean):")
    rows = {int(line.split()[0]): (i, line) for i, line in enumerate(lines) if line[:5].strip().isdigit()}
    assert rows[0][0] < section < rows[1][0]
    assert rows[0][1].endswith("  confirmed 0.6333 (3 seeds)")
    assert rows[1][1].endswith("  confirmed 0.8267 (3 seeds), off the front") and "0.8100 ± 0.0100" in rows[1][1]
    assert not rows[2][1].endswith("seeds)")
    listed = {int(line.split()[0]): line for line in front_table(study).splitlines()[1:]}  # export --list's mean
    assert all(
        listed[n].split("confirmed: mean ")[1][:6] == line.split("confirmed ")[1][:6]
        for n, (_, line) in rows.items()
        if n != 2
    )


def test_export_follows_the_current_confirm_not_an_earlier_runs():
    """A search resumed with confirm: 1 after confirm: 2 confirmed (and re-evaluated) its top trial
    only; the scores the earlier run stored for the second are not its pick. A trial it did not
    confirm may show a single score above the pick's mean: best is still the search's pick."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    for score, params in ((0.9, 100.0), (0.85, 80.0), (0.8, 50.0)):
        study.add_trial(
            create_trial(values=[score, params], params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)})
        )
    top, second, third = study.trials
    study.set_user_attr("final", {"confirm": 2})
    study.set_user_attr(f"confirm:{top.number}", [0.9, 0.7, 0.7])
    study.set_user_attr(f"confirm:{second.number}", [0.85, 0.84, 0.86])
    assert choose(study).number == second.number
    study.set_user_attr("final", {"confirm": 1})  # resumed: only the top trial confirmed
    assert pick_rule.confirmed_now(study) == {top.number}
    assert choose(study).number == top.number  # its mean 0.767 < third's single 0.8
    assert choose(study, pick="smallest-within=5").number == third.number  # 0.8 is within 5 of 0.767


def test_confirm_in_files():
    from petl_nas import ConfigError
    from petl_nas.study.experiment import Experiment

    assert Experiment.from_dict({"final": {"confirm": 3}}).final.confirm == 3
    assert Experiment().final.confirm == 3 and Experiment().final.confirm_baselines == 3
    with pytest.raises(ConfigError, match="confirm_baselines"):
        Experiment.from_dict({"final": {"confirm_baselines": 0}}, "e.yaml")
    with pytest.raises(ConfigError, match="confirm_seeds"):
        Experiment.from_dict({"final": {"confirm": 3, "confirm_seeds": 0}}, "e.yaml")


@pytest.mark.parametrize("score, evals", [("best", 2), ("last", 0)])
@pytest.mark.slow
def test_confirmation_runs_are_scored_as_the_search_scored(tmp_path, monkeypatch, score, evals):
    """Under score: best a trial's score is its best evaluation: its confirmation runs evaluate as
    often as it did, or their "best" would be their last and their mean would mix two rules."""
    from petl_nas.training.loop import Recipe

    exp = experiment(
        tmp_path, trials=3, presets=[], fidelity=dataclasses.replace(experiment(tmp_path).fidelity, score=score)
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    seen = []
    monkeypatch.setattr(
        worker, "run_trial", lambda spec, **kw: seen.append(spec.recipe["evals_per_epoch"]) or TrialResult(score=0.5)
    )
    confirmed = dataclasses.replace(exp, final=FinalEval(seeds=0, confirm=1, confirm_seeds=1, baselines=False))
    confirm.confirm(study, confirmed, Recipe(evals_per_epoch=2), printer=lambda *a: None)
    assert seen == [evals]


def test_trials_that_did_not_learn_are_never_confirmation_candidates():
    """`candidates`: the top N by search score among completed trials that learned, not the top N."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from petl_nas.study import pick as pick_rule

    study = optuna.create_study(directions=["maximize", "minimize"])
    for score, dnl in ((0.9, True), (0.8, False), (0.7, False), (0.6, False)):
        study.add_trial(
            create_trial(
                values=[score, 10.0],
                params={"x": 0.5},
                distributions={"x": FloatDistribution(0, 1)},
                user_attrs={"did_not_learn": True} if dnl else {},
            )
        )
    assert [t.number for t in pick_rule.candidates(study, 2)] == [1, 2]


def _verdict_study(scores: dict) -> optuna.Study:
    """Trials of ``{(name, params, kind): confirmed scores}`` (kind: preset, baseline or searched),
    all confirmed (``final.confirm`` covers them)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    for (name, params, kind), s in scores.items():
        attrs = {"preset": name} if kind == "preset" else {"baseline": name} if kind == "baseline" else {}
        study.add_trial(
            create_trial(
                values=[s[0], float(params)],
                params={"x": 0.5},
                user_attrs=attrs,
                distributions={"x": FloatDistribution(0, 1)},
            )
        )
    study.set_user_attr("final", {"confirm": len(scores)})
    for t, s in zip(study.trials, scores.values()):
        study.set_user_attr(f"confirm:{t.number}", s)
    return study


def test_when_nothing_beats_the_best_baseline_the_pick_is_that_baseline():
    """A searched trial 0.4 points above LoRA on the mean, but not on every seed, does not beat it:
    the pick is LoRA itself, so the default export never trails the best baseline (ties lost on
    SST-2 test, experiments/trials_that_rank, experiments/rates). The line names the best confirmed
    mean (`--pick best-mean`) and the smallest within noise of it (`--pick smallest-within-noise`);
    a searched trial that trails the best beyond noise is never that, however small."""
    study = _verdict_study(
        {
            ("big", 9000, "searched"): [0.830, 0.820, 0.834],
            ("lora", 5000, "preset"): [0.826, 0.824, 0.822],
            ("small", 3000, "searched"): [0.828, 0.822, 0.826],
            ("tiny", 500, "searched"): [0.800, 0.790, 0.802],
        }
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.beaten, said.smallest, said.best) == (1, 1, False, 2, 0)
    assert said.line == (
        "no searched configuration beats the best baseline (lora, mean 0.8240) beyond noise on "
        "search-dev: the pick is that baseline, trial 1 (lora, 5,000 deployable parameters); the best "
        "confirmed mean, trial 0 (9,000 deployable parameters) at 0.8280, is within noise of it "
        "(export --pick best-mean); the smallest within noise of the best is trial 2 (3,000 "
        "deployable parameters) (export --pick smallest-within-noise)"
    )
    assert choose(study).number == 1  # export's default follows it
    assert choose(study, pick="best-mean").number == 0
    assert choose(study, pick="smallest-within-noise").number == 2
    assert choose(study, pick="smallest-within=0.1").number == 0  # within 0.1 points of 0.828: itself alone
    with pytest.raises(ConfigError, match="trial 0, the best confirmed mean, is over --budget"):
        choose(study, budget=8000, pick="best-mean")
    with pytest.raises(ConfigError, match="trial 2, the smallest within noise, is over --budget"):
        choose(study, budget=2000, pick="smallest-within-noise")


def test_the_line_names_no_smaller_configuration_when_the_best_is_the_smallest_within_noise():
    study = _verdict_study(
        {("lora", 5000, "preset"): [0.826, 0.824, 0.822], ("big", 9000, "searched"): [0.800, 0.790, 0.802]}
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.smallest, said.best) == (0, 0, 0)
    assert said.line.endswith("the pick is that baseline, trial 0 (lora, 5,000 deployable parameters)")


def test_smallest_within_noise_needs_confirmed_trials():
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(create_trial(values=[0.8, 10.0], params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}))
    with pytest.raises(ConfigError, match="confirmed no trial over extra seeds"):
        choose(study, pick="smallest-within-noise")


def test_a_searched_configuration_that_beats_the_best_baseline_on_every_seed_is_the_pick():
    study = _verdict_study(
        {
            ("big", 9000, "searched"): [0.850, 0.845, 0.852],
            ("lora_all_r8", 5000, "baseline"): [0.826, 0.824, 0.822],
            ("small", 3000, "searched"): [0.828, 0.818, 0.826],
        }
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.beaten) == (0, 1, True)
    assert "beats the best baseline (lora_all_r8) beyond noise" in said.line
    assert choose(study).number == 0


def test_the_best_baseline_is_confirmed_beside_the_top_trials():
    study = _verdict_study(
        {
            ("a", 9000, "searched"): [0.9],
            ("b", 8000, "searched"): [0.88],
            ("lora", 5000, "preset"): [0.85],
            ("bitfit", 100, "preset"): [0.80],
        }
    )
    assert [t.number for t in pick_rule.candidates(study, 2)] == [0, 1, 2]
    assert [t.number for t in pick_rule.candidates(study, 3)] == [0, 1, 2]  # already among them
    assert pick_rule.candidates(study, 0) == []


def test_beyond_noise_is_the_mean_paired_difference_above_twice_its_standard_error():
    base = [0.80, 0.81, 0.82]
    assert pick_rule.beyond_noise([b + d for b, d in zip(base, (0.01, 0.02, 0.035))], base)  # 0.0217 > 0.0145
    assert not pick_rule.beyond_noise([b + d for b, d in zip(base, (0.00, 0.02, 0.035))], base)  # 0.0183 < 0.0202
    assert pick_rule.beyond_noise([b + 0.001 for b in base], base)  # the same gain on every seed
    assert not pick_rule.beyond_noise([0.9], [0.8])  # one seed tells nothing apart
    assert not pick_rule.beyond_noise(base, base)


def test_a_gain_on_every_seed_but_on_two_rows_is_not_beyond_noise_over_the_rows():
    """500 rows; the small configuration is wrong on 2 rows the other gets right, on all 3 seeds
    (each seed its own extra errors): 0.4 points on every seed is beyond noise over seeds, and not
    over the rows, where those 2 rows are a draw. Wrong on 40 rows, it is beyond both."""
    from petl_nas.tasks.significance import row_gain

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 500)

    def runs(wrong: int) -> list:
        out = []
        for _ in range(3):
            p = labels.copy()
            p[rng.choice(np.arange(100, 500), 60, replace=False)] ^= 1  # each seed's own errors
            p[:wrong] ^= 1  # the same rows, every seed
            out.append(p)
        return out

    def scored(runs_: list) -> list:
        return [float(np.mean(p == labels)) for p in runs_]

    for wrong, over_rows in ((2, False), (40, True)):
        big, small = runs(0), runs(wrong)
        assert pick_rule.beyond_noise(scored(big), scored(small))  # over seeds alone
        gain, se = row_gain(big, small, labels, "accuracy")
        assert gain == pytest.approx(np.mean(scored(big)) - np.mean(scored(small)))
        assert (
            pick_rule.beyond_noise(scored(big), scored(small), pick_rule.Rows(big, small, labels, "accuracy"))
            is over_rows
        )
    same = runs(0)
    assert row_gain(same, same, labels, "accuracy") == (0.0, 0.0)


def test_rows_round_trip_through_their_text():
    from petl_nas.tasks.significance import decode_rows, encode_rows

    values = np.array([0, 1, 2, 1, 0.123456, -3.5])
    assert np.allclose(decode_rows(encode_rows(values)), values.astype(np.float32))
    assert decode_rows(encode_rows([1, 0, 1])).tolist() == [1.0, 0.0, 1.0]


@pytest.mark.slow
def test_confirmation_keeps_every_runs_rows_and_they_score_as_the_run_did(tmp_path):
    """Real tiny runs: each confirmed trial keeps one per-row prediction array per seed (its own
    trial's first), and the study its search-dev labels; scoring the rows against the labels gives
    each run's score exactly, so the bootstrap resamples what the runs measured."""
    from petl_nas.study.records import StoredTrial
    from petl_nas.tasks.metrics import compute_metrics
    from petl_nas.tasks.significance import decode_rows

    exp = experiment(
        tmp_path,
        trials=4,
        final=FinalEval(
            seeds=1,
            epochs=1,
            max_front=1,
            presets="none",
            confirm=2,
            confirm_seeds=2,
            confirm_baselines=1,
            baselines=False,
        ),
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    labels = decode_rows(study.user_attrs["search_dev_labels"])
    assert len(labels) == exp.fidelity.search_dev
    confirmed = pick_rule.confirmed_scores(study)
    assert len(confirmed) >= 2
    for n, scores in confirmed.items():
        rows = study.user_attrs[f"confirm_rows:{n}"]
        assert len(rows) == len(scores) == 3
        assert rows[0] == StoredTrial.of(study.trials[n]).rows  # the trial's own run
        for text, score in zip(rows, scores):
            assert compute_metrics(["accuracy"], decode_rows(text), labels)["accuracy"] == pytest.approx(score)


def test_the_verdict_bounds_a_win_over_the_rows_where_the_study_kept_them():
    """A searched configuration right on 2 more of 500 rows than the baseline on every seed beats it
    over seeds alone (a study without rows); with the rows kept it does not, and the line says so."""
    from petl_nas.tasks.significance import encode_rows

    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, 500)
    runs = {"searched": [], "baseline": []}
    for _ in range(3):
        base = labels.copy()
        base[rng.choice(np.arange(100, 500), 60, replace=False)] ^= 1
        base[:2] ^= 1  # the baseline misses 2 rows the other gets
        runs["baseline"].append(base)
        runs["searched"].append(np.where(np.arange(500) < 2, labels, base))
    scores = {k: [float(np.mean(p == labels)) for p in v] for k, v in runs.items()}
    study = _verdict_study(
        {("searched", 900, "searched"): scores["searched"], ("lora", 5000, "preset"): scores["baseline"]}
    )
    assert pick_rule.verdict(study).beaten  # no rows: the seeds decide
    study.set_user_attr("metric", "accuracy")
    study.set_user_attr("search_dev_labels", encode_rows(labels))
    for n, kind in enumerate(("searched", "baseline")):
        study.set_user_attr(f"confirm_rows:{n}", [encode_rows(p) for p in runs[kind]])
    said = pick_rule.verdict(study)
    assert not said.beaten and said.pick == 1 and said.line.startswith("no searched configuration beats")


def _with_reference(study: optuna.Study, name: str = "lora") -> optuna.Study:
    study.set_user_attr("final", {**study.user_attrs["final"], "reference": name})
    return study


def test_a_larger_pick_that_does_not_beat_the_reference_gives_way_to_it():
    """SST-2 at 0.5% (b68129e): the parallel adapter (113,040) was the best baseline by 2.2 points of
    one search score over LoRA r=8 (73,728) and tied it on test. Within noise of the reference
    over seeds, it gives way to it; a study from before ``final.reference`` keeps its pick."""
    study = _with_reference(
        _verdict_study(
            {
                ("parallel_adapter", 113040, "preset"): [0.854, 0.832, 0.838],
                ("lora", 73728, "preset"): [0.832, 0.828, 0.836],
                ("big", 113315, "searched"): [0.848, 0.826, 0.852],
            }
        )
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.reference, said.beaten, said.best) == (1, 0, 1, False, 2)
    assert said.line.startswith(
        "no searched configuration beats the best baseline (parallel_adapter, mean 0.8413) beyond noise on search-dev: "
        "that baseline, trial 0 (parallel_adapter, 113,040 deployable parameters), holds more deployable parameters "
        "than the reference (lora, mean 0.8320) and does not beat it beyond noise: the pick is the reference, trial 1 "
        "(lora, 73,728 deployable parameters); the best confirmed mean, trial 2 (113,315 deployable parameters) at "
        "0.8420, is within noise of the best baseline (export --pick best-mean)"
    )
    assert choose(study).number == 1
    study.set_user_attr("final", {"confirm": 3})  # no reference: read as it ran
    assert pick_rule.verdict(study).pick == 0 and pick_rule.verdict(study).reference is None


@pytest.mark.parametrize(
    "scores, pick",
    [
        (
            {
                ("parallel_adapter", 113040, "preset"): [0.854, 0.852, 0.856],  # beats it on every seed
                ("lora", 73728, "preset"): [0.832, 0.828, 0.836],
            },
            0,
        ),
        (
            {
                ("compacter", 24368, "preset"): [0.834, 0.833, 0.836],  # smaller: never replaced
                ("lora", 73728, "preset"): [0.832, 0.828, 0.836],
            },
            0,
        ),
    ],
)
def test_a_pick_that_beats_the_reference_or_is_smaller_keeps_its_place(scores, pick):
    said = pick_rule.verdict(_with_reference(_verdict_study(scores)))
    assert (said.pick, said.reference) == (pick, 1) and "the reference" not in said.line


def test_a_searched_winner_larger_than_the_reference_must_beat_it_too():
    """A searched trial that beats the best baseline on every seed by 2 points, but not the
    reference, whose seeds spread wider (0.78-0.86): the reference is the pick."""
    study = _with_reference(
        _verdict_study(
            {
                ("big", 90000, "searched"): [0.85, 0.85, 0.85],
                ("lora_all_r2", 82944, "baseline"): [0.83, 0.83, 0.83],
                ("lora", 73728, "preset"): [0.78, 0.86, 0.82],
            }
        )
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.beaten) == (2, 1, True)
    assert said.line == (
        "trial 0 beats the best baseline (lora_all_r2) beyond noise on search-dev (0.8500 against "
        "0.8300), but holds more deployable parameters than the reference (lora, mean 0.8200) and "
        "does not beat it beyond noise: the pick is the reference, trial 2 (lora, 73,728 deployable "
        "parameters)"
    )
    assert choose(study).number == 2


def test_the_reference_is_confirmed_whatever_its_rank_if_it_learned():
    study = _baseline_study(
        [(0.84, 0.01, "baseline"), (0.90, 0.01, "searched"), (0.85, 0.01, "preset"), (0.78, 0.01, "preset")]
    )
    assert [t.number for t in pick_rule.candidates(study, 1, 1, "p3")] == [1, 2, 3]
    assert [t.number for t in pick_rule.candidates(study, 1, 1, "p2")] == [1, 2]  # already among them
    assert [t.number for t in pick_rule.candidates(study, 1, 1, None)] == [1, 2]
    assert pick_rule.candidates(study, 0, 1, "p3") == []
    study.set_user_attr("final", {"confirm": 1, "confirm_baselines": 1, "reference": "p3"})
    study.set_user_attr("confirm:3", [0.78, 0.80, 0.79])
    assert 3 in pick_rule.confirmed_scores(study)
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study.add_trial(
        create_trial(
            values=[0.7, 10.0],
            params={"x": 0.5},
            distributions={"x": FloatDistribution(0, 1)},
            user_attrs={"preset": "p4", "did_not_learn": True},
        )
    )
    assert pick_rule.reference_trial(study, "p4") is None


def test_reference_names_a_preset():
    assert FinalEval(reference=None).reference is None and FinalEval().reference == "lora"
    with pytest.raises(ConfigError, match=r"final: reference: expected one of .*lora.* or null, got 'lorra'"):
        FinalEval(reference="lorra")


def test_the_reference_never_replaces_a_pick_where_the_best_confirmed_mean_beats_it():
    """The parallel adapter (the best baseline) within noise of LoRA r=8, but a searched trial (not
    beating the parallel adapter beyond noise) beats LoRA r=8 on every seed: deploying LoRA r=8 would
    trail the best confirmed mean beyond noise, so the best baseline stays the pick."""
    study = _with_reference(
        _verdict_study(
            {
                ("parallel_adapter", 113040, "preset"): [0.860, 0.826, 0.846],
                ("lora", 73728, "preset"): [0.832, 0.828, 0.836],
                ("big", 113315, "searched"): [0.852, 0.848, 0.856],
            }
        )
    )
    said = pick_rule.verdict(study)
    assert (said.pick, said.baseline, said.best, said.beaten) == (0, 0, 2, False)
    assert "the reference" not in said.line
