"""Typed records: what a worker returns (`TrialResult`) survives every way it travels (plain values,
JSON, Ray's report, a stored trial), a study written in an old attribute layout reads as it did
through `StoredTrial`, and every run of an experiment is built by one builder (`specs`)."""

from __future__ import annotations

import dataclasses
import json

import optuna
import pytest
from conftest import TINY_BACKBONE, tiny_experiment
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from petl_nas.search.executors import Recorder
from petl_nas.study.records import INVALID, StoredTrial, load_study, stored_trials, trial_config
from petl_nas.study.results import STORED, TrialResult
from petl_nas.study.storage import LOST

LORA = {"modules": [{"form": "lora", "position": "attn", "size": 4}], "pooling": "auto"}


@pytest.fixture(scope="module")
def result() -> TrialResult:
    from petl_nas.search.worker import TrialSpec, run_trial

    return run_trial(
        TrialSpec(
            backbone=TINY_BACKBONE,
            task="demo_sentiment",
            config=LORA,
            k=64,
            search_dev=32,
            recipe={"lr": 3e-3, "epochs": 1, "batch_size": 16, "max_length": 16},
        )
    )


def test_a_trial_result_travels_as_plain_values(result):
    assert result.metric == "accuracy" and result.history and result.latency_ms > 0
    assert TrialResult.from_dict(result.to_dict()) == result
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result  # Optuna stores JSON
    assert "frozen" not in result.to_dict() and "node" not in result.to_dict()  # where-present: absent
    # Ray's closing report: no history, Tune's own keys beside the result's, the node added
    reported = {
        **{k: v for k, v in result.to_dict().items() if k != "history"},
        "training_iteration": 1,
        "final": True,
        "node": "host/abcd1234",
    }
    assert TrialResult.from_dict(reported) == dataclasses.replace(result, history=[], node="host/abcd1234")


def test_a_trial_result_reads_back_from_its_stored_trial(result, tmp_path):
    """The Recorder writes the result's attributes; `StoredTrial` reads the same values back."""
    from petl_nas.core.tiny import tiny_backbone
    from petl_nas.search.study import TrialSource
    from petl_nas.study.space import SearchSpace

    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=url, study_name="s", directions=["maximize", "minimize"])
    source = TrialSource(study, SearchSpace.load("small"), tiny_backbone(vocab_size=50).config, budget=None, n_layers=2)
    p = source.next()
    Recorder(source).complete(p, result)
    (trial,) = load_study(url, "s").trials
    assert trial.state == TrialState.COMPLETE and trial.values[0] == result.score
    assert {k: trial.user_attrs[k] for k in result.attributes()} == result.attributes()
    assert set(result.attributes()) <= set(STORED) and "history" not in trial.user_attrs
    stored = StoredTrial.of(trial)
    shared = [f.name for f in dataclasses.fields(StoredTrial) if f.name in STORED]
    assert len(shared) >= 8 and {n: getattr(stored, n) for n in shared} == {n: getattr(result, n) for n in shared}
    assert (stored.deployable, stored.lr, stored.config(resolved=False)) == (p.deployable, p.lr, p.config)
    assert stored.did_not_learn is False and stored.failure is None


def test_a_study_in_the_old_attribute_layout_reads_as_it_did(tmp_path):
    """Attributes as the first versions wrote them (no standard errors, pooling, costs, config text,
    did_not_learn, fail_kind or percentages): every reader takes the value it always gave them."""
    from petl_nas.dashboards.view import study_view
    from petl_nas.deploy.export import choose, front_table, record
    from petl_nas.search.study import failure_counts, is_trained, state_counts
    from petl_nas.study.fronts import group_of, learned_trials, source_of

    url = f"sqlite:///{tmp_path}/old.db"
    study = optuna.create_study(storage=url, study_name="old", directions=["maximize", "minimize"])
    for key, value in {
        "backbone": json.dumps("b"),
        "task": "sst2",
        "metric": "accuracy",
        "backbone_params": 10_000,
        "final": {"seeds": 3, "epochs": 10.0, "k": -1},
    }.items():
        study.set_user_attr(key, value)
    lr = {"lr": FloatDistribution(1e-4, 1e-2)}
    for values, attrs in [
        ([0.71, 300], {"preset": "lora"}),
        ([0.75, 120], {"pooling": "mean"}),
        ([0.70, 200], {"baseline": "lora_r4"}),
    ]:  # a sweep point, by its old name
        study.add_trial(
            create_trial(
                params={"lr": 1e-3},
                distributions=lr,
                values=values,
                user_attrs={
                    "petl_config": LORA,
                    "deployable": values[1],
                    "trainable": values[1] + 2,
                    "recipe": {"lr": 1e-3},
                    **attrs,
                },
            )
        )
    for state, attrs in [
        (TrialState.FAIL, {"fail_reason": "invalid configuration: no module"}),
        (TrialState.FAIL, {}),  # failed as lost
        (TrialState.PRUNED, {"pruned_reason": "non-finite loss: nan"}),
        (TrialState.PRUNED, {"rejected": "over_budget"}),
    ]:
        study.add_trial(create_trial(state=state, params={"lr": 1e-3}, distributions=lr, user_attrs=attrs))
    study.set_user_attr("final:1", {"mean": 0.74, "std": 0.01, "scores": [0.73, 0.74, 0.75]})

    lora, searched, sweep, invalid, lost, nan, over = stored_trials(study)
    assert (searched.score_se, searched.latency_ms, searched.config_text, searched.pct_of_backbone) == (None,) * 4
    assert (searched.did_not_learn, searched.final["mean"], lora.final, lora.confirmed) == (False, 0.74, None, None)
    assert [t.failure for t in (invalid, lost, nan, over)] == [INVALID, LOST, "non-finite loss", None]
    assert failure_counts(study) == {INVALID: 1, LOST: 1, "non-finite loss": 1}
    assert state_counts(study)["rejected"] == 1 and [is_trained(t) for t in study.trials][3:] == [
        False,
        False,
        True,
        False,
    ]
    assert [group_of(t) for t in study.trials[:3]] == ["preset", "searched", "sweep"] and sweep.sweep == "lora_r4"
    assert [source_of(t) for t in study.trials[:3]] == ["lora", "-", "lora_r4"] and len(learned_trials(study)) == 3
    assert trial_config(study.trials[1])["pooling"] == "mean" and trial_config(study.trials[0])["pooling"] == "auto"

    best = choose(study)
    rec = record(study, best, url)
    assert best.number == 1 and rec.counts == {
        "deployable": 120,
        "trainable": 122,
        "pct_of_backbone": None,
        "backbone": 10_000,
    }
    assert (rec.provenance["source"], rec.provenance["test_mean"], "costs" in rec.provenance) == (
        "searched",
        0.74,
        False,
    )
    assert rec.petl_config["pooling"] == "mean" and rec.recipe["lr"] == 1e-3
    assert front_table(study).splitlines()[1].split()[:3] == ["1", "-", "0.7500"]
    view = study_view(study, url)
    assert [(p.number, p.se, p.costs, p.lr, p.did_not_learn) for p in view.points] == [
        (0, None, {}, 1e-3, False),
        (1, None, {}, 1e-3, False),
        (2, None, {}, 1e-3, False),
    ]
    assert [p.number for p in view.sweep] == [2]


def test_every_run_of_an_experiment_is_built_by_one_builder():
    """A trial, a calibration run, a confirmation and a final run differ only where their builder's
    argument says: the final one on the test split, by its last score, with final.k rows."""
    from petl_nas.search.specs import final_recipe, trial_recipe, trial_spec
    from petl_nas.study.experiment import Fidelity, FinalEval
    from petl_nas.training.loop import Recipe

    exp = tiny_experiment(
        fidelity=Fidelity(
            length_buckets=0, k=80, epochs=2, batch_size=16, max_length=16, search_dev=32, score="best", max_steps=50
        ),
        final=FinalEval(seeds=2, epochs=5, k=None, max_steps=400, baselines=False),
    )
    recipe = trial_recipe(exp)
    assert recipe == Recipe(epochs=2, batch_size=16, max_length=16, evals_per_epoch=1, seed=exp.seed, max_steps=50)
    spec = trial_spec(exp, LORA, recipe.with_overrides(lr=1e-3), number=4)
    assert (spec.eval_split, spec.k, spec.search_dev, spec.score, spec.number) == ("search_dev", 80, 32, "best", 4)
    final = trial_spec(exp, LORA, final_recipe(exp, recipe, 1e-3, seed=1), number=4, final=True)
    assert (final.eval_split, final.k, final.score, final.search_dev) == ("test", None, "last", 32)
    assert Recipe(**final.recipe) == recipe.with_overrides(lr=1e-3, seed=1, epochs=5, max_steps=400, evals_per_epoch=0)
