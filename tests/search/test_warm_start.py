"""Warm start: an earlier study's front enqueued first, re-counted on the new backbone, filtered by
the new budget and space (each drop said), clamped to the nearest point, never taken twice."""

import dataclasses
import re

import optuna
import pytest
from conftest import NO_RATES
from optuna.distributions import FloatDistribution
from transformers import BertConfig

from petl_nas import ConfigError
from petl_nas.core.budget import count_parameters
from petl_nas.core.config import ModuleSpec, PetlConfig
from petl_nas.search.driver import run_search
from petl_nas.search.warm_start import front_of, parse_source, seed_warm_start
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval
from petl_nas.study.space import SearchSpace

D, L = 32, 2
CFG = BertConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=4, intermediate_size=64, vocab_size=400)
TINY = {
    "tiny": {
        "hidden_size": D,
        "num_hidden_layers": L,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 400,
    }
}


def lora(r, scale=2.0, layers=None):
    return PetlConfig(
        modules=(ModuleSpec(form="lora", targets=("q", "v"), size=r, composition="scaled", scale=scale, layers=layers),)
    )


FITS = lora(4)  # a point of `small` as it is
CLAMPED = lora(6, scale=8.0)  # scale 8 is past small's 4
OFF_SPACE = PetlConfig(modules=(ModuleSpec(form="adapter", position="attn", size=4),))
DEEP = lora(2, layers=(0, 5))  # layer 5: the new backbone has 2
OVER = PetlConfig(modules=(ModuleSpec(form="prefix", size=16, reparam=0, composition="gated"),))


def earlier_study(url: str, members) -> None:
    """A finished study: each (config, score) a complete trial that learned; scores rise with size."""
    study = optuna.create_study(study_name="earlier", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("baseline", {"score": 0.5, "metric": "accuracy", "what": "constant"})
    for i, (config, score) in enumerate(members):
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-2},
                distributions={"lr": FloatDistribution(1e-4, 1e-1, log=True)},
                values=[score, 100 * (i + 1)],
                user_attrs={"petl_config": config.to_dict(), "recipe": {"lr": 1e-2}, "score_se": 0.01},
            )
        )
    study.add_trial(
        optuna.trial.create_trial(  # did not learn: not a member
            params={"lr": 1e-2},
            distributions={"lr": FloatDistribution(1e-4, 1e-1, log=True)},
            values=[0.5, 1],
            user_attrs={"petl_config": FITS.to_dict(), "recipe": {"lr": 1e-2}, "did_not_learn": True},
        )
    )


def test_the_front_is_queued_first_and_each_drop_is_named(tmp_path):
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [(FITS, 0.70), (CLAMPED, 0.75), (OFF_SPACE, 0.80), (DEEP, 0.85), (OVER, 0.90)])
    assert [t.number for t in front_of(url)[1]] == [0, 1, 2, 3, 4]
    space = SearchSpace.load("small")
    budget = 1600
    assert count_parameters(CFG, CLAMPED).deployable <= budget < count_parameters(CFG, OVER).deployable

    study = optuna.create_study(directions=["maximize", "minimize"])
    lines = seed_warm_start(study, f"{url}#earlier", space, CFG, budget, L, "sqlite:///elsewhere.db")
    assert lines[0] == (
        "warm start from 'earlier': 2 of 5 front members queued first: trial 0, "
        "trial 1 (nearest point: attn.scale 8 -> 4)"
    )
    assert lines[1] == (
        "warm start: dropped trial 2 (space 'small' has no adapter at attn), "
        "trial 3 (layers 5 beyond the backbone's 2), "
        f"trial 4 ({count_parameters(CFG, OVER).deployable:,} deployable parameters on this "
        "backbone, over the budget of 1,600)"
    )
    decoded = []
    for _ in range(2):
        trial = study.ask()
        config, recipe = space.sample(trial, L)
        decoded.append((trial.user_attrs["warm_start"], config.modules, recipe["lr"]))
    assert decoded[0] == ("earlier trial 0", space.with_head(FITS).modules, pytest.approx(1e-2))
    assert decoded[1][0] == "earlier trial 1" and decoded[1][1][0].scale == 4.0 and decoded[1][1][0].size == 6
    assert study.user_attrs["warm_start"]["dropped"][0].startswith("trial 2")
    assert seed_warm_start(study, f"{url}#earlier", space, CFG, budget, L, "sqlite:///elsewhere.db") == []  # once


def test_a_member_the_new_backbone_refuses_is_dropped_with_its_reason(tmp_path):
    from transformers import DebertaV2Config

    url = f"sqlite:///{tmp_path}/earlier.db"
    prefix = PetlConfig(modules=(ModuleSpec(form="prefix", size=2, reparam=0, composition="gated"),))
    earlier_study(url, [(FITS, 0.70), (prefix, 0.80)])
    deberta = DebertaV2Config(
        hidden_size=D, num_hidden_layers=L, num_attention_heads=4, intermediate_size=64, vocab_size=400
    )  # its attention is its own code: no prefix
    study = optuna.create_study(directions=["maximize", "minimize"])
    lines = seed_warm_start(study, f"{url}#earlier", SearchSpace.load("small"), deberta, None, L, "sqlite:///x.db")
    assert lines[0] == "warm start from 'earlier': 1 of 2 front members queued first: trial 0"
    assert lines[1].startswith("warm start: dropped trial 1 (this backbone cannot take it: ") and "prefix" in lines[1]
    assert "\n" not in lines[1]


def test_a_source_where_nothing_learned_says_so(tmp_path):
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [])  # only the trial that did not learn
    study = optuna.create_study(study_name="new", directions=["maximize", "minimize"])
    lines = seed_warm_start(study, f"{url}#earlier", SearchSpace.load("small"), CFG, None, L, "sqlite:///x.db")
    assert lines == [
        "warm start from 'earlier': none of its trials learned (complete and beyond noise of its "
        "trivial baseline), so it has no front to queue"
    ]
    assert study.trials == []


def test_bad_sources_are_one_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [(FITS, 0.7)])
    study = optuna.create_study(study_name="earlier", directions=["maximize", "minimize"])
    with pytest.raises(ConfigError, match="that is this study"):
        seed_warm_start(study, url, SearchSpace.load("small"), CFG, None, L, url)
    with pytest.raises(ConfigError, match="^warm start: study 'nope' is not in"):
        front_of(f"{url}#nope")
    with pytest.raises(ConfigError, match=r"^warm start: storage 'sqlite:///.*/missing\.db': no such file"):
        front_of(f"sqlite:///{tmp_path}/missing.db")  # named as the warm start's, not --storage's
    optuna.create_study(study_name="other", storage=url, directions=["maximize", "minimize"])
    with pytest.raises(
        ConfigError,
        match=rf"^warm start: .* holds 2 studies \(earlier, other\); name one with "
        rf"{re.escape(url)}#NAME$",
    ):
        front_of(url)
    with pytest.raises(ConfigError, match="expected a storage URL"):
        parse_source("#earlier")


@pytest.mark.slow
def test_a_search_warm_started_from_another_takes_its_front(tmp_path, monkeypatch):
    """Two real tiny searches: the second (another task) starts from the first one's front."""
    monkeypatch.chdir(tmp_path)
    base = Experiment(
        rates=NO_RATES,
        name="a",
        backbone=TINY,
        task="demo_keyword",
        budget="5%",
        space="small",
        trials=3,
        presets=["lora"],
        executor="local",
        startup_trials=1,
        seed=3,  # its first draws learn
        storage=f"sqlite:///{tmp_path}/a.db",
        fidelity=Fidelity(length_buckets=0, k=320, epochs=5, batch_size=16, max_length=24, search_dev=128),
        final=FinalEval(seeds=0, baselines=False),
    )
    run_search(base, printer=lambda line: None)
    members = front_of(base.storage_url)[1]
    assert members
    lines = []
    warm = dataclasses.replace(
        base,
        name="b",
        task="demo_sentiment",
        storage=f"sqlite:///{tmp_path}/b.db",
        trials=len(members) + 1,
        warm_start=base.storage_url,
    )
    run_search(warm, printer=lines.append)
    assert any(line.startswith("warm start from 'a'") for line in lines)
    b = optuna.load_study(study_name="b", storage=warm.storage_url)
    started = [t for t in b.trials if t.user_attrs.get("warm_start")]
    assert sorted(t.user_attrs["warm_start"] for t in started) == sorted(f"a trial {t.number}" for t in members)
    assert {str(t.user_attrs["petl_config"]) for t in started} == {str(t.user_attrs["petl_config"]) for t in members}
    assert all(t.number < len(members) + 1 for t in started)  # before the sampler's own
    from petl_nas.study.fronts import source_of

    assert {source_of(t) for t in started} == {"warm start"}  # the tables say where they came from
    run_search(warm, printer=lines.append)  # resumed: nothing taken twice
    assert len(
        [
            t
            for t in optuna.load_study(study_name="b", storage=warm.storage_url).trials
            if t.user_attrs.get("warm_start")
        ]
    ) == len(members)
    done = dataclasses.replace(base, name="c", storage=f"sqlite:///{tmp_path}/c.db", trials=1, presets=[])
    run_search(done, printer=lambda line: None)  # a finished study of 1 trial
    run_search(dataclasses.replace(done, warm_start=base.storage_url), printer=lines.append)
    c = optuna.load_study(study_name="c", storage=done.storage_url)  # warm-started on resume: they train
    assert [t.state.name for t in c.trials if t.user_attrs.get("warm_start")] == ["COMPLETE"] * len(members)


def test_a_member_on_the_layer_just_past_the_backbone_is_dropped_for_it(tmp_path):
    """Layer indices start at 0: on an L-layer backbone, layer L is already beyond it."""
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [(FITS, 0.70), (lora(2, layers=(0, L)), 0.75)])
    study = optuna.create_study(directions=["maximize", "minimize"])
    lines = seed_warm_start(study, f"{url}#earlier", SearchSpace.load("small"), CFG, None, L, "sqlite:///x.db")
    assert lines == [
        "warm start from 'earlier': 1 of 2 front members queued first: trial 0",
        f"warm start: dropped trial 1 (layers {L} beyond the backbone's {L})",
    ]


def test_a_member_exactly_at_the_new_budget_is_queued(tmp_path):
    """The budget is a most: a member whose count on the new backbone equals it fits."""
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [(FITS, 0.70)])
    space = SearchSpace.load("small")
    budget = count_parameters(CFG, space.with_head(FITS)).deployable
    study = optuna.create_study(directions=["maximize", "minimize"])
    lines = seed_warm_start(study, f"{url}#earlier", space, CFG, budget, L, "sqlite:///x.db")
    assert lines == ["warm start from 'earlier': 1 of 1 front members queued first: trial 0"]
    assert study.user_attrs["warm_start"]["dropped"] == []


def test_a_member_already_queued_by_a_cut_short_start_is_not_queued_twice(tmp_path):
    """A study whose first warm start queued a member and stopped before recording it (no
    ``warm_start`` study attribute yet) takes only the members it lacks when started again."""
    url = f"sqlite:///{tmp_path}/earlier.db"
    earlier_study(url, [(FITS, 0.70), (CLAMPED, 0.75)])
    space = SearchSpace.load("small")
    study = optuna.create_study(directions=["maximize", "minimize"])
    params, _ = space.nearest_point(space.with_head(FITS), 1e-2, L)
    study.enqueue_trial(
        params, user_attrs={"warm_start": "earlier trial 0"}, skip_if_exists=False
    )  # the cut-short run's
    lines = seed_warm_start(study, f"{url}#earlier", space, CFG, None, L, "sqlite:///x.db")
    tags = [t.user_attrs.get("warm_start") for t in study.get_trials(deepcopy=False)]
    assert sorted(tags) == ["earlier trial 0", "earlier trial 1"]
    assert lines[0] == (
        "warm start from 'earlier': 1 of 2 front members queued first: trial 1 (nearest point: attn.scale 8 -> 4)"
    )
