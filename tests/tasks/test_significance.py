"""Floors and error bars: trivial baselines, standard errors, "did not learn", dominance beyond noise,
and a search whose every trial is a constant predictor (the summary says so; nothing dominates)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from conftest import NO_RATES, TINY_BACKBONE

from petl_nas.search.driver import run_search, summarize
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval
from petl_nas.tasks import Split, get_task
from petl_nas.tasks.significance import (
    clearly_better,
    did_not_learn,
    has_error_bar,
    paired_difference,
    standard_error,
    trivial_baseline,
)


def splits(task, train_labels, dev_labels, dev_texts=None, test_labels=None):
    make = lambda labels, texts=None: Split((texts or [f"s{i}" for i in range(len(labels))],), np.asarray(labels))  # noqa: E731
    return SimpleNamespace(
        train=make(train_labels),
        search_dev=make(dev_labels, dev_texts),
        **({"test": make(test_labels)} if test_labels is not None else {}),
    )


def test_classification_baseline_is_the_best_constant_class():
    sst2 = get_task("sst2")  # accuracy: the majority class
    base = trivial_baseline(sst2, splits(sst2, [1, 1, 0], [1, 0, 0, 0]))
    assert base["score"] == 0.75 and base["what"] == "constant '0' (the best constant class)"
    by_f1 = get_task("mrpc").ranked_by("f1")  # F1 of the positive class: all-positive
    base = trivial_baseline(by_f1, splits(by_f1, [1, 1, 0], [1, 1, 0, 0, 0]))
    assert math.isclose(base["score"], 2 * 0.4 / 1.4) and "majority class" in base["what"] and "customary" not in base
    mrpc = get_task("mrpc")  # ranks by accuracy; F1 of the same predictor beside
    base = trivial_baseline(mrpc, splits(mrpc, [1, 1, 0], [1, 1, 0, 0, 0], test_labels=[1, 1, 1, 0]))
    assert (base["metric"], base["score"], base["what"], base["test_score"]) == (
        "accuracy",
        0.6,
        "constant '0' (the best constant class)",
        0.25,
    )
    assert base["customary"] == {"metric": "f1", "score": 0.0, "test_score": 0.0}
    # on the test split, reported beside test scores: the predictor chosen on search-dev, not test's best constant
    base = trivial_baseline(sst2, splits(sst2, [1, 1, 0], [1, 0, 0, 0], test_labels=[1, 1, 1, 0]))
    assert base["score"] == 0.75 and base["test_score"] == 0.25


def test_regression_and_generation_baselines():
    stsb = get_task("stsb")
    assert trivial_baseline(stsb, splits(stsb, [1.0, 2.0], [3.0, 4.0]))["score"] == 0.0
    copy = get_task("demo_copy")
    sources, targets = ["a b c d", "d e f g"], ["a b c d", "f e d c"]
    base = trivial_baseline(copy, splits(copy, np.array(["x"], dtype=object), np.array(targets, dtype=object), sources))
    half = copy.compute_metrics(sources, targets)[copy.main_metric]
    assert base["score"] == pytest.approx(half) and 0 < half < 100 and base["what"] == "copying the source"
    # a task whose targets are its sources: copying is the task, not a floor
    assert (
        trivial_baseline(copy, splits(copy, np.array(["x"], dtype=object), np.array(sources, dtype=object), sources))
        is None
    )


def test_standard_errors():
    sst2, cola = get_task("sst2"), get_task("cola")
    refs = np.array([1, 0] * 50)
    preds = refs.copy()
    preds[:20] = 1 - preds[:20]  # 80% right
    assert standard_error(sst2, preds, refs) == pytest.approx(math.sqrt(82 / 104 * 22 / 104 / 104))  # Agresti-Coull
    assert standard_error(sst2, preds, refs) == pytest.approx(math.sqrt(0.8 * 0.2 / 100), rel=0.01)  # ~ the binomial
    assert standard_error(sst2, refs, refs) == pytest.approx(math.sqrt(102 / 104 * 2 / 104 / 104))  # 1.0: not 0
    se = standard_error(cola, preds, refs)  # MCC: bootstrap, deterministic
    assert se == standard_error(cola, preds, refs) and 0.03 < se < 0.12
    big = np.tile(refs, 10), np.tile(preds, 10)
    assert standard_error(cola, big[1], big[0]) < se / 2  # ~1/sqrt(n)
    assert standard_error(get_task("demo_copy"), ["a"], ["a"]) is None
    assert not has_error_bar(get_task("demo_copy")) and has_error_bar(cola)  # what the search's lines say


def test_a_learner_is_beyond_noise_of_always_positive_by_what_mrpc_ranks_by_not_by_f1():
    """A pair task 68% positive, 400 search-dev rows: "always positive" scores F1 0.81. A predictor 5
    points more accurate with the same F1 (232 of 272 positives kept, 60 of 128 negatives found) is
    within noise of it by F1 and by GLUE's mean of F1 and accuracy, and beyond noise by accuracy,
    which MRPC ranks by; F1 is reported beside it."""
    mrpc = get_task("mrpc")
    refs = np.array([1] * 272 + [0] * 128)
    learner = np.array([1] * 232 + [0] * 40 + [1] * 68 + [0] * 60)
    base = trivial_baseline(mrpc, splits(mrpc, refs, refs))
    assert (base["metric"], base["score"], base["what"]) == ("accuracy", 0.68, "constant '1' (the majority class)")
    assert base["customary"]["metric"] == "f1" and base["customary"]["score"] == pytest.approx(0.8095, abs=1e-4)
    constant = mrpc.compute_metrics(np.ones(400, dtype=np.int64), refs)
    scores = mrpc.compute_metrics(learner, refs)
    assert (constant["accuracy"], scores["accuracy"]) == (0.68, 0.73)
    assert scores["f1"] == pytest.approx(constant["f1"], abs=0.002) and constant["f1"] > 0.80
    assert constant["f1_accuracy"] == pytest.approx((0.8095 + 0.68) / 2, abs=1e-4)
    learned = {}
    for metric in mrpc.metrics:
        ranked = mrpc.ranked_by(metric)
        se = standard_error(ranked, learner, refs)
        assert 0.015 < se < 0.025  # ~2 points on 400 rows, whichever metric
        learned[metric] = not did_not_learn(scores[metric], se, {"score": constant[metric]})
    assert learned == {"f1": False, "f1_accuracy": False, "accuracy": True}
    assert learned[mrpc.main_metric] and mrpc.customary_metric == "f1"


def test_noise_decides_learning_and_dominance():
    assert did_not_learn(0.80, 0.012, {"score": 0.7988})  # within 2 se of the floor
    assert not did_not_learn(0.83, 0.012, {"score": 0.7988})
    assert not clearly_better(0.81, 0.012, 0.80, 0.012)  # 1 point apart, se 1.2 each
    assert clearly_better(0.86, 0.012, 0.80, 0.012)
    assert paired_difference([0.8, 0.82, 0.81], [0.79, 0.80, 0.82]) == pytest.approx(
        {"mean": 0.0066666, "std": 0.0152753, "n": 3, "wins": 2}, rel=1e-3
    )


@pytest.mark.slow
def test_a_search_of_constant_predictors_says_so_and_nothing_dominates(tmp_path, monkeypatch):
    """One epoch of 160 demo rows at a tiny learning rate: no trial gets off the floor."""
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "still.yaml"
    space.write_text(
        (__import__("petl_nas.core.presets", fromlist=["space_dir"]).space_dir() / "small.yaml")
        .read_text()
        .replace("lr: {low: 3.0e-3, high: 3.0e-2, log: true}", "lr: 1.0e-7")
    )
    exp = Experiment(
        rates=NO_RATES,
        name="flat",
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        budget=None,
        space=str(space),
        trials=4,
        presets=["pfeiffer", "bitfit"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/s.db",
        fidelity=Fidelity(length_buckets=0, k=160, epochs=1, batch_size=32, max_length=24, search_dev=64),
        final=FinalEval(seeds=0, baselines=False),
    )
    printed = []
    summary = run_search(exp, printer=printed.append)
    study = optuna.load_study(study_name="flat", storage=exp.storage_url)
    assert summary.counts["complete"] == 4 and summary.did_not_learn == 4
    assert study.best_trials == [] and summary.front == []  # a constant predictor is on no front
    assert all(not r["dominates"] and not r["matches"] for r in summary.presets)
    assert all(t.user_attrs["did_not_learn"] for t in study.trials)

    def text(s) -> str:  # the summary wraps its lines at 120 characters: joined again
        return s.table().replace("\n  ", " ")

    assert "4 of 4 complete trials did not learn (within noise of the baseline)" in text(summary)
    joined = "\n".join(printed).replace("\n  ", " ").splitlines()  # lines wrapped at 120, joined
    assert any(line.endswith("; did not learn: within noise of it") for line in joined)
    without_se = dataclasses.replace(summary, presets=[{**r, "se": None} for r in summary.presets])
    assert "4 of 4 complete trials did not learn (no better than the baseline)" in text(without_se)  # generation
    assert "train longer (fidelity epochs, or fidelity: auto)" in text(summary) and "pooling: mean" in text(summary)
    assert "pooling" not in text(dataclasses.replace(summary, metric="rougeL"))  # no pooled head to check
    study.set_user_attr("fidelity_calibration", {"epochs": 2.0})  # as `fidelity: auto` records its choice
    assert "train longer (fidelity: auto chose 2 epochs; give fidelity epochs above that)" in text(
        summarize(study, exp, None, 10_000)
    )
    assert study.user_attrs["baseline"]["what"].startswith("constant")
    on_test = study.user_attrs["baseline"]["test_score"]  # shown beside the test column
    assert 0 < on_test < 1 and f"and {on_test:.4f} on the test split" in text(summary)


def test_every_seed_and_epoch_has_its_own_data_order():
    """Seeds are paired across configurations, so they must differ from each other in every epoch
    (with seed + epoch, seed k's epoch 1 was seed k+1's epoch 0: 9 of 10 orders shared)."""
    from petl_nas.training.loop import epoch_seed

    seeds = {(s, e): epoch_seed(s, e) for s in range(5) for e in range(10)}
    assert len(set(seeds.values())) == len(seeds)
    assert epoch_seed(3, 7) == epoch_seed(3, 7)  # reproducible


def test_one_seed_shows_no_spread():
    from petl_nas.tasks.significance import mean_std

    assert mean_std(0.7661, 0.0, 1) == "0.7661 (1 seed)"  # not "± 0.0000": nothing was measured
    assert mean_std(0.7913, 0.0049, 2) == "0.7913 ± 0.0049"
    one = paired_difference([0.55], [0.30])
    assert one["std"] is None and one["n"] == 1  # one difference has no spread either
    from petl_nas.search.driver import SearchSummary

    row = {
        "number": 3,
        "preset": "-",
        "score": 0.29,
        "se": 0.06,
        "test_mean": 0.55,
        "test_std": None,
        "test_n": 1,
        "paired": one,
        "dominates": [],
        "deployable": 65608,
        "pct": 0.29,
    }
    counts = {"complete": 1, "pruned": 0, "failed": 0, "rejected": 0}
    line = SearchSummary("s", "sqlite://", "pearson_spearman", None, counts, front=[row]).table().splitlines()[2]
    assert "0.5500 (1 seed)  +25.00 (1 seed)" in line and "head only" not in line
    rouge = SearchSummary(
        "s", "sqlite://", "rougeL", None, counts, front=[{**row, "paired": paired_difference([7.57], [0.0])}]
    )
    assert "+7.57 (1 seed)" in rouge.table().splitlines()[2]  # ROUGE is in points already: not ×100
    rouge.front[0]["se"] = None  # no standard error for ROUGE
    assert "a higher search score (this metric has no standard error here" in rouge.table()
    assert (
        "two standard errors" not in rouge.table()
        and "two standard errors"
        in SearchSummary("s", "sqlite://", "accuracy", None, counts, front=[row], reference="lora").table()
    )
    assert (
        "paired Δ"
        not in SearchSummary(
            "s", "sqlite://", "accuracy", None, counts, front=[{**row, "paired": None}], reference="lora"
        )
        .table()
        .split("\n", 3)[3]
    )  # no row has one
    title = SearchSummary("s", "sqlite://", "accuracy", 90_000, counts, front=[row]).table().splitlines()[0]
    assert title == "Pareto front of study 's' (accuracy vs deployable parameters, budget 90,000)"
    costs = [{**row, "costs": {"latency": 1.5, "memory": 30.0}}]  # the study's further objectives
    assert SearchSummary("s", "sqlite://", "accuracy", None, counts, front=costs).table().splitlines()[0] == (
        "Pareto front of study 's' (accuracy vs deployable parameters, latency and memory)"
    )
    probe = {**row, "number": 4, "deployable": 0, "pct": 0.0, "paired": None}
    line = SearchSummary("s", "sqlite://", "pearson_spearman", None, counts, front=[probe]).table().splitlines()[2]
    assert line.endswith("  -          head only (no PETL module)")  # a linear probe: say so (dominates -)


def test_a_preset_relates_to_the_others_alike_on_the_front_and_among_the_presets():
    """BitFit within noise of LoRA with half its parameters: "~lora" in both rows it has."""
    from optuna.distributions import FloatDistribution

    from petl_nas.search.driver import summarize

    study = optuna.create_study(directions=["maximize", "minimize"])
    for score, n, name in [(0.80, 1000, "lora"), (0.795, 500, "bitfit"), (0.70, 100, None)]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-3},
                distributions={"lr": FloatDistribution(1e-4, 1e-2)},
                values=[score, n],
                user_attrs={"deployable": n, "score_se": 0.01, **({"preset": name} if name else {})},
            )
        )
    summary = summarize(
        study, Experiment(rates=NO_RATES, name="r", backbone="x", task="demo_sentiment", budget=None), None, 100_000
    )
    on_front = next(r for r in summary.front if r["preset"] == "bitfit")
    among = next(r for r in summary.presets if r["preset"] == "bitfit")
    assert on_front["matches"] == among["matches"] == ["lora"]


def test_did_not_learn_is_two_standard_errors_above_the_floor():
    floor = {"score": 0.80}
    assert did_not_learn(0.815, 0.01, floor)  # 1.5 se above: within noise
    assert did_not_learn(0.8199, 0.01, floor)  # just under 2 se
    assert not did_not_learn(0.8201, 0.01, floor)  # just over 2 se


def test_a_tied_seed_is_not_a_win():
    """`paired_difference`'s ``wins`` counts the seeds where a beat b: a difference of exactly 0 is none."""
    d = paired_difference([0.8, 0.8, 0.9], [0.8, 0.7, 0.9])
    assert d["wins"] == 1 and d["n"] == 3


def test_a_tie_among_constant_classes_goes_to_the_majority_class():
    """`trivial_baseline`: when constant classes score alike on search-dev, the training majority is
    the predictor (so it is also the one scored on test)."""
    sst2 = get_task("sst2")
    make = lambda labels: Split(([f"s{i}" for i in range(len(labels))],), np.asarray(labels))  # noqa: E731
    splits = SimpleNamespace(train=make([1, 1, 0]), search_dev=make([0, 1]), test=make([1, 1, 1, 0]))
    base = trivial_baseline(sst2, splits)
    assert base["score"] == 0.5 and base["what"] == f"constant {sst2.labels[1]!r} (the majority class)"
    assert base["test_score"] == 0.75
