"""Search spaces: every shipped file parses, samples valid configs, and bad files name the bad key."""

import optuna
import pytest
import yaml

from petl_nas import ConfigError, preset
from petl_nas.core.presets import preset_lr, preset_names
from petl_nas.study.space import SearchSpace

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
    globals_ = ("gates", "layers", "bitfit", "lr", "train_layernorms", "prompt_length", "pooling", "head_lr_mult")
    assert all(p.startswith(("attn", "ffn", *globals_)) for t in study.trials for p in t.params)


def test_parameter_names_are_stable():
    space = SearchSpace.load("unified")
    names = {d.name for d in space.dimensions()}
    assert {"attn.form", "ffn.form", "ffn.bottleneck", "attn.length", "attn.rank", "lr", "gates", "bitfit"} <= names


ALL_SPACES = ["unified", "unified_short", "small", "mam", "unipelt"]


@pytest.mark.parametrize("space_name", ALL_SPACES)
@pytest.mark.parametrize("name", preset_names())
def test_every_preset_is_a_point_its_nearest_point_or_named_off_the_space(space_name, name):
    """Every preset x every shipped space: a point (decodes to the preset itself), its nearest point
    (only numbers outside a range clamped, each change named), or off the space for a named reason
    that is true of the space. The unified space holds every preset exactly."""
    space = SearchSpace.load(space_name)
    config = space.with_head(preset(name, hidden_size=384))
    near = space.nearest_point(config, preset_lr(name), n_layers=6)
    if near is None:
        why = space.why_not(config)
        assert space_name != "unified", why
        assert why.startswith((f"space {space_name!r} has no", f"space {space_name!r} holds")) or "choices" in why, why
        for m in config.modules:  # "has no <form> at <site>" is a fact of the space
            if f"has no {m.form} at {m.position}" in why:
                assert all(
                    m.form not in (s.forms.choices or (s.forms.value,)) for s in space.slots if s.site == m.position
                )
        return
    params, changes = near
    decoded, recipe = space.sample(optuna.trial.FixedTrial(params), n_layers=6)
    if not changes:
        assert decoded == config and recipe["lr"] == preset_lr(name)
        assert space.params_for(config, preset_lr(name), n_layers=6) == params
        return
    assert space_name != "unified", changes
    assert [m.form for m in decoded.modules] == [m.form for m in config.modules]
    for change in changes:  # "<param> <old> -> <new>", the new one in range
        param, old, _, new = change.split()
        assert space._dimension(param).contains(float(new)) and not space._dimension(param).contains(float(old))
    if [c.split()[0] for c in changes] == ["lr"]:
        assert decoded == config  # only the learning rate moved


@pytest.mark.parametrize("space_name", ["unified", "unified_short"])
def test_every_sampled_configuration_is_a_point_of_its_space(space_name):
    """A warm start re-enqueues a front member of another study as a point of this space: whatever the
    space samples (layer subsets by top_k or by mask included) maps back to parameters that decode to
    the same configuration and learning rate."""
    space = SearchSpace.load(space_name)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(7))
    placed = set()
    for _ in range(60):
        trial = study.ask()
        config, recipe = space.sample(trial, n_layers=6)
        study.tell(trial, [0.0, 1.0])
        params = space.params_for(config, recipe["lr"], n_layers=6)
        assert params is not None, (trial.params, config)
        decoded, again = space.sample(optuna.trial.FixedTrial(params), n_layers=6)
        assert decoded == config and again["lr"] == recipe["lr"]
        placed.add(trial.params["layers"])
    assert placed == {"all", "top", "mask"}


def test_a_configuration_off_the_spaces_layers_is_named():
    from dataclasses import replace

    space = SearchSpace.load("unified_short")
    lora = space.with_head(preset("lora", hidden_size=384))
    split = replace(
        lora,
        modules=(
            replace(lora.modules[0], layers=(0, 1)),
            replace(lora.modules[0], position="ffn", targets=("ffn_in",), layers=(5,)),
        ),
    )
    assert space.nearest_point(split, 1e-3, n_layers=6) is None
    assert (
        space.why_not(split)
        == "its modules sit on different layers; space 'unified_short' places them all on the same ones"
    )


def test_seeding_places_presets_as_points_and_says_how(tmp_path):
    from transformers import BertConfig

    from petl_nas.search.study import seed_presets

    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
    study = optuna.create_study(directions=["maximize", "minimize"])
    queued = seed_presets(study, SearchSpace.load("unified_short"), ["lora", "pfeiffer"], cfg, None, 6)
    assert queued == ["lora", "pfeiffer (nearest point: lr 0.0001 -> 0.0005)"]
    pfeiffer = study.get_trials(deepcopy=False)[1]
    assert pfeiffer.user_attrs["mapped"] == "lr 0.0001 -> 0.0005"
    assert pfeiffer.system_attrs["fixed_params"]["lr"] == 5e-4  # what the sampler will see
    small = optuna.create_study(directions=["maximize", "minimize"])
    auto = seed_presets(small, SearchSpace.load("small"), "auto", cfg, None, 6)
    assert "compacter_pp" not in " ".join(auto) and any(q.startswith("lora (nearest point") for q in auto)
    named = seed_presets(small, SearchSpace.load("small"), ["compacter_pp"], cfg, None, 6)
    assert named == ["compacter_pp (off the space: space 'small' has no compacter at ffn)"]
    assert small.get_trials(deepcopy=False)[-1].user_attrs["off_space"] == "space 'small' has no compacter at ffn"
    over, tight = [], optuna.create_study(directions=["maximize", "minimize"])
    named = seed_presets(tight, SearchSpace.load("unified_short"), ["lora", "compacter_pp"], cfg, 20_000, 6, over)
    assert named == ["compacter_pp"] and over == ["lora (73,728)"]  # named, over the budget: said, not queued


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


BASE = {
    "version": 1,
    "slots": {"attn": {"site": "attn", "forms": ["lora"]}},
    "rank": {"low": 1, "high": 8},
    "scale": 1.0,
    "lr": 1e-3,
}


@pytest.mark.parametrize(
    "patch, words",
    [
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
    ],
)
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
    from petl_nas.app.cli import main

    assert main(["space", "show", "unified"]) == 0
    out = capsys.readouterr().out
    assert "attn.form" in out and "searched dimensions" in out
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "rnak": 3}))
    assert main(["space", "validate", str(bad)]) == 2
    assert "unknown key 'rnak'" in capsys.readouterr().err


def test_space_show_counts_every_parameter_a_study_holds():
    """What `space show --model` counts is what a study of that space stores on that backbone."""
    space = SearchSpace.load("unified")
    stored = set()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(1))
    for _ in range(300):
        trial = study.ask()
        space.sample(trial, n_layers=6)
        study.tell(trial, 0.0)
        stored |= set(trial.params)
    shown = {d.name for d in space.dimensions() if d.kind != "fixed"} | {n for n, _ in space.layer_parameters(6)}
    assert stored == shown
    assert f"{len(shown)} parameters a study can hold on a 6-layer backbone" in space.describe(6)


def test_space_show_with_a_model_says_what_one_unit_of_each_size_costs(tmp_path, capsys):
    """`space show --model`: per slot and form, the deployable parameters of one unit of its size on
    one layer and on all of them (tiny BERT, d=32, FFN 64, 2 layers), or why the backbone refuses it."""
    from petl_nas.app.cli import main
    from petl_nas.core.tiny import tiny_backbone

    d, layers = 32, 2
    for kind in ("bert", "deberta-v2"):
        tiny_backbone(kind).save_pretrained(tmp_path / kind)
    assert main(["space", "show", "small", "--model", str(tmp_path / "bert")]) == 0
    rows = {
        tuple(line.split()[:2]): line.split()[3:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("attn ", "ffn "))
    }
    assert rows[("attn", "lora")] == [f"{2 * 2 * d}", f"{2 * 2 * d * layers}"]  # q and v: A and B rows
    assert rows[("attn", "prefix")] == [f"{2 * d}", f"{2 * d * layers}"]  # a key and a value
    assert rows[("ffn", "adapter")] == [f"{2 * d + 1}", f"{(2 * d + 1) * layers}"]  # down, up and its bias
    assert main(["space", "show", "small", "--model", str(tmp_path / "deberta-v2")]) == 0
    assert "prefix      length          not for this backbone" in capsys.readouterr().out


def _space(**changes) -> SearchSpace:
    data = yaml.safe_load(open(SearchSpace.load("small").source))
    data.update(changes)
    return SearchSpace(data, "<test>")


def test_an_empty_layer_mask_means_the_top_layer():
    """``layers: mask`` with every layer off places the modules on the top layer, never none."""
    space = _space(layers=["all", "mask"])
    params = {
        "layers": "mask",
        **{f"layers.mask.{i}": False for i in range(4)},
        "attn.form": "lora",
        "attn.composition": "add",
        "attn.rank": 2,
        "ffn.form": "none",
        "lr": 1e-2,
    }
    config, _ = space.sample(optuna.trial.FixedTrial(params), n_layers=4)
    assert config.modules[0].layers == (3,)


@pytest.mark.parametrize("bottleneck, size", [(2, 4), (4, 4), (5, 8), (6, 8), (16, 16)])
def test_a_compacter_bottleneck_rounds_up_to_a_multiple_of_phm_n(bottleneck, size):
    """PHM layers need n | size: a sampled bottleneck is rounded up (never down, never to 0)."""
    space = SearchSpace(
        {
            "version": 1,
            "slots": {"ffn": {"site": "ffn", "forms": ["compacter"]}},
            "bottleneck": {"low": 2, "high": 16},
            "scale": 1.0,
            "phm_n": 4,
            "lr": {"low": 1e-3, "high": 1e-2},
        },
        "<compacter>",
    )
    config, _ = space.sample(optuna.trial.FixedTrial({"ffn.bottleneck": bottleneck, "lr": 5e-3}), n_layers=2)
    assert config.modules[0].phm_n == 4 and config.modules[0].size == size
