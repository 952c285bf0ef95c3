"""Samplers and schedulers are name -> factory tables (`search.study.SAMPLERS`,
`search.executors.SCHEDULERS`): every name an experiment accepts builds, and the experiment accepts
no name the tables lack."""

from __future__ import annotations

import optuna
import pytest

from petl_nas import ConfigError
from petl_nas.search.executors import SCHEDULERS
from petl_nas.search.study import SAMPLERS, make_sampler
from petl_nas.study.experiment import Experiment


def test_every_sampler_name_builds_an_optuna_sampler_and_another_is_one_line():
    for name in SAMPLERS:
        assert isinstance(make_sampler(name, 0), optuna.samplers.BaseSampler)
    assert isinstance(make_sampler("tpe", 0), optuna.samplers.TPESampler)
    with pytest.raises(ConfigError, match="sampler: unknown name 'tpee'.*tpe"):
        make_sampler("tpee", 0)


def test_the_experiment_takes_exactly_the_schedulers_the_table_builds():
    pytest.importorskip("ray")
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    for name in SCHEDULERS:
        Experiment.from_dict({"scheduler": name})
    with pytest.raises(ConfigError, match="scheduler"):
        Experiment.from_dict({"scheduler": "hyperband"})
    assert isinstance(SCHEDULERS["asha"](8, 2), ASHAScheduler)
    assert isinstance(SCHEDULERS["asha"](1, 1), FIFOScheduler)  # one evaluation: nothing to stop early
    assert isinstance(SCHEDULERS["fifo"](8, 2), FIFOScheduler)
    assert Experiment().scheduler in SCHEDULERS and Experiment().sampler in SAMPLERS


def test_search_help_names_every_sampler_and_scheduler_the_tables_build():
    """The help is read without importing the engine (torch), so it names them itself: this keeps
    it equal to the tables."""
    import re

    from petl_nas.app.cli import build_parser

    search = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["search"]._actions
        if "--sampler" in a.option_strings
    )
    scheduler = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["search"]._actions
        if "--scheduler" in a.option_strings
    )
    named = lambda text: set(re.findall(r"[a-z0-9]+", text.split("(default")[0])) - {"or"}  # noqa: E731
    assert named(search.help) == set(SAMPLERS)
    assert named(scheduler.help) == set(SCHEDULERS)
