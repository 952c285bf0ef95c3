"""A search counts and trains equivalent configurations as one canonical point: two LoRAs the space
put on one sublayer are stored, counted and trained as one LoRA of their summed rank."""

from __future__ import annotations

import optuna
from transformers import BertConfig

from petl_nas.core.budget import count_parameters
from petl_nas.search.space import SearchSpace
from petl_nas.search.study import TrialSource

TWO_LORAS = {"version": 1, "name": "two_loras", "lr": 1e-3, "pooling": "mean",
             "slots": {"a": {"site": "attn", "forms": ["lora"], "rank": 1},
                       "b": {"site": "attn", "forms": ["lora"], "rank": 5}},
             "composition": "scaled", "scale": 2.0, "lora_targets": "qv", "init": "lora"}


def test_two_loras_on_one_sublayer_are_drawn_as_one_lora_of_their_summed_rank():
    model_config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    space = SearchSpace(TWO_LORAS)
    study = optuna.create_study(directions=["maximize", "minimize"])
    drawn, _ = space.sample(optuna.trial.FixedTrial({}), 2)
    assert [m.size for m in drawn.modules] == [1, 5]                  # what the space itself decodes
    p = TrialSource(study, space, model_config, None, 2).next()
    assert [(m.form, m.size) for m in p.config.modules] == [("lora", 6)]
    stored = study.trials[0].user_attrs
    assert [m["size"] for m in stored["petl_config"]["modules"]] == [6]
    assert p.deployable == count_parameters(model_config, drawn).deployable == 2 * 2 * 6 * (32 + 32)
