"""LN-tuning as a form: exact counts (the formula and PEFT's), the same outputs as PEFT's LN tuning
after copying the norms, identity at the start, only the copies train, save/load, the refusals,
and the search space. The checks shared with (IA)³ live in `test_ia3`."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, batch, tiny_model
from test_ia3 import identity_step_and_round_trip, vector_form_checks
from transformers import AutoConfig, AutoModelForCausalLM

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_parameters
from petl_nas.core.backbones import spec_for

D, L = TINY["hidden_size"], TINY["num_hidden_layers"]
BOTH = PetlConfig(modules=(ModuleSpec(form="ln", position="attn"), ModuleSpec(form="ln", position="ffn")))


def test_both_sublayers_norms_count_as_the_formula_and_peft_and_compute_what_peft_does():
    vector_form_checks(BOTH, 2 * (2 * D) * L, "ln_tuning_layers")  # γ and β of two norms per layer


def test_one_sublayer_on_some_layers_counts_and_matches_peft_too():
    config = PetlConfig(modules=(ModuleSpec(form="ln", position="ffn", layers=(0, 2)),))
    vector_form_checks(config, 2 * D * 2, "ln_tuning_layers")


def test_it_starts_as_the_identity_trains_only_the_copies_and_round_trips(tmp_path):
    identity_step_and_round_trip(BOTH, tmp_path)


def test_it_edits_the_norm_the_backbone_spec_names_for_each_sublayer():
    model = apply_petl(tiny_model(), PetlConfig(modules=(ModuleSpec(form="ln", position="ffn", layers=(1,)),)))
    layer = model.bert.encoder.layer[1]
    (copied,) = model.petl.groups["0_ffn_ln"].values()
    assert spec_for(model.config).blocks[0].ffn_norm == "output.LayerNorm"
    with torch.no_grad():
        copied.norm.bias.add_(5.0)
        seen = {}
        handle = layer.output.LayerNorm.register_forward_hook(lambda mod, args, out: seen.update(out=out))
        model(**batch())
        handle.remove()
    assert torch.allclose(
        seen["out"],
        torch.nn.functional.layer_norm(
            seen["out"] - 5.0, (D,), copied.norm.weight, copied.norm.bias - 5.0, copied.norm.eps
        )
        + 5.0,
        atol=1e-5,
    )
    assert not any(p.requires_grad for p in layer.output.LayerNorm.parameters())  # the backbone's stays frozen


def test_refusals_are_one_line_each():
    base = tiny_model()
    with pytest.raises(ConfigError, match=r"^ln: train_layernorms already trains every LayerNorm"):
        count_parameters(base.config, PetlConfig(modules=BOTH.modules, train_layernorms=True))
    two = PetlConfig(modules=(ModuleSpec(form="ln", layers=(0, 1)), ModuleSpec(form="ln", layers=(1, 2))))
    with pytest.raises(ConfigError, match=r"attention\.output\.LayerNorm: two modules would each compute it"):
        count_parameters(base.config, two)
    for fields, match in [
        ({"gate": True}, r"module\.gate: ln has no gate"),
        ({"size": 2}, r"module\.size: ln does not"),
        ({"targets": ("ffn_norm",)}, r"unknown value 'ffn_norm'.*accepted: attn_norm"),
    ]:
        with pytest.raises(ConfigError, match=match):
            ModuleSpec(form="ln", **fields)
    llama = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "llama", vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4
        )
    )
    assert spec_for(llama.config).blocks[0].attn_norm is None  # Gemma 2 shares the spec, not the norms
    with pytest.raises(
        ConfigError,
        match=r"^ln: the llama backbone spec does not say which norm belongs to the "
        r"decoder block's attn sublayer \(attn_norm\)$",
    ):
        apply_petl(llama, BOTH)
    assert not hasattr(llama, "petl")


def test_a_space_samples_it_per_sublayer_and_maps_it_back():
    import optuna

    from petl_nas.core.describe import describe_config
    from petl_nas.core.presets import preset, preset_lr
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "v",
            "slots": {
                "attn": {"site": "attn", "forms": ["none", "ln", "ia3"]},
                "ffn": {"site": "ffn", "forms": ["none", "ln", "lora"]},
            },
            "rank": {"low": 1, "high": 4},
            "scale": 2.0,
            "layers": ["all", "mask"],
            "gates": [False, True],
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(24):
        trial = study.ask()
        config, recipe = space.sample(trial, n_layers=3)
        seen.add(tuple(m.form for m in config.modules))
        assert all(m.gate == (m.form == "lora" and trial.params["gates"]) for m in config.modules)
        assert space.params_for(config, recipe["lr"], 3) is not None
    assert {("ln",), ("ln", "ln"), ("ia3", "ln"), ("ln", "lora")} <= seen  # a gated LoRA beside them too
    assert describe_config(BOTH).startswith("attn LN")
    unified = SearchSpace.load("unified")
    config = unified.with_head(preset("ln_tuning", hidden_size=384))
    assert unified.params_for(config, preset_lr("ln_tuning"), n_layers=6) is not None
