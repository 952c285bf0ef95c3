"""Per-family learning rates (`PetlConfig.lr_mults`): every trained parameter belongs to one family,
AdamW trains each family at its multiple of the recipe's rate, a configuration without multiples
trains exactly as before, and the multiples travel with the configuration (dicts, saved folders,
export records)."""

from __future__ import annotations

import pytest
import torch
from conftest import batch, tiny_model

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, load_petl, save_petl
from petl_nas.core.config import lr_families
from petl_nas.core.inject import parameter_families
from petl_nas.core.presets import preset, preset_names
from petl_nas.deploy.record import ExportRecord, read_record, write_record
from petl_nas.training.loop import Recipe, adamw, param_groups

MIXED = PetlConfig(
    modules=(ModuleSpec(form="lora", position="attn", size=4), ModuleSpec(form="adapter", position="ffn", size=8)),
    bitfit=True,
    train_layernorms=True,
    prompt_length=2,
    head_lr_mult=4.0,
    lr_mults={"lora": 0.5, "adapter": 3.0, "bitfit": 2.0, "prompt": 0.25},
)


def _trained(model):
    return [p for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("name", preset_names())
def test_every_trained_parameter_of_every_preset_has_one_family(name):
    model = apply_petl(tiny_model(), preset(name, hidden_size=32))
    config, families = model.petl.config, parameter_families(model)
    assert {id(p) for p in _trained(model)} == set(families)
    assert set(families.values()) <= {*lr_families(), "head"}
    assert {families[id(p)] for p in model.petl.parameters() if p.requires_grad} == {m.form for m in config.modules} | (
        {"prompt"} if config.prompt_length else set()
    )
    assert ("bitfit" in families.values()) == config.bitfit  # its dense layers' biases at least
    assert ("layernorms" in families.values()) == config.train_layernorms


def test_each_family_trains_at_its_own_multiple_of_the_rate():
    model = apply_petl(tiny_model(), MIXED)
    params, families = _trained(model), parameter_families(model)
    groups = param_groups(model, params, Recipe(lr=1e-3, weight_decay=0.01))
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in params) and len(seen) == len(set(seen))
    expected = {"lora": 0.5, "adapter": 3.0, "bitfit": 2.0, "prompt": 0.25, "layernorms": 1.0, "head": 4.0}
    assert set(families.values()) == set(expected)
    for g in groups:
        for p in g["params"]:
            assert g["lr"] == pytest.approx(1e-3 * expected[families[id(p)]])
            assert g["weight_decay"] == (0.01 if p.ndim >= 2 else 0.0)


def test_the_first_adamw_step_moves_each_family_by_its_own_rate():
    """Adam's first step moves every element with a gradient by about its group's rate: the optimizer
    a trial builds, not only its groups, honours the multiples."""
    model = apply_petl(tiny_model(), MIXED).train()
    params, families = _trained(model), parameter_families(model)
    before = {id(p): p.detach().clone() for p in params}
    opt = adamw(param_groups(model, params, Recipe(lr=1e-3, weight_decay=0.0)), 1e-3)
    model(**batch(), labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    steps = {}
    for p in params:
        moved = (p.detach() - before[id(p)]).abs()
        if p.grad is not None and bool((p.grad.abs() > 1e-6).any()):
            steps.setdefault(families[id(p)], []).append(float(moved[p.grad.abs() > 1e-6].max()))
    assert {"lora", "adapter", "bitfit", "prompt", "head"} <= set(steps)
    for family, mult in {"lora": 0.5, "adapter": 3.0, "bitfit": 2.0, "prompt": 0.25, "head": 4.0}.items():
        assert max(steps[family]) == pytest.approx(1e-3 * mult, rel=0.02), family


def test_a_configuration_at_one_rate_keeps_the_groups_and_the_dict_it_always_had():
    """No multiples: two groups at the recipe's rate (a saved optimizer state still loads), and no
    new key in the stored configuration (old studies and records compare equal)."""
    config = PetlConfig(modules=(ModuleSpec(form="lora", position="attn", size=4),), bitfit=True)
    model = apply_petl(tiny_model(), config)
    groups = param_groups(model, _trained(model), Recipe(lr=2e-3))
    assert [(g["lr"], g["weight_decay"] > 0) for g in groups] == [(2e-3, True), (2e-3, False)]
    assert "lr_mults" not in config.to_dict() and PetlConfig.from_dict(config.to_dict()) == config


def test_the_multiples_travel_with_the_configuration(tmp_path):
    assert PetlConfig.from_dict(MIXED.to_dict()) == MIXED and MIXED.to_dict()["lr_mults"]["adapter"] == 3.0
    save_petl(apply_petl(tiny_model(), MIXED), tmp_path / "run")
    assert load_petl(tiny_model(), tmp_path / "run").petl.config.lr_mults == MIXED.lr_mults
    rec = ExportRecord(backbone="b", task="demo_sentiment", petl_config=MIXED.to_dict(), recipe={"lr": 1e-3})
    assert read_record(write_record(rec, tmp_path / "best.yaml")).config() == MIXED


@pytest.mark.parametrize(
    "mults, message",
    [
        ({"lorra": 2.0}, r"lr_mults\.lorra: unknown family \(did you mean 'lora'\?\)"),
        ({"head": 2.0}, r"lr_mults\.head: unknown family"),
        ({"adapter": 0}, r"lr_mults\.adapter: expected a number > 0, got 0"),
        ({"adapter": True}, r"lr_mults\.adapter: expected a number > 0"),
        ({"adapter": float("inf")}, r"lr_mults\.adapter: expected a number > 0, got inf"),
        ([0.5], r"lr_mults: expected a mapping of family: multiple"),
    ],
)
def test_a_bad_multiple_is_one_line_naming_it(mults, message):
    with pytest.raises(ConfigError, match=message):
        PetlConfig.from_dict({"modules": [{"form": "lora"}], "lr_mults": mults})
