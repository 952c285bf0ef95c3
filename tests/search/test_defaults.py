"""A new study's defaults are the measured ones: trials train to their end and evaluate once (no
scheduler judges them by how fast they learn), batches of similar lengths, bf16 where the device
computes it natively; a resumed study keeps the recipe it recorded."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from conftest import tiny_experiment

from petl_nas.search.specs import trial_recipe
from petl_nas.search.study import with_fidelity_resolved
from petl_nas.study.experiment import NEW_STUDY_LENGTH_BUCKETS, NEW_STUDY_PRECISION, Experiment, Fidelity


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_a_default_trial_trains_to_its_end_and_evaluates_once():
    exp = Experiment()
    assert exp.scheduler == "fifo" and exp.executor == "ray"
    assert trial_recipe(exp).evals_per_epoch == 0  # nothing reads an earlier score
    assert trial_recipe(dataclasses.replace(exp, scheduler="asha")).evals_per_epoch == 1


def test_length_buckets_auto_is_sixteen_for_a_new_study_and_as_recorded_for_a_resumed_one():
    attrs = {"fidelity": {"k": 1000, "length_buckets": "auto"}}
    assert with_fidelity_resolved(attrs, None)["fidelity"]["length_buckets"] == NEW_STUDY_LENGTH_BUCKETS == 16
    assert with_fidelity_resolved(attrs, {"length_buckets": 4})["fidelity"]["length_buckets"] == 4
    assert with_fidelity_resolved(attrs, {"k": 1000})["fidelity"]["length_buckets"] == 0  # before auto
    given = {"fidelity": {"length_buckets": 2}}
    assert with_fidelity_resolved(given, {"length_buckets": 4}) == given  # a number is taken as given


def test_precision_auto_is_native_for_a_new_study_and_as_recorded_for_a_resumed_one():
    attrs = {"fidelity": {"length_buckets": 0, "precision": "auto"}}
    assert with_fidelity_resolved(attrs, None)["fidelity"]["precision"] == NEW_STUDY_PRECISION == "native"
    assert with_fidelity_resolved(attrs, {"precision": "native"})["fidelity"]["precision"] == "native"
    assert with_fidelity_resolved(attrs, {"precision": "bf16"})["fidelity"]["precision"] == "bf16"
    assert with_fidelity_resolved(attrs, {"precision": "auto"})["fidelity"]["precision"] == "auto"  # before native
    assert with_fidelity_resolved(attrs, {"k": 1000})["fidelity"]["precision"] == "auto"
    given = {"fidelity": {"length_buckets": 0, "precision": "fp32"}}
    assert with_fidelity_resolved(given, None) == given  # a precision is taken as given


@pytest.mark.slow
def test_a_study_made_with_a_uniform_shuffle_resumes_with_it_and_a_new_one_buckets(tmp_path, monkeypatch):
    from petl_nas.search import executors
    from petl_nas.search.driver import run_search

    trained = []  # what each trial really trains with
    real = executors.run_trial
    monkeypatch.setattr(executors, "run_trial", lambda spec, **kw: trained.append(spec.recipe) or real(spec, **kw))

    fidelity = Fidelity(k=80, epochs=1, batch_size=16, max_length=16, search_dev=32)
    old = tiny_experiment(
        storage=f"sqlite:///{tmp_path}/old.db", fidelity=dataclasses.replace(fidelity, length_buckets=0)
    )
    run_search(old, printer=lambda *a: None)
    made = optuna.load_study(study_name=old.study_name, storage=old.storage_url)
    stored = {**made.user_attrs["fidelity"], "precision": "auto"}  # as made before native
    made.set_user_attr("fidelity", stored)
    resumed = dataclasses.replace(old, trials=3, fidelity=fidelity)  # auto
    assert resumed.fidelity.length_buckets == "auto" and resumed.fidelity.precision == "auto"
    run_search(resumed, printer=lambda *a: None)  # not refused as "other settings"
    study = optuna.load_study(study_name=old.study_name, storage=old.storage_url)
    assert study.user_attrs["fidelity"]["length_buckets"] == 0 and study.user_attrs["fidelity"]["precision"] == "auto"
    assert [(r["length_buckets"], r["precision"]) for r in trained[-1:]] == [(0, "auto")]
    run_search(dataclasses.replace(resumed, budget="10%"), force_new_study=True, printer=lambda *a: None)
    replaced = optuna.load_study(study_name=old.study_name, storage=old.storage_url).user_attrs["fidelity"]
    assert (replaced["length_buckets"], replaced["precision"]) == (16, "native")  # replaced: a new study's
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 3

    new = tiny_experiment(name="new", storage=f"sqlite:///{tmp_path}/new.db", fidelity=fidelity)
    run_search(new, printer=lambda *a: None)
    study = optuna.load_study(study_name=new.study_name, storage=new.storage_url)
    assert (
        study.user_attrs["fidelity"]["length_buckets"] == 16 and study.user_attrs["fidelity"]["precision"] == "native"
    )
    assert {(r["length_buckets"], r["precision"]) for r in trained[-2:]} == {(16, "native")}
    from petl_nas.deploy.export import record

    done = next(t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert record(study, done).recipe["precision"] == "native"  # export trains as the trials did


def test_a_study_that_ranked_by_f1_is_not_resumed_ranking_by_accuracy():
    """MRPC ranked by F1 before it ranked by accuracy: one objective must not hold both."""
    from petl_nas.search.study import changed_settings

    assert changed_settings({"task": "mrpc", "metric": "f1"}, {"task": "mrpc", "metric": "accuracy"}) == [
        "metric f1 (now accuracy)"
    ]
