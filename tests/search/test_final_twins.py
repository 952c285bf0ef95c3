"""A trial or confirmation run that trains exactly as a final run is that final run: scored on the
test split once after its last step, and the final re-evaluation reads the score instead of
training the run again (`specs.final_twin`), to the bit; where the recipes differ, it trains."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from conftest import trained_runs
from test_search import experiment

from petl_nas.search import worker
from petl_nas.search.driver import run_search
from petl_nas.search.specs import final_recipe, final_twin, trial_recipe, trial_spec
from petl_nas.study.experiment import FinalEval
from petl_nas.study.records import StoredTrial


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def final_study(tmp_path, epochs: float):
    """Seed 0, 5-epoch trials, 2 candidates confirmed with 1 more seed, finals of 2 seeds at ``epochs``."""
    return experiment(
        tmp_path,
        seed=0,
        trials=3,
        presets=["lora"],
        final=FinalEval(
            seeds=2, epochs=epochs, max_front=2, presets="none", confirm=2, confirm_seeds=1, baselines=False
        ),
    )


@pytest.mark.slow
def test_final_runs_that_a_trial_and_its_confirmation_trained_are_read_to_the_bit(tmp_path, monkeypatch):
    exp = final_study(tmp_path, epochs=5)  # the trials' own length
    calls = trained_runs(monkeypatch)
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    finals = {int(k.split(":")[1]): v for k, v in study.user_attrs.items() if k.startswith("final:")}
    assert finals and not [c for c in calls if c.eval_split == "test"]  # no final run trained
    assert any("are read, not trained again" in line for line in lines)
    assert not [line for line in lines if line.endswith(" of 0 runs")]  # no count of nothing
    # each equals a final run trained afresh, in the precision the study resolved ``auto`` to (bf16
    # where the CPU computes it natively)
    recipe = dataclasses.replace(trial_recipe(exp), precision=study.user_attrs["fidelity"]["precision"])
    for number, final in finals.items():
        t = StoredTrial.of(study.trials[number], study.user_attrs)
        for seed in range(2):
            fresh = worker.run_trial(
                trial_spec(exp, t.petl_config, final_recipe(exp, recipe, t.lr, seed), number=number, final=True)
            )
            assert final["scores"][seed] == fresh.last_score
    assert "test_run" not in study.trials[next(iter(finals))].params  # a record, not a sampled value


@pytest.mark.slow
def test_trials_trained_through_ray_keep_their_metrics_and_are_their_final_runs(tmp_path):
    """Ray Tune flattens the nested dicts of a reported result: trials trained there had stored
    empty metrics and no test run, so the final re-evaluation trained their seed-0 runs again."""
    ray = pytest.importorskip("ray")
    exp = dataclasses.replace(final_study(tmp_path, epochs=5), executor="ray")
    lines = []
    try:
        run_search(exp, printer=lines.append)
    finally:
        ray.shutdown()
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    trained = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert trained and all(t.user_attrs["metrics"].get("accuracy") == t.values[0] for t in trained)
    assert all(t.user_attrs["test_run"]["recipe"]["seed"] == 0 for t in trained)
    finals = [k for k in study.user_attrs if k.startswith("final:")]
    said = next(line for line in lines if line.startswith("final: "))
    assert finals and f"{2 * len(finals)} of the {2 * len(finals)} runs are trials or confirmations" in said


@pytest.mark.slow
def test_a_final_recipe_other_than_the_trials_trains_its_runs(tmp_path, monkeypatch):
    exp = final_study(tmp_path, epochs=3)
    assert final_twin(exp, trial_recipe(exp).with_overrides(lr=1e-3)) is None
    calls = trained_runs(monkeypatch)
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    finals = [k for k in study.user_attrs if k.startswith("final:")]
    assert len([c for c in calls if c.eval_split == "test"]) == 2 * len(finals) > 0
    assert not any("test_run" in t.user_attrs for t in study.trials)


def test_only_a_run_at_a_final_seed_with_the_final_recipe_is_a_final_run(tmp_path):
    exp = final_study(tmp_path, epochs=5)
    recipe = trial_recipe(exp).with_overrides(lr=1e-3)
    assert final_twin(exp, recipe) == final_recipe(exp, recipe, 1e-3, 0)
    assert final_twin(exp, recipe.with_overrides(seed=2)) is None  # finals: seeds 0 and 1
    assert final_twin(exp, dataclasses.replace(recipe, evals_per_epoch=2)) is None
    assert final_twin(dataclasses.replace(exp, final=dataclasses.replace(exp.final, k=100)), recipe) is None
    assert final_twin(dataclasses.replace(exp, final=dataclasses.replace(exp.final, seeds=0)), recipe) is None
