"""Loading a backbone from a local directory: transformers' per-load key table and progress bar are
silenced (a new task head is always "missing"), while body weights absent from the checkpoint are
still reported, in one line."""

import logging

import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel
from transformers.utils import logging as hf_logging

from petl_nas.core.models import load_classifier

TINY = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)


def saved_body(tmp_path, drop=()):
    torch.manual_seed(0)
    BertModel(TINY).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if k not in drop}, tmp_path / "model.safetensors", metadata={"format": "pt"}
    )
    return weights


def test_a_new_head_loads_quietly_and_keeps_the_pretrained_body(tmp_path, caplog, capfd):
    weights = saved_body(tmp_path)
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    with caplog.at_level(logging.INFO):
        model = load_classifier(str(tmp_path), num_labels=3)
    assert model.classifier.out_features == 3
    assert torch.equal(model.bert.encoder.layer[1].output.dense.weight, weights["encoder.layer.1.output.dense.weight"])
    assert "LOAD REPORT" not in capfd.readouterr().err + caplog.text and "start random" not in caplog.text
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == (verbosity, bar)  # restored


def test_body_weights_missing_from_the_checkpoint_are_named(tmp_path, caplog):
    saved_body(tmp_path, drop=("encoder.layer.1.output.dense.weight",))
    with caplog.at_level(logging.WARNING, logger="petl_nas.core.models"):
        load_classifier(str(tmp_path), num_labels=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "petl_nas.core.models"]
    assert len(lines) == 1 and "1 backbone weights were not in the checkpoint" in lines[0]
    assert "bert.encoder.layer.1.output.dense.weight" in lines[0]
