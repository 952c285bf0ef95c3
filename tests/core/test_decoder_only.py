"""Decoder-only backbones on tiny random GPT-2 and Llama configs: sequence classification with a
tokenizer that has no pad token, causal-LM encoding (loss on the response only), training that
moves only PETL parameters, perplexity against the model's own loss, local files, and
`petl-nas train` / load / predict for a causal-LM task."""

import copy
import json
import math

import pytest
import torch

from petl_nas import ConfigError
from petl_nas.core.config import ModuleSpec, PetlConfig
from petl_nas.core.inject import apply_petl
from petl_nas.core.tiny import tiny_backbone, tiny_tokenizer
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.tasks.causal_lm import encode_rows, ensure_pad_token, evaluate_lm, tiny_causal_lm
from petl_nas.tasks.encoding import encode
from petl_nas.training.loading import TrainData, load_backbone
from petl_nas.training.loop import Recipe, train, training_loss

WORDS = "red blue green fox dog cat sun moon".split()


def bpe_tokenizer(texts):
    """A GPT-2-style byte-level BPE tokenizer with an end token and no pad token, trained in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


@pytest.fixture
def instruction_files(tmp_path):
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(120):
        words = [WORDS[i] for i in torch.randperm(len(WORDS), generator=g)[:3].tolist()]
        rows.append({"prompt": f"repeat: {' '.join(words)} =>", "response": " ".join(words)})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:100]))
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[100:]))
    return {"train": str(tmp_path / "train.jsonl"), "dev": str(tmp_path / "dev.jsonl"), "kind": "causal_lm"}


def test_gpt2_classifier_pads_with_the_end_token_and_reads_the_last_real_token():
    splits = load_splits("demo_sentiment", k=64, search_dev_size=16)
    tok = bpe_tokenizer(splits.train.texts[0])
    model = tiny_backbone("gpt2", num_labels=2, tokenizer=tok, vocab_size=len(tok))
    with pytest.raises(ConfigError, match="has no pad token"):
        encode(splits, tok, max_length=24)
    ensure_pad_token(model, tok)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id
    batch = next(encode(splits, tok, max_length=24).train.batches(8))
    assert (batch["attention_mask"] == 0).any()  # rows of different lengths
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    for j in range(8):
        n = int(batch["attention_mask"][j].sum())
        alone = model(input_ids=batch["input_ids"][j : j + 1, :n]).logits
        assert torch.allclose(logits[j], alone[0], atol=1e-5)  # padding changes nothing


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "opt"])
def test_decoder_classification_trains_only_petl_and_the_head(model_type):
    from petl_nas.tasks import get_task

    task = get_task("demo_sentiment")
    splits = load_splits(task, k=96, search_dev_size=32)
    tiny = {
        "tiny": {
            "model_type": model_type,
            "vocab_size": 200,
            **({"num_key_value_heads": 2} if model_type == "llama" else {}),
        }
    }
    base, tok = load_backbone(tiny, task, splits)
    encoded = encode(splits, tok, max_length=24)
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(form="lora", position="attn", size=4),)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = train(
        model, TrainData(encoded.train, encoded.search_dev), task, Recipe(lr=1e-2, epochs=1, batch_size=16), "cpu"
    )
    # The score is the trained model's accuracy on the scoring split, worked out here from its logits.
    dev = next(encoded.search_dev.batches(len(encoded.search_dev)))
    labels = dev.pop("labels")
    with torch.no_grad():
        predicted = model.eval()(**dev).logits.argmax(-1)
    assert len(result.history) == 1  # one evaluation: the final model
    assert result.score == result.last_score == pytest.approx((predicted == labels).float().mean().item())
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith(("petl.", "score.")) for n in moved)
    assert any(n.startswith("score.") for n in moved)


def test_causal_lm_encoding_labels_only_the_response():
    wordpiece = tiny_tokenizer(["repeat: red fox => red fox", "a b c d e f g h"], vocab_size=60)
    ids, labels = encode_rows(["repeat: red fox =>", ""], ["red fox", "a b"], wordpiece, max_length=32)
    cls, sep = wordpiece.cls_token_id, wordpiece.sep_token_id
    prompt = wordpiece("repeat: red fox =>", add_special_tokens=False)["input_ids"]
    response = wordpiece("red fox", add_special_tokens=False)["input_ids"]
    assert ids[0] == [cls] + prompt + response + [sep]
    assert labels[0] == [-100] * (1 + len(prompt)) + response + [sep]
    assert labels[1] == [-100] + ids[1][1:]  # plain text: every token but the start

    bpe = bpe_tokenizer(["repeat: red fox => red fox"])  # GPT-2 style: no start token
    ids, labels = encode_rows(["repeat: red fox =>"], [" red fox"], bpe, max_length=32)
    assert ids[0][-1] == labels[0][-1] == bpe.eos_token_id
    assert labels[0][0] == -100 and ids[0][0] != bpe.bos_token_id

    long_prompt, long_response = " ".join(["red fox"] * 20), " ".join(["blue dog"] * 20)
    ids, labels = encode_rows([long_prompt], [long_response], wordpiece, max_length=10)
    kept = [t for t in labels[0] if t != -100]
    assert len(ids[0]) == 10 and len(kept) >= (10 - 1) // 2 and labels[0][:2] == [-100, -100]


def test_tiny_decoders_take_the_tiny_sizes_in_their_own_names():
    """GPT-2's FFN is n_inner and OPT's ffn_dim; OPT would embed at 512 and project up."""
    gpt2, opt = tiny_causal_lm("gpt2"), tiny_causal_lm("opt")
    assert (gpt2.config.n_inner, opt.config.ffn_dim, opt.config.word_embed_proj_dim) == (64, 64, 32)
    assert opt.model.decoder.project_in is None


@pytest.mark.parametrize("model_type,form", [("gpt2", "prefix"), ("llama", "lora"), ("opt", "prefix")])
def test_causal_lm_training_moves_only_petl(instruction_files, model_type, form):
    task = resolve_task(instruction_files)
    assert (task.kind, task.text_columns, task.label_column, task.main_metric) == (
        "causal_lm",
        ("prompt",),
        "response",
        "token_accuracy",
    )
    splits = load_splits(task, search_dev_size=20)
    tiny = {
        "tiny": {
            "model_type": model_type,
            "vocab_size": 120,
            **({"num_key_value_heads": 2} if model_type == "llama" else {}),
        }
    }
    base, tok = load_backbone(tiny, task, splits)
    encoded = encode(splits, tok, max_length=24)
    spec = ModuleSpec(form=form, size=4, **({"reparam": 16} if form == "prefix" else {"position": "attn"}))
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(spec,)))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert any("lm_head" in n or "wte" in n or "embed_tokens" in n for n in frozen)  # the LM head stays frozen
    batch = next(encoded.train.batches(64))
    with torch.no_grad():
        before = training_loss(model.eval(), batch, task).item()
    result = train(
        model, TrainData(encoded.train, encoded.search_dev), task, Recipe(lr=1e-2, epochs=3, batch_size=16), "cpu"
    )
    with torch.no_grad():
        after = training_loss(model.eval(), batch, task).item()
    assert after < before - 0.05
    assert set(result.metrics) >= {"token_accuracy", "perplexity"}
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert all(n.startswith("petl.") for n, p in model.named_parameters() if p.requires_grad)

    dev = encoded.search_dev  # one batch: the model's own mean loss
    whole = next(dev.batches(len(dev)))
    with torch.no_grad():
        out = model(**whole)
    own = out.loss.item()
    assert evaluate_lm(model, dev, task, len(dev), "cpu")["perplexity"] == pytest.approx(math.exp(own), rel=1e-4)
    # The last evaluation scored the trained model: its token accuracy, from the logits here (token t
    # predicts token t+1, counted on the response tokens only).
    targets, guesses = whole["labels"][:, 1:], out.logits[:, :-1].argmax(-1)
    scored = targets != -100
    token_accuracy = (guesses[scored] == targets[scored]).float().mean().item()
    assert result.last_score == result.history[-1]["token_accuracy"] == pytest.approx(token_accuracy)


def test_causal_lm_file_columns(tmp_path):
    (tmp_path / "text.jsonl").write_text('{"text": "red fox"}\n{"text": "blue dog"}\n{"text": "sun"}\n')
    task = resolve_task(
        {"train": str(tmp_path / "text.jsonl"), "dev": str(tmp_path / "text.jsonl"), "kind": "causal_lm"}
    )
    assert (task.text_columns, task.label_column) == ((), "text")
    splits = load_splits(task, search_dev_size=1)
    assert splits.train.texts == () and set(splits.test.labels) == {"red fox", "blue dog", "sun"}
    (tmp_path / "blank.jsonl").write_text('{"prompt": "say", "response": "it"}\n{"prompt": "say", "response": " "}\n')
    blank = resolve_task(
        {"train": str(tmp_path / "blank.jsonl"), "dev": str(tmp_path / "blank.jsonl"), "kind": "causal_lm"}
    )
    with pytest.raises(ConfigError, match=r"blank\.jsonl, row 2: 'response' is empty"):  # nothing to learn there
        load_splits(blank, search_dev_size=1)

    (tmp_path / "qa.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ConfigError) as err:
        resolve_task({"train": str(tmp_path / "qa.jsonl"), "dev": str(tmp_path / "qa.jsonl"), "kind": "causal_lm"})
    assert "\n" not in str(err.value) and str(err.value).endswith(
        "qa.jsonl: a causal_lm file needs 'prompt' and 'response' columns or a 'text' column "
        "(columns: question, answer)"
    )
    explicit = resolve_task(
        {
            "train": str(tmp_path / "qa.jsonl"),
            "dev": str(tmp_path / "qa.jsonl"),
            "kind": "causal_lm",
            "text_columns": ["question"],
            "label_column": "answer",
        }
    )
    assert (explicit.text_columns, explicit.label_column) == (("question",), "answer")


def test_train_record_and_predict_for_a_causal_lm(tmp_path, instruction_files):
    from petl_nas.deploy.runs import load, predict, train_record

    config = PetlConfig(modules=(ModuleSpec(form="lora", position="attn", size=4),))
    rec = {
        "backbone": {"tiny": {"model_type": "gpt2", "vocab_size": 120}},
        "task": instruction_files,
        "data_dir": None,
        "data_seed": 111,
        "k": None,
        "petl_config": config.to_dict(),
        "seeds": 1,
        "counts": {},
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": 24},
    }
    summary = train_record(rec, out=tmp_path / "out", progress=False, printer=lambda *a: None, keep_models=True)
    trained = summary.pop("models")[0].eval()
    assert summary["metric"] == "token_accuracy"
    loaded = load(None, tmp_path / "out" / "seed_0")
    batch = next(
        encode(load_splits(resolve_task(instruction_files), search_dev_size=1), loaded.petl_tokenizer, 24).test.batches(
            8
        )
    )
    assert torch.allclose(loaded(**batch).logits, trained(**batch).logits, atol=1e-5)
    preds = predict(loaded, [("repeat: red fox sun =>",), ("repeat: cat =>",)])
    assert len(preds) == 2 and all(isinstance(p["generated"], str) for p in preds)


def test_a_family_without_a_classifier_is_refused_before_anything_trains(tmp_path, capsys, instruction_files):
    """transformers has no sequence classifier for Granite: a classification search on it is one
    error line naming the family and what to use it for, before a study exists (not a ValueError in
    every trial); as a causal LM it loads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from petl_nas.app.cli import main

    tok = tiny_tokenizer(["a fine film", "a dull plot"], vocab_size=60)
    AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "granite",
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(tmp_path / "granite")
    tok.save_pretrained(tmp_path / "granite")
    capsys.readouterr()
    db = tmp_path / "s.db"
    code = main(
        [
            "search",
            "--model",
            str(tmp_path / "granite"),
            "--task",
            "demo_sentiment",
            "--budget",
            "5%",
            "--trials",
            "1",
            "--executor",
            "local",
            "--storage",
            f"sqlite:///{db}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not db.exists()
    assert "(granite): transformers has no sequence-classification head for this family" in err[0]
    assert "use it for a causal_lm task, or another backbone" in err[0]
    with pytest.raises(ConfigError, match="no sequence-classification head"):
        load_backbone({"tiny": {"model_type": "granite"}}, resolve_task("demo_sentiment"))
    model, _ = load_backbone(str(tmp_path / "granite"), resolve_task(instruction_files))
    assert model.config.model_type == "granite"
    with pytest.raises(
        ConfigError,
        match=r"\(granite\): transformers has no sequence-to-sequence LM head .* use it "
        r"for a causal_lm task, or another backbone$",
    ):
        load_backbone({"tiny": {"model_type": "granite"}}, resolve_task("demo_copy"))
    with pytest.raises(
        ConfigError,
        match=r"\(bart\) is an encoder-decoder: a causal_lm task needs a decoder-only "
        r"model \(GPT-2, Llama, ...\); use it for a seq2seq task",
    ):
        load_backbone({"tiny": {"model_type": "bart"}}, resolve_task(instruction_files))


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_a_language_models_counts_are_the_budgets(model_type):
    """A causal LM with an untied head counts against the same backbone as the search's budget
    (`count_parameters`: the base model), its frozen LM head in neither the backbone nor the head."""
    from petl_nas import count_model, count_parameters, preset

    model = tiny_causal_lm(model_type, tie_word_embeddings=False)
    config = preset("lora", model.config)
    counted, budgeted = count_model(apply_petl(model, config)), count_parameters(model.config, config)
    assert (
        counted.backbone
        == budgeted.backbone
        == sum(p.numel() for p in model.base_model.parameters() if not p.requires_grad)
    )
    assert counted.deployable == budgeted.deployable and counted.deployable_pct == budgeted.deployable_pct
    assert counted.head == 0  # the untied LM head is pretrained and frozen: no head trains
