"""The task head in the configuration: pooling (auto, cls, mean, pooler, pooler_trained), head dropout
and learning rate; what each pooling feeds the classifier, its counts, and its round trip."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings

import pytest
import torch
from conftest import batch, tiny_config, tiny_model
from transformers import GPT2Config, GPT2ForSequenceClassification

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_model, load_petl, save_petl
from petl_nas.core import head
from petl_nas.core.budget import count_parameters
from petl_nas.core.models import load_classifier
from petl_nas.training.loop import Recipe, param_groups

LORA = (ModuleSpec(form="lora", size=2),)


def config(**head) -> PetlConfig:
    return PetlConfig(modules=LORA, **head)


def sentence_transformers_checkpoint(tmp_path, mode="mean"):
    """A tiny BERT saved with a sentence-transformers pooling config, as all-MiniLM-L6-v2 ships."""
    path = tmp_path / "st"
    tiny_model().save_pretrained(path)
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": mode == "mean", "pooling_mode_cls_token": mode == "cls"})
    )
    return path


def hidden_and_logits(model, x):
    with torch.no_grad():
        out = model(**x, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


def masked_mean(h, mask):
    m = mask.unsqueeze(-1).float()
    return (h * m).sum(1) / m.sum(1)


def test_bert_head_reads_what_pooling_says(tmp_path):
    x = batch()
    base = tiny_model()
    with torch.no_grad():
        native = base(**x).logits
    for pooling in ("cls", "mean", "pooler", "pooler_trained"):
        model = apply_petl(copy.deepcopy(base), config(pooling=pooling))
        h, logits = hidden_and_logits(model, x)
        read = {"cls": h[:, 0], "mean": masked_mean(h, x["attention_mask"])}.get(pooling)
        expected = native if read is None else model.classifier(read)
        assert torch.allclose(logits, expected, atol=1e-6), pooling
    assert not torch.allclose(native, hidden_and_logits(apply_petl(copy.deepcopy(base), config(pooling="mean")), x)[1])


def test_auto_follows_a_sentence_transformers_checkpoint(tmp_path):
    for mode in ("mean", "cls"):
        path = sentence_transformers_checkpoint(tmp_path / mode, mode)
        model = apply_petl(load_classifier(str(path)), config())
        assert model.petl.pooling == mode
    assert apply_petl(tiny_model(), config()).petl.pooling == "pooler"  # BERT's own head
    assert apply_petl(tiny_model("roberta"), config()).petl.pooling == "cls"  # RoBERTa's own head


def test_first_token_heads_pool_at_position_zero():
    x = batch("roberta")
    model = apply_petl(tiny_model("roberta"), config(pooling="mean"))
    h, logits = hidden_and_logits(model, x)
    pooled = masked_mean(h, x["attention_mask"])
    assert torch.allclose(logits, model.classifier(torch.cat([pooled[:, None], h[:, 1:]], 1)), atol=1e-6)
    with pytest.raises(ConfigError, match="roberta classifier has no pooler; accepted: auto, cls, mean"):
        apply_petl(tiny_model("roberta"), config(pooling="pooler_trained"))


def test_mean_pooling_ignores_padding():
    model = apply_petl(tiny_model(), config(pooling="mean"))
    x = batch()
    keep = int(x["attention_mask"][-1].sum())
    with torch.no_grad():
        padded = model(**x).logits[-1]
        alone = model(input_ids=x["input_ids"][-1:, :keep], attention_mask=x["attention_mask"][-1:, :keep]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def test_a_trained_pooler_is_head_not_budget():
    base = tiny_model()
    d, labels = base.config.hidden_size, base.config.num_labels
    frozen, trained = (
        count_parameters(base.config, config(pooling=p), num_labels=labels) for p in ("pooler", "pooler_trained")
    )
    assert frozen.head == d * labels + labels  # the classifier
    assert trained.head == frozen.head + d * d + d  # + the pooler's dense layer
    assert trained.deployable == frozen.deployable and trained.backbone == frozen.backbone
    model = apply_petl(copy.deepcopy(base), config(pooling="pooler_trained"))
    assert count_model(model).head == trained.head
    assert all(p.requires_grad for p in model.bert.pooler.parameters())
    assert not any(p.requires_grad for p in apply_petl(copy.deepcopy(base), config()).bert.pooler.parameters())


def test_an_untrained_frozen_pooler_is_named_with_the_fix():
    base = tiny_model()
    with torch.no_grad():
        base.bert.pooler.dense.bias.zero_()  # as all-MiniLM-L6-v2's
    head._WARNED.clear()
    with pytest.warns(UserWarning, match="frozen pooler looks untrained .* set pooling: mean"):
        apply_petl(copy.deepcopy(base), config(pooling="pooler"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_petl(copy.deepcopy(base), config(pooling="mean"))  # no warning: not read


def test_resolved_pooling_is_saved_and_old_saves_keep_their_head(tmp_path):
    path = sentence_transformers_checkpoint(tmp_path)
    model = apply_petl(load_classifier(str(path)), config())
    x = batch()
    ours = hidden_and_logits(model, x)[1]
    save_petl(model, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "petl_config.json").read_text())["petl_config"]["pooling"] == "mean"
    elsewhere = tiny_model()  # no 1_Pooling here
    elsewhere.load_state_dict(load_classifier(str(path)).state_dict())
    assert torch.allclose(hidden_and_logits(load_petl(elsewhere, tmp_path / "saved"), x)[1], ours, atol=1e-6)
    # a directory saved before pooling was configurable: its classifier was trained on the native head
    meta = json.loads((tmp_path / "saved" / "petl_config.json").read_text())
    del meta["petl_config"]["pooling"]
    (tmp_path / "saved" / "petl_config.json").write_text(json.dumps(meta))
    assert load_petl(tiny_model(), tmp_path / "saved").petl.pooling == "pooler"


def test_head_learning_rate_and_dropout():
    model = apply_petl(tiny_model(), config(head_lr_mult=10.0, head_dropout=0.3))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = param_groups(model, params, Recipe(lr=1e-3))
    head = {id(p) for p in model.classifier.parameters()}
    for g in groups:
        in_head = {id(p) in head for p in g["params"]}
        assert len(in_head) == 1 and g["lr"] == (1e-2 if in_head.pop() else 1e-3)
    assert sum(len(g["params"]) for g in groups) == len(params)
    assert model.dropout.p == 0.3 and model.bert.embeddings.dropout.p == 0.1  # only the head's dropout


def test_other_families_keep_their_own_head():
    """A decoder classifier reads its last token whatever the space says: one space serves every backbone."""
    gpt2 = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=4, pad_token_id=0)
    ).eval()
    x = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with torch.no_grad():
        native = gpt2(**x).logits
        for pooling in ("auto", "mean", "cls"):
            model = apply_petl(copy.deepcopy(gpt2), config(pooling=pooling))
            assert model.petl.pooling == "native" and torch.equal(model(**x).logits, native)


def test_bad_head_values_name_the_field():
    with pytest.raises(ConfigError, match="pooling: unknown value 'max'.*accepted: auto, cls, mean"):
        PetlConfig(pooling="max")
    with pytest.raises(ConfigError, match="head_dropout: must be in"):
        PetlConfig(head_dropout=1.5)
    with pytest.raises(ConfigError, match="head_lr_mult: must be a positive number"):
        PetlConfig(head_lr_mult=0)
    assert PetlConfig.from_dict(config(pooling="mean", head_lr_mult=3).to_dict()) == config(
        pooling="mean", head_lr_mult=3
    )


def test_interop_names_the_head_it_cannot_express(tmp_path):
    from transformers import AutoConfig

    from petl_nas.deploy.interop import NotExpressible, to_adapters, to_peft

    lora = PetlConfig(modules=(ModuleSpec(form="lora", size=8, composition="scaled", scale=2.0),))
    bert = tiny_model().config
    assert to_peft(lora, bert)["peft_type"] == "LORA"  # the model's own head
    assert to_peft(dataclasses.replace(lora, pooling="pooler_trained"), bert)["modules_to_save"] == [
        "classifier",
        "pooler",
    ]
    with pytest.raises(NotExpressible, match="pooling: mean"):
        to_peft(dataclasses.replace(lora, pooling="mean"), bert)
    with pytest.raises(NotExpressible, match="pooling: mean .AdapterHub"):
        to_adapters(dataclasses.replace(lora, pooling="mean"), 32, 3)
    # auto on a sentence-transformers checkpoint reads mean pooling: PEFT's stock head would not
    st = AutoConfig.from_pretrained(sentence_transformers_checkpoint(tmp_path))
    with pytest.raises(NotExpressible, match=r"pooling: mean \(PEFT trains the model's own head"):
        to_peft(lora, st)


def test_export_writes_the_pooling_auto_resolved_to(tmp_path):
    """A search trial records what `auto` read; the exported record trains that head anywhere."""
    import optuna
    from optuna.distributions import FloatDistribution

    from petl_nas.deploy.export import record

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("backbone", json.dumps("x"))
    trial = optuna.trial.create_trial(
        params={"lr": 1e-3},
        distributions={"lr": FloatDistribution(1e-4, 1e-2)},
        values=[0.9, 10],
        user_attrs={
            "petl_config": config().to_dict(),
            "pooling": "mean",
            "deployable": 10,
            "trainable": 10,
            "recipe": {"lr": 1e-3},
        },
    )
    study.add_trial(trial)
    assert record(study, study.trials[0]).petl_config["pooling"] == "mean"


def _regression_files(tmp_path, offset: float):
    """A regression task whose label is ``offset`` plus the count of 'good' in the text."""
    import csv

    rows = [["text", "label"]] + [
        [" ".join(["good"] * (i % 4) + ["plot"] * (3 - i % 4) + [f"w{i % 7}"]), f"{offset + i % 4:.1f}"]
        for i in range(64)
    ]
    for name in ("train", "dev"):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows(rows)
    from petl_nas.tasks import file_task

    return file_task(tmp_path / "train.csv", tmp_path / "dev.csv", text_columns=["text"], kind="regression")


def test_a_new_regression_head_starts_at_the_training_mean(tmp_path):
    from petl_nas.tasks import load_splits
    from petl_nas.tasks.encoding import encode
    from petl_nas.training.loading import TrainData, load_backbone
    from petl_nas.training.loop import train

    task = _regression_files(tmp_path, offset=40.0)
    splits = load_splits(task, search_dev_size=16)
    base, tok = load_backbone({"tiny": {"vocab_size": 200}}, task, splits)
    encoded = encode(splits, tok, max_length=16)
    model = apply_petl(copy.deepcopy(base), config(pooling="mean"))
    assert float(model.classifier.bias.detach()) == 0.0  # as transformers made it
    mean = float(encoded.train.labels.mean())
    lr, epochs = 1e-3, 1
    result = train(
        model, TrainData(encoded.train, encoded.search_dev), task, Recipe(lr=lr, epochs=epochs, batch_size=16), "cpu"
    )
    # AdamW moves the bias about lr per step: it started at the mean, not at 0.
    assert abs(float(model.classifier.bias.detach()) - mean) <= 2 * lr * result.steps
    with torch.no_grad():
        dev = next(encoded.search_dev.batches(len(encoded.search_dev)))
        dev.pop("labels")
        assert float(model.eval()(**dev).logits.mean()) == pytest.approx(mean, abs=2.0)


def test_a_trained_or_biasless_regression_head_is_left_as_it_is():
    model = tiny_model(num_labels=1)
    with torch.no_grad():
        model.classifier.bias.fill_(0.5)
    assert not head.start_regression_at_mean(model, 40.0) and float(model.classifier.bias.detach()) == 0.5
    model.classifier.bias.data.zero_()
    assert head.start_regression_at_mean(model, 40.0) and float(model.classifier.bias.detach()) == 40.0
    torch.manual_seed(0)
    gpt2 = GPT2ForSequenceClassification(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, num_labels=1))
    assert gpt2.score.bias is None and not head.start_regression_at_mean(gpt2, 40.0)


def test_bitfit_beside_a_trained_pooler_counts_the_poolers_bias_once():
    """Its bias moves from BitFit's deployable row to the head, and the counts add up to what the
    model trains."""
    cfg = tiny_config("bert")
    d = cfg.hidden_size
    frozen = count_parameters(cfg, PetlConfig(bitfit=True, pooling="pooler"))
    trained = count_parameters(cfg, PetlConfig(bitfit=True, pooling="pooler_trained"))
    assert trained.deployable == frozen.deployable - d
    assert trained.head == frozen.head + d * d + d
    model = apply_petl(tiny_model("bert"), PetlConfig(bitfit=True, pooling="pooler_trained"))
    assert trained.trainable + trained.head == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_weight_decay_falls_on_matrices_only():
    """AdamW's decay applies to weight matrices, never to biases, LayerNorms or a gate's scalars."""
    model = apply_petl(tiny_model(), config(head_lr_mult=10.0, pooling="mean"))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = param_groups(model, params, Recipe(lr=1e-3, weight_decay=0.05))
    for g in groups:
        assert {p.ndim >= 2 for p in g["params"]} == {g["weight_decay"] == 0.05}
    assert {g["weight_decay"] for g in groups} == {0.05, 0.0}


def test_trained_layernorms_beside_a_trained_pooler_leave_the_pooler_to_the_head():
    """The pooler trains with the head: never in the layernorms' deployable row."""
    cfg = tiny_config("bert")
    d = cfg.hidden_size
    frozen = count_parameters(cfg, PetlConfig(train_layernorms=True, pooling="pooler"))
    trained = count_parameters(cfg, PetlConfig(train_layernorms=True, pooling="pooler_trained"))
    assert trained.deployable == frozen.deployable and trained.head == frozen.head + d * d + d
    model = apply_petl(tiny_model("bert"), PetlConfig(train_layernorms=True, pooling="pooler_trained"))
    assert trained.trainable + trained.head == sum(p.numel() for p in model.parameters() if p.requires_grad)
