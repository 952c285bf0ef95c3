"""A search counts and trains equivalent configurations as one canonical point: two LoRAs the space
put on one sublayer are stored, counted and trained as one LoRA of their summed rank."""

from __future__ import annotations

import optuna
from transformers import BertConfig

from petl_nas.core.budget import count_parameters
from petl_nas.search.study import TrialSource
from petl_nas.study.space import SearchSpace

TWO_LORAS = {
    "version": 1,
    "name": "two_loras",
    "lr": 1e-3,
    "pooling": "mean",
    "slots": {"a": {"site": "attn", "forms": ["lora"], "rank": 1}, "b": {"site": "attn", "forms": ["lora"], "rank": 5}},
    "composition": "scaled",
    "scale": 2.0,
    "lora_targets": "qv",
    "init": "lora",
}


def test_two_loras_on_one_sublayer_are_drawn_as_one_lora_of_their_summed_rank():
    model_config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    space = SearchSpace(TWO_LORAS)
    study = optuna.create_study(directions=["maximize", "minimize"])
    drawn, _ = space.sample(optuna.trial.FixedTrial({}), 2)
    assert [m.size for m in drawn.modules] == [1, 5]  # what the space itself decodes
    p = TrialSource(study, space, model_config, None, 2).next()
    assert [(m.form, m.size) for m in p.config.modules] == [("lora", 6)]
    stored = study.trials[0].user_attrs
    assert [m["size"] for m in stored["petl_config"]["modules"]] == [6]
    assert p.deployable == count_parameters(model_config, drawn).deployable == 2 * 2 * 6 * (32 + 32)


def test_at_measured_rates_two_loras_drawn_at_two_scales_are_one_lora_at_their_familys_scale():
    model_config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    apart = {
        **TWO_LORAS,
        "slots": {"a": {**TWO_LORAS["slots"]["a"], "scale": 1.0}, "b": {**TWO_LORAS["slots"]["b"], "scale": 8.0}},
    }
    space = SearchSpace(apart).with_rate_scale(1.0)
    drawn, _ = space.sample(optuna.trial.FixedTrial({}), 2)
    assert [(m.size, m.scale) for m in drawn.modules] == [(1, 1.0), (5, 8.0)]  # two functions as drawn
    study = optuna.create_study(directions=["maximize", "minimize"])
    p = TrialSource(study, space, model_config, None, 2, rates={"lora": 1e-3}, scales={"lora": 2.0}).next()
    assert [(m.form, m.size, m.scale) for m in p.config.modules] == [("lora", 6, 2.0)]  # one, at s = 2
    assert p.lr == 1e-3
