"""Search spaces: every shipped file parses, samples valid configs, and bad files name the bad key."""

import optuna
import pytest
import yaml

from petl_nas import ConfigError, preset
from petl_nas.presets import preset_lr
from petl_nas.space import SearchSpace

SHIPPED = ["unified", "small", "mam", "unipelt"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spaces_sample_valid_configs(name):
    space = SearchSpace.load(name)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(0))
    for _ in range(30):
        trial = study.ask()
        config, recipe = space.sample(trial, n_layers=6)
        assert all(m.layers is None or max(m.layers) < 6 for m in config.modules)
        assert space.globals["lr"].contains(recipe["lr"])
        study.tell(trial, [0.0, 1.0])
    assert all(p.startswith(("attn", "ffn", "gates", "layers", "bitfit", "lr")) for t in study.trials for p in t.params)


def test_parameter_names_are_stable():
    space = SearchSpace.load("unified")
    names = {d.name for d in space.dimensions()}
    assert {"attn.form", "ffn.form", "ffn.bottleneck", "attn.length", "attn.rank", "lr", "gates", "bitfit"} <= names


def test_presets_are_points_of_the_unified_space():
    space = SearchSpace.load("unified")
    for name in ["mam", "unipelt_apl", "lora", "pfeiffer", "parallel_adapter", "prefix", "bitfit"]:
        config = preset(name, hidden_size=384)
        params = space.params_for(config, preset_lr(name), n_layers=6)
        assert params is not None, name
        decoded, recipe = space.sample(optuna.trial.FixedTrial(params), n_layers=6)
        assert decoded == config and recipe["lr"] == preset_lr(name)


def test_flat_sampling_suggests_every_dimension():
    space = SearchSpace.load("small")
    trial = optuna.create_study().ask()
    space.sample(trial, n_layers=4, flat=True)
    assert {"attn.rank", "attn.length", "ffn.bottleneck"} <= set(trial.params)


def test_hash_changes_with_the_space(tmp_path):
    data = yaml.safe_load(open(SearchSpace.load("small").source).read())
    a = SearchSpace(data, "a.yaml")
    data["bottleneck"] = {"low": 2, "high": 32, "log": True}
    assert SearchSpace(data, "b.yaml").hash != a.hash


BASE = {"version": 1, "slots": {"attn": {"site": "attn", "forms": ["lora"]}}, "rank": {"low": 1, "high": 8},
        "scale": 1.0, "lr": 1e-3}


@pytest.mark.parametrize("patch, words", [
    ({"bottlenek": 4}, "unknown key 'bottlenek' (did you mean 'bottleneck'?)"),
    ({"rank": "eight"}, "slots.attn.rank: invalid value 'eight'"),
    ({"rank": {"low": 8, "high": 2}}, "low (8) is greater than high (2)"),
    ({"rank": []}, "empty choice list"),
    ({"slots": {"attn": {"site": "attn", "forms": ["prefx"]}}}, "did you mean 'prefix'"),
    ({"slots": {"attn": {"site": "head", "forms": ["lora"]}}}, "site: must be one of attn, ffn"),
    ({"slots": {"ffn": {"site": "ffn", "forms": ["prefix"]}}}, "invalid value 'prefix'"),
    ({"version": None}, "version: missing"),
    ({"lr": {"low": 0, "high": 1, "log": True}}, "log range needs low > 0"),
    ({"gates": "maybe"}, "gates: invalid value 'maybe'"),
])
def test_bad_space_files_name_the_problem(tmp_path, patch, words):
    data = {**BASE, **patch}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        SearchSpace.load(path)
    assert words in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_space_name_suggests():
    with pytest.raises(ConfigError, match="did you mean 'unified'"):
        SearchSpace.load("unifed")


def test_cli_space_show_and_validate(capsys, tmp_path):
    from petl_nas.cli import main

    assert main(["space", "show", "unified"]) == 0
    out = capsys.readouterr().out
    assert "attn.form" in out and "searched dimensions" in out
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "rnak": 3}))
    assert main(["space", "validate", str(bad)]) == 2
    assert "unknown key 'rnak'" in capsys.readouterr().err
