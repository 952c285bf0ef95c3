"""A damaged file read by `train`, `predict` or `convert` is one `error:` line naming the file, exit
status 2, nothing written: a backbone whose weights are cut short, a run whose
``petl_weights.safetensors`` or ``petl_config.json`` is damaged, a tiny-backbone run missing its
``tokenizer/`` (transformers would otherwise ask huggingface.co for it)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import pytest
import yaml
from conftest import TINY_BACKBONE

from petl_nas.app.cli import main

RECORD = {
    "backbone": TINY_BACKBONE,
    "task": "demo_keyword",
    "petl_config": {"modules": [{"form": "lora", "position": "attn", "size": 2}]},
    "recipe": {"lr": 1e-3, "epochs": 1, "batch_size": 16, "max_length": 16},
    "k": 32,
    "search_dev": 16,
}
DIMS = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "vocab_size": 100,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One run of a tiny LoRA, trained once for every row."""
    from petl_nas.deploy.runs import train_record

    out = tmp_path_factory.mktemp("trained") / "out"
    train_record(RECORD, seeds=1, out=out, progress=False, printer=lambda *a: None)
    return out / "seed_0"


def _cut(path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _damaged_backbone(root) -> None:
    """A BERT folder whose model.safetensors stopped after its header's length (a copy cut short)."""
    (root / "bert").mkdir()
    (root / "bert" / "config.json").write_text(json.dumps(DIMS))
    (root / "bert" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film"]))
    (root / "bert" / "model.safetensors").write_bytes(struct.pack("<Q", 4096) + b'{"a": ')


# (id, damage done to the copied run folder "run" or the working folder, argv, words)
CASES = [
    (
        "predict-weights-cut-short",
        lambda r: _cut(r / "run" / "petl_weights.safetensors", 100),
        ["predict", "--run", "run", "--input", "in.txt"],
        "run/petl_weights.safetensors: damaged (its header says",
    ),
    (
        "convert-weights-cut-short",
        lambda r: _cut(r / "run" / "petl_weights.safetensors", 300),
        ["convert", "--run", "run", "--output", "peft", "--to", "peft"],
        "run/petl_weights.safetensors: damaged (",
    ),
    (
        "predict-config-cut-short",
        lambda r: _cut(r / "run" / "petl_config.json", 30),
        ["predict", "--run", "run", "--input", "in.txt"],
        "run/petl_config.json: damaged (not JSON: ",
    ),
    (
        "convert-config-not-a-run",
        lambda r: (r / "run" / "petl_config.json").write_text("[1, 2]"),
        ["convert", "--run", "run", "--output", "peft", "--to", "merged"],
        "run/petl_config.json: damaged (no petl_config in it)",
    ),
    (
        "predict-tiny-run-without-tokenizer",
        lambda r: shutil.rmtree(r / "run" / "tokenizer"),
        ["predict", "--run", "run", "--input", "in.txt"],
        "run: a run on a tiny backbone keeps its tokenizer in tokenizer/, and it is missing",
    ),
    (
        "convert-tiny-run-without-tokenizer",
        lambda r: shutil.rmtree(r / "run" / "tokenizer"),
        ["convert", "--run", "run", "--output", "peft", "--to", "peft"],
        "tokenizer/, and it is missing",
    ),
    (
        "predict-backbone-damaged",
        _damaged_backbone,
        ["predict", "--run", "run", "--backbone", "bert", "--input", "in.txt"],
        "model 'bert': model.safetensors is damaged (its header says 4,096 header bytes",
    ),
    (
        "train-backbone-damaged",
        _damaged_backbone,
        ["train", "--config", "bert.yaml", "--out", "out"],
        "model 'bert': model.safetensors is damaged (its header says 4,096 header bytes",
    ),
]


def _snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("damage, argv, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_file_is_one_line_naming_it(trained, tmp_path, monkeypatch, capsys, damage, argv, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "run")
    (tmp_path / "in.txt").write_text("a red film\n")
    (tmp_path / "bert.yaml").write_text(yaml.safe_dump({**RECORD, "backbone": "bert"}))
    damage(tmp_path)
    before = _snapshot(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("petl-nas: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "huggingface.co" not in err
    assert _snapshot(tmp_path) == before


def test_a_sound_run_predicts(trained, tmp_path, monkeypatch, capsys):
    """The rows above damage a run that works: undamaged, it answers."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "run")
    (tmp_path / "in.txt").write_text("a red film\n")
    assert main(["predict", "--run", "run", "--input", "in.txt"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "a red film"
