"""A proposal over the budget is visibly "over budget" in the Optuna dashboard (a user attribute
beside its PRUNED state), and stays PRUNED with its violated constraint, as the sampler reads it."""

from __future__ import annotations

import optuna
from conftest import tiny_config
from optuna.trial import TrialState

from petl_nas import ModuleSpec, PetlConfig, count_parameters
from petl_nas.search.study import TrialSource
from petl_nas.study.space import SearchSpace


def test_a_proposal_over_the_budget_says_so_and_stays_pruned():
    model_config = tiny_config("bert")
    config = PetlConfig(modules=(ModuleSpec(form="lora", size=2),))
    n = count_parameters(model_config, config).deployable
    study = optuna.create_study(directions=["maximize", "minimize"])
    for _ in range(2):
        study.enqueue_trial({}, user_attrs={"petl_config": config.to_dict(), "recipe": {"lr": 1e-3}})
    source = TrialSource(study, SearchSpace.load("small"), model_config, budget=n - 1, n_layers=3)
    source.next()  # both over: rejected, then the sampler draws on
    over = [t for t in study.trials if t.number < 2]
    assert source.rejected >= 2
    assert all(t.state == TrialState.PRUNED and t.user_attrs["over_budget"] is True for t in over)
    assert all(t.constraints["budget"] == 1.0 for t in over)  # the sampler still learns from it
    drawn = [t for t in study.trials if t.number >= 2 and t.state != TrialState.PRUNED]
    assert all("over_budget" not in t.user_attrs for t in drawn)
