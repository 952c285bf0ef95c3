"""PetlConfig: presets round-trip through YAML and JSON; invalid input names the field."""

import pytest

from petl_nas import ConfigError, ModuleSpec, PetlConfig, preset, preset_names
from petl_nas.core.presets import _raw_presets


@pytest.mark.parametrize("name", preset_names())
def test_preset_round_trips(name):
    cfg = preset(name, hidden_size=768)
    assert PetlConfig.from_yaml(cfg.to_yaml()) == cfg
    assert PetlConfig.from_json(cfg.to_json()) == cfg


def test_file_round_trip(tmp_path):
    cfg = preset("unipelt_apl", hidden_size=384)
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    (tmp_path / "c.json").write_text(cfg.to_json())
    assert PetlConfig.from_yaml(tmp_path / "c.yaml") == cfg
    assert PetlConfig.from_yaml(str(tmp_path / "c.json")) == cfg


def test_ratio_sizes_scale_with_the_backbone():
    assert preset("pfeiffer", hidden_size=768).modules[0].size == 48
    assert preset("pfeiffer", hidden_size=384).modules[0].size == 24
    with pytest.raises(ConfigError, match="hidden size"):
        preset("pfeiffer")


def test_presets_file_documents_every_preset():
    assert all(body.get("doc") for body in _raw_presets().values())


def test_form_defaults_make_equal_designs_equal():
    a = ModuleSpec(form="lora", position="attn", size=8, composition="scaled", scale=2.0)
    b = ModuleSpec(form="lora", size=8, scale=2.0, targets=("q", "v"), init="lora")
    assert a == b and hash(a) == hash(b)
    assert ModuleSpec(form="prefix", size=10).composition == "gated"


@pytest.mark.parametrize(
    "data, field, words",
    [
        ({"modules": [{"form": "adaptor"}]}, "modules[0].form", "did you mean 'adapter'"),
        ({"modules": [{"form": "prefix", "position": "ffn"}]}, "modules[0].position", "head attention"),
        ({"modules": [{"form": "adapter", "size": 0}]}, "modules[0].size", "positive integer"),
        ({"modules": [{"form": "lora", "size": -4}]}, "modules[0].size", "positive integer"),
        ({"modules": [{"form": "adapter", "bottleneck": 8}]}, "modules[0].bottleneck", "unknown key"),
        ({"modules": [{"form": "adapter", "reparam": 8}]}, "modules[0].reparam", "adapter does not use it"),
        ({"modules": [{"form": "adapter", "composition": "gated"}]}, "modules[0].composition", "gate: true"),
        ({"modules": [{"form": "adapter", "scale": 4.0}]}, "modules[0].scale", "'scaled'"),
        ({"modules": [{"form": "lora", "targets": ["q", "ffn_in"]}]}, "modules[0].targets", "ffn_in"),
        ({"modules": [{"form": "lora", "insertion": "sequential"}]}, "modules[0].insertion", "parallel"),
        ({"modules": [{"form": "adapter", "layers": []}]}, "modules[0].layers", "empty"),
        ({"modules": [{"form": "adapter", "nonlinearity": "sigmoid"}]}, "modules[0].nonlinearity", "accepted"),
        ({"modules": [{"form": "prefix"}, {"form": "prefix", "layers": [1]}]}, "modules[1].layers", "second prefix"),
        ({"bitfitt": True}, "config.bitfitt", "did you mean 'bitfit'"),
        ({"prompt_length": -1}, "prompt_length", "non-negative"),
        ({"bitfit": "yes"}, "bitfit", "true or false"),
        ({"modules": [{"form": "lora", "scale": "x"}]}, "modules[0].scale", "expected a number, got 'x'"),
        ({"modules": [{"form": "lora", "gate": "no"}]}, "modules[0].gate", "true or false, got 'no'"),  # not truthy
        ({"modules": [{"form": "lora", "learn_scale": "no"}]}, "modules[0].learn_scale", "true or false"),
        ({"modules": [{"form": "adapter", "dropout": "x"}]}, "modules[0].dropout", "expected a number"),
        ({"modules": [{"form": "prefix", "reparam": 1.5}]}, "modules[0].reparam", "a whole number"),
        ({"modules": [{"form": "compacter", "phm_n": 2.5}]}, "modules[0].phm_n", "a whole number"),
        ({"modules": [{"form": "adapter", "layers": [1.7]}]}, "modules[0].layers", "a list of layer indices"),
        ({"modules": [{"form": "lora", "targets": ["q", "q"]}]}, "modules[0].targets", "names a weight twice"),
    ],
)
def test_invalid_input_names_the_field(data, field, words):
    with pytest.raises(ConfigError) as err:
        PetlConfig.from_dict(data)
    assert field in str(err.value) and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: ModuleSpec(form="lora", scale="abc"), "module.scale: expected a number, got 'abc'"),
        (lambda: ModuleSpec(form="lora", scale=None), "module.scale: expected a number, got None"),
        (lambda: ModuleSpec(form="adapter", layers=3), "module.layers: expected a list of layer indices, got 3"),
        (lambda: ModuleSpec(form="adapter", layers="12"), "module.layers: expected a list of layer indices"),
        (lambda: ModuleSpec(form="lora", targets="qv"), "module.targets: expected a list of weight names"),
        (lambda: ModuleSpec(form="prefix", dropout=0.3), "module.dropout: prefix does not use it"),  # to_dict drops it
        (lambda: ModuleSpec(form="prefix", init="lora"), "module.init: prefix does not use it"),
        (lambda: PetlConfig(modules=ModuleSpec(form="lora")), "modules: expected a list of ModuleSpec"),
        (lambda: PetlConfig(train_layernorms=1), "train_layernorms: expected true or false, got 1"),
    ],
)
def test_the_constructors_check_what_from_dict_checks(build, words):
    """The Python API refuses what a file would: no raw TypeError, nothing silently read otherwise."""
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        build()
    spec = ModuleSpec(form="prefix", size=4)  # defaults a form does not use are fine
    assert PetlConfig.from_dict(PetlConfig(modules=(spec,)).to_dict()).modules == (spec,)


def test_layer_past_depth_is_rejected_when_applied():
    from conftest import tiny_model

    from petl_nas import apply_petl

    cfg = PetlConfig(modules=(ModuleSpec(form="adapter", layers=(0, 3)),))
    with pytest.raises(ConfigError, match=r"modules\[0\].layers: layer 3 is past the model's depth \(3 layers"):
        apply_petl(tiny_model(), cfg)


def test_bad_yaml_file_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("modules:\n  - {form: lora, rank: 8}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: modules\[0\].rank: unknown key"):
        PetlConfig.from_yaml(f)


def test_config_is_frozen():
    cfg = preset("lora")
    with pytest.raises(Exception):
        cfg.bitfit = True
