"""final.confirm: the pick is chosen by the mean over extra seeds on search-dev, never by test.

The search trains real tiny trials; only the confirmation runs are scripted, so that the trial
with the best single score does badly on its extra seeds and must lose the pick.
"""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from petl_nas import confirm, worker
from petl_nas.experiment import FinalEval
from petl_nas.export import choose
from petl_nas.search import run_search

from test_search import experiment


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_the_pick_is_the_best_mean_over_seeds_not_the_best_draw(tmp_path, monkeypatch):
    exp = experiment(tmp_path, trials=8)
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    first, second = confirm.candidates(study, 2)
    assert first.values[0] >= second.values[0]

    calls = []

    def scripted(spec, report=None, device=None):
        calls.append((spec.number, spec.recipe["seed"], spec.eval_split))
        return {"score": 0.0 if spec.number == first.number else 1.0}
    monkeypatch.setattr(worker, "run_trial", scripted)

    confirmed = dataclasses.replace(exp, final=FinalEval(seeds=1, epochs=1, max_front=1, presets="none",
                                                         confirm=2, confirm_seeds=2, baselines=False))
    lines = []
    run_search(confirmed, printer=lines.append)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    assert sorted(calls) == sorted((t.number, exp.seed + i, "search_dev") for t in (first, second) for i in (1, 2))
    assert study.user_attrs[f"confirm:{first.number}"] == [first.values[0], 0.0, 0.0]
    assert f"final:{second.number}" in study.user_attrs and f"final:{first.number}" not in study.user_attrs
    assert any(line.startswith(f"confirmed trial {second.number}") for line in lines)
    assert choose(study).number == second.number                # export reads the confirmed mean too
    n = len(calls)
    run_search(confirmed, printer=lambda *a: None)              # resumed: nothing confirmed twice
    assert len(calls) == n


def test_export_chooses_a_confirmed_trial_off_the_front():
    """Confirmation may prefer a trial its single score put off the front; export follows it."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    for score, params in ((0.9, 100.0), (0.8, 200.0), (0.7, 50.0)):
        study.add_trial(create_trial(values=[score, params], params={"x": 0.5},
                                     distributions={"x": FloatDistribution(0, 1)}))
    lucky, steady, small = study.trials
    assert steady.number not in {t.number for t in study.best_trials}    # dominated by the lucky draw
    study.set_user_attr(f"confirm:{lucky.number}", [0.9, 0.5, 0.5])
    study.set_user_attr(f"confirm:{steady.number}", [0.8, 0.85, 0.83])
    assert choose(study).number == steady.number
    assert choose(study, budget=150).number == small.number   # the steady one is over it; the lucky one's mean 0.63


def test_confirm_in_files():
    from petl_nas import ConfigError
    from petl_nas.experiment import Experiment

    assert Experiment.from_dict({"final": {"confirm": 3}}).final.confirm == 3
    assert Experiment().final.confirm == 0
    with pytest.raises(ConfigError, match="confirm_seeds"):
        Experiment.from_dict({"final": {"confirm": 3, "confirm_seeds": 0}}, "e.yaml")
