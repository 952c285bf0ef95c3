"""Bad input to `petl-nas search`: one clear `error:` line naming the problem, exit status 2, and
nothing written — no study created or changed, no file or folder made.

One table, one row per mistake a user makes; each row runs the real CLI in this process on a
fresh folder holding the files it needs, and compares every file's bytes before and after."""

from __future__ import annotations

import hashlib
import json
import socket

import pytest
from conftest import TINY_BACKBONE

from petl_nas.app.cli import main

BASE = {
    "name": "bad",
    "backbone": TINY_BACKBONE,
    "task": "demo_sentiment",
    "budget": "5%",
    "space": "small",
    "trials": 2,
    "presets": "none",
    "executor": "local",
    "storage": "sqlite:///study.db",
    "fidelity": {"k": 80, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
    "final": {"seeds": 0, "baselines": False},
}
DIMS = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100}
SMALL_SPACE = """version: 1
name: mine
slots:
  attn: {site: attn, forms: [none, lora]}
  ffn: {site: ffn, forms: [none, adapter]}
bottleneck: {low: 2, high: 16, log: true}
rank: {low: 1, high: 8, log: true}
scale: 1.0
lr: {low: 3.0e-3, high: 3.0e-2, log: true}
"""
RATES = {
    "rates": {"lora": 3e-3, "adapter": 1e-3},
    "scales": {"lora": 2.0, "adapter": 1.0},
    "factor": 1.0,
    "backbone": json.dumps(TINY_BACKBONE),
    "task": "demo_sentiment",
    "families": {"lora": {"prior": 5e-4, "probe": "lora", "rate": 3e-3, "tried": [[3e-3, 0.8]]}},
}
SST2_TRAIN = "sentence\tlabel\n" + "".join(
    f"a {'good' if i % 2 else 'bad'} film number {i}\t{i % 2}\n" for i in range(60)
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exp(**changes) -> str:
    return json.dumps({**BASE, **changes})  # JSON is YAML


def space(old: str, new: str) -> str:
    assert old in SMALL_SPACE
    return SMALL_SPACE.replace(old, new)


# (id, files to create first, arguments after `search`, words the error line must contain)
CASES = [
    ("model-missing", {}, ["--model", "/no/such/bert"], "model '/no/such/bert': no such local directory\n"),
    (
        "model-folder-not-a-model",
        {"notes/readme.txt": "hi"},
        ["--model", "notes"],
        "notes': not a transformers model directory (no config.json that transformers reads)",
    ),
    (
        "model-architecture",
        {"albert/config.json": json.dumps({"model_type": "albert", **DIMS})},
        ["--model", "albert"],
        "model type 'albert' has no backbone spec",
    ),
    (
        "model-without-weights",
        {"bert/config.json": json.dumps({"model_type": "bert", **DIMS})},
        ["--model", "bert"],
        "bert': the folder has no weights",
    ),
    (
        "model-without-tokenizer",
        {"bert/config.json": json.dumps({"model_type": "bert", **DIMS}), "bert/model.safetensors": ""},
        ["--model", "bert"],
        "bert': the folder has no tokenizer files",
    ),
    ("model-weights-cut-short", "truncated-minilm", ["--model", "minilm"], "minilm': model.safetensors is damaged ("),
    (
        "max-length-beyond-positions",
        {"e.yaml": exp(fidelity={**BASE["fidelity"], "max_length": 100_000_000})},
        [],
        "fidelity.max_length 100,000,000 is more than the 514 positions this backbone (bert) can read: "
        "give at most 514",
    ),
    (
        "name-escapes-runs",
        {},
        ["--name", "../../../escaped"],
        "name: expected a plain name of letters, digits, '.', '_' or '-' (it names the folder runs/NAME), got "
        "'../../../escaped'",
    ),
    ("name-absolute", {}, ["--name", "/tmp/elsewhere"], "name: expected a plain name"),
    ("name-in-file", {"e.yaml": exp(name="a/b")}, [], "e.yaml: name: expected a plain name"),
    ("budget-count-over-all", {}, ["--budget", "1e12"], "budget: '1e12' is more than the whole backbone ("),
    (
        "experiment-latin-1",
        {"e.yaml": "name: caf\u00e9\n".encode("latin-1")},
        [],
        "e.yaml: not UTF-8 text (byte 0xe9 on line 1); save it as UTF-8",
    ),
    (
        "task-file-on-the-command-line",
        {},
        ["--task", "train.csv"],
        "a task over your own files is a mapping in the experiment file: task: {train: ..., dev: ..., ",
    ),
    ("space-missing", {}, ["--space", "nope"], "space 'nope': no such file"),
    ("space-unknown-key", {"s.yaml": SMALL_SPACE + "colour: blue\n"}, ["--space", "s.yaml"], "unknown key 'colour'"),
    (
        "space-wrong-type",
        {"s.yaml": space("low: 2, high: 16", "low: two, high: 16")},
        ["--space", "s.yaml"],
        "low and high must be numbers",
    ),
    (
        "space-empty-choices",
        {"s.yaml": space("forms: [none, adapter]", "forms: []")},
        ["--space", "s.yaml"],
        "empty choice list",
    ),
    (
        "space-min-over-max",
        {"s.yaml": space("low: 1, high: 8", "low: 8, high: 1")},
        ["--space", "s.yaml"],
        "low (8) is greater than high (1)",
    ),
    (
        "budget-below-smallest",
        {},
        ["--space", "mam", "--budget", "10"],
        "budget 10 is below the smallest configuration",
    ),
    ("budget-admits-no-module", {}, ["--budget", "10"], "budget 10 admits no PETL module of space 'small'"),
    ("budget-space", {}, ["--budget", "0.5 %"], "budget: '0.5 %' is not a count"),
    ("budget-exponent", {}, ["--budget", "5e"], "budget: '5e' is not a count"),
    ("budget-negative", {}, ["--budget=-1"], "budget: '-1' is not a count"),
    ("budget-over-all", {}, ["--budget", "200%"], "budget: '200%' is more than the whole backbone"),
    ("task-unknown", {}, ["--task", "sst3"], "unknown task 'sst3' (did you mean 'sst2'?)"),
    ("data-dir-empty", {"glue/.keep": ""}, ["--task", "sst2", "--data-dir", "glue"], "expected file"),
    (
        "data-missing-column",
        {"glue/SST-2/train.tsv": SST2_TRAIN.replace("label\n", "stars\n", 1), "glue/SST-2/dev.tsv": SST2_TRAIN},
        ["--task", "sst2", "--data-dir", "glue"],
        "missing 'label'",
    ),
    (
        "data-label-outside",
        {"glue/SST-2/train.tsv": SST2_TRAIN + "an odd film\t7\n", "glue/SST-2/dev.tsv": SST2_TRAIN},
        ["--task", "sst2", "--data-dir", "glue"],
        "label '7' is not one of sst2's labels",
    ),
    (
        "file-task-missing",
        {"e.yaml": exp(task={"train": "no.csv", "dev": "no.csv", "text_columns": ["text"]})},
        [],
        "does not exist",
    ),
    ("storage-not-a-url", {}, ["--storage", "just some words"], "is not a database URL"),
    (
        "task-kind-typo",
        {
            "e.yaml": exp(task={"train": "t.csv", "dev": "t.csv", "text_columns": ["text"], "kind": "regresion"}),
            "t.csv": "text,label\na,0.5\n",
        },
        [],
        "kind: unknown value 'regresion' (did you mean 'regression'?); accepted: classification, regression, "
        "seq2seq, causal_lm",
    ),
    (
        "warm-start-missing-file",
        {},
        ["--warm-start", "sqlite:///nothere.db#a"],
        "warm start: storage 'sqlite:///nothere.db': no such file",
    ),  # and no study of this search made
    ("warm-start-not-a-url", {}, ["--warm-start", "notaurl"], "warm start: storage 'notaurl'"),
    ("storage-unknown-driver", {}, ["--storage", "nosuchdb://host/db"], "cannot be opened"),
    (
        "storage-no-server",
        {},
        ["--storage", f"postgresql+psycopg2://u:secret@127.0.0.1:{_free_port()}/db"],
        "cannot be opened",
    ),
    (
        "objective-unknown-in-file",
        {"e.yaml": exp(objectives=["score", "params", "Latency"])},
        [],
        "e.yaml: objectives: unknown objective 'Latency'",
    ),
    ("objectives-empty-flag", {}, ["--objectives", ""], "objectives: expected [score, params] followed by"),
    (
        "oneshot-flag-with-sampler",
        {},
        ["--oneshot-runs", "3"],
        "--oneshot-runs: applies to strategy oneshot or both, and this search's strategy is sampler",
    ),
    ("storage-password-in-query", {}, ["--storage", "nosuchdb://host/db?password=secret"], "cannot be opened"),
    (
        "storage-sslpassword-no-server",
        {},
        ["--storage", f"postgresql+psycopg2://u@127.0.0.1:{_free_port()}/db?sslpassword=secret&application_name=petl"],
        "cannot be opened",
    ),
    (
        "storage-sqlite-missing-with-password",
        {},
        ["--warm-start", "sqlite:///nothere.db?password=secret#a"],
        "warm start: storage 'sqlite:///nothere.db?password=***': no such file",
    ),
    (
        "storage-postgres-alias",
        {},
        ["--storage", "postgres://u:secret@127.0.0.1/db"],
        "SQLAlchemy names PostgreSQL 'postgresql://' (or 'postgresql+psycopg2://'), not 'postgres://'",
    ),
    (
        "storage-bare-postgresql-no-server",
        {},
        ["--storage", f"postgresql://u:secret@127.0.0.1:{_free_port()}/db"],
        "failed: Connection refused",
    ),  # the installed driver, not "failed to import" psycopg 3
    (
        "storage-not-a-database",
        {"notes.db": "just text, not SQLite " * 100},
        ["--storage", "sqlite:///notes.db"],
        "cannot be opened: file is not a database",
    ),
    (
        "storage-unwritable-folder",
        {},
        ["--storage", "sqlite:////proc/petl/study.db"],
        "cannot create folder /proc/petl",
    ),
    (
        "study-other-space",
        "other-study",
        ["--space", "mam", "--budget", "20%"],
        "was made with another space ('small', now 'mam'; hash 0123456789ab, now ",
    ),
    ("experiment-missing", {}, ["--experiment", "nope.yaml"], "experiment 'nope.yaml': no such file"),
    (
        "experiment-not-yaml",
        {"e.yaml": "name: x\nfidelity: {k: 8\nbudget: 1%\n"},
        [],
        "e.yaml: not valid YAML at line 3, column 7: expected ',' or '}', but got ':' (while parsing a flow mapping)",
    ),
    (
        "experiment-key-twice",
        {"e.yaml": "name: x\nbudget: 0.5%\ntrials: 2\nbudget: 1%\n"},
        [],
        "e.yaml: not valid YAML at line 4, column 1: key 'budget' appears twice",
    ),
    (
        "space-key-twice",
        {"s.yaml": SMALL_SPACE + "lr: {low: 1.0e-4, high: 1.0e-2, log: true}\n"},
        ["--space", "s.yaml"],
        "key 'lr' appears twice",
    ),
    ("experiment-empty", {"e.yaml": "\n"}, [], "e.yaml: the file is empty"),
    (
        "experiment-unknown-preset",
        {"e.yaml": exp(presets=["lora", "nosuch"])},
        [],
        "e.yaml: presets: unknown name 'nosuch'",
    ),
    ("experiment-unknown-key", {"e.yaml": exp(trails=3)}, [], "trails: unknown key (did you mean 'trials'?)"),
    ("experiment-wrong-type", {"e.yaml": exp(trials="many")}, [], "trials: expected a whole number >= 1, got 'many'"),
    (
        "trials-zero",
        {},
        ["--trials", "0"],
        "error: trials: expected a whole number >= 1, got 0 (0 only with strategy: oneshot) (from the command line)",
    ),
    ("fidelity-wrong-type", {"e.yaml": exp(fidelity={"k": "all"})}, [], "fidelity: k: expected a whole number"),
    ("k-too-large", {}, ["--k", "100000"], "k (fidelity.k) must be a whole number from 1 to"),
    ("sampler-unknown", {}, ["--sampler", "tpee"], "sampler: unknown name 'tpee' (did you mean 'tpe'?)"),
    ("executor-unknown", {}, ["--executor", "slurm"], "executor: unknown name 'slurm'"),
    ("scheduler-unknown", {}, ["--scheduler", "hyperband"], "scheduler: expected one of asha, fifo"),
    ("preset-unknown", {}, ["--presets", "lora,loar2"], "presets: unknown name 'loar2'"),
    (
        "sampler-presets-none-fits",
        {},
        ["--sampler", "presets", "--presets", "lora,houlsby", "--budget", "300"],
        "sampler: presets trains only presets, and none can train here: over the budget of 300 deployable "
        "parameters: lora (",
    ),
    (
        "ray-address-unreachable",
        {},
        ["--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}"],
        "nothing answers there",
    ),
    (
        "heartbeat-grace-too-short",
        {"e.yaml": exp(heartbeat_interval=30, grace_period=10)},
        [],
        "grace_period: must be longer than heartbeat_interval",
    ),
    (
        "causal-lm-max-length-too-short",
        {
            "e.yaml": exp(
                task={"train": "lm.jsonl", "dev": "lm.jsonl", "kind": "causal_lm"},
                backbone={"tiny": {"model_type": "gpt2", "vocab_size": 100}},
                fidelity={"k": 8, "epochs": 1, "batch_size": 4, "max_length": 2, "search_dev": 4},
            ),
            "lm.jsonl": "".join(json.dumps({"prompt": f"say {i}", "response": f"{i}"}) + "\n" for i in range(20)),
        },
        [],
        "fidelity.max_length 2 leaves no room for a causal_lm task's response: give at least 3",
    ),
    (
        "rates-file-cut-short",
        {"e.yaml": exp(rates={"file": "r.json"}), "r.json": json.dumps(RATES)[:40]},
        [],
        "rates.file 'r.json': cannot be read as a rates file",
    ),
    (
        "rates-file-rate-absurd",
        {
            "e.yaml": exp(rates={"file": "r.json"}),
            "r.json": json.dumps({**RATES, "rates": {"lora": 1e9, "adapter": 1e-3}}),
        },
        [],
        "r.json: rates.lora: expected a number above 0 and at most 1, got 1000000000.0",
    ),
    (
        "rates-file-scale-absurd",
        {"e.yaml": exp(rates={"file": "r.json"}), "r.json": json.dumps({**RATES, "scales": {"lora": 1e6}})},
        [],
        "r.json: scales.lora: expected a number above 0 and at most 1000, got 1000000.0",
    ),
    (
        "main-metric-lower-is-better",
        {
            "e.yaml": exp(
                task={"train": "lm.jsonl", "dev": "lm.jsonl", "kind": "causal_lm", "main_metric": "perplexity"}
            ),
            "lm.jsonl": json.dumps({"prompt": "say", "response": "it"}) + "\n",
        },
        [],
        "main_metric 'perplexity' is lower-is-better",
    ),
]


def _snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _truncated_minilm() -> dict[str, bytes]:
    """The demo MiniLM's folder with its weights cut to half (a copy that stopped)."""
    from pathlib import Path

    from petl_nas.core.models import resolve_model

    source = Path(resolve_model("all-MiniLM-L6-v2"))
    files = {f"minilm/{p.name}": p.read_bytes() for p in source.iterdir() if p.is_file()}
    files["minilm/model.safetensors"] = files["minilm/model.safetensors"][: len(files["minilm/model.safetensors"]) // 2]
    return files


def _make_other_study(root) -> None:
    """A study named like the experiment, made with another space (its hash differs)."""
    import optuna

    from petl_nas.study.storage import close_storage, open_storage

    storage = open_storage(f"sqlite:///{root}/study.db")
    study = optuna.create_study(study_name="bad", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("space_hash", "0123456789ab")
    study.set_user_attr("space_name", "small")
    study.enqueue_trial({"lr": 0.01})
    close_storage(storage)


@pytest.mark.parametrize("files, args, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, files, args, words):
    monkeypatch.chdir(tmp_path)
    if files == "other-study":
        _make_other_study(tmp_path)
        files = {}
    elif files == "truncated-minilm":
        files = _truncated_minilm()
    files = {"e.yaml": exp(), **files}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    before = _snapshot(tmp_path)
    argv = ["search"] + (["--experiment", "e.yaml"] if "--experiment" not in args else []) + args
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("petl-nas: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "secret" not in err  # passwords never printed
    assert _snapshot(tmp_path) == before  # nothing created, nothing changed


def test_the_table_covers_what_the_issue_lists():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


RECORD = {"backbone": "no-such-model", "task": "demo_keyword", "petl_config": {}, "recipe": {"lr": 1e-3, "epochs": 2}}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--config", "rec.yaml", "--seeds", "0"], "seeds: expected a whole number >= 1, got 0"),
        (["train", "--config", "rec.yaml", "--out", "afile/best"], "output folder 'afile/best' cannot be created"),
        (["train", "--config", "typo.yaml"], "recipe.epoch: unknown key (did you mean 'epochs'?)"),
        (["train", "--config", "negative.yaml"], "recipe.lr: expected a number > 0, got -0.001"),
        (["predict", "--run", "nowhere", "--input", "in.md"], "input 'in.md': expected a file ending in .txt, .csv"),
        (["predict", "--run", "nowhere", "--input", "."], "input '.': expected a file ending in .txt"),
        (
            ["predict", "--run", "nowhere", "--input", "latin1.txt"],
            "latin1.txt: not UTF-8 text (byte 0xe9 on line 2); save it as UTF-8",
        ),
        (["predict", "--run", "nowhere", "--input", "empty.txt"], "input 'empty.txt': no texts in it"),
        (["predict", "--run", "nowhere", "--input", "in.txt"], "nowhere: no such directory"),
        (
            ["predict", "--run", "rec.yaml", "--input", "in.txt"],
            "rec.yaml: a file, not a trained run's folder (petl-nas train --config FILE --out DIR",
        ),
        (
            ["predict", "--run", "out", "--input", "in.txt"],
            "out: a `petl-nas train` output folder; pass one of its runs: out/seed_0 (or seed_1)",
        ),
        (
            ["train", "--config", "rec.yaml", "--out", "out"],
            "output folder 'out' holds runs of another record "
            "(seed_0, seed_1); choose another --out, or pass --overwrite",
        ),
        (["search", "--experiment", "."], ".: Is a directory"),
        (
            ["search", "--experiment", "e.yaml", "--storage", "sqlite:///afile/study.db"],
            "afile is a file, not a folder",
        ),
    ],
    ids=[
        "seeds-zero",
        "out-under-a-file",
        "record-key-typo",
        "record-negative-lr",
        "predict-unknown-type",
        "predict-folder",
        "predict-latin-1",
        "predict-empty-file",
        "predict-no-model",
        "predict-a-record",
        "predict-train-out-folder",
        "train-out-of-another-record",
        "experiment-folder",
        "storage-under-a-file",
    ],
)
def test_train_predict_and_paths_refuse_before_any_work(tmp_path, monkeypatch, capsys, argv, words):
    """Refused in one line with exit 2 before a model is loaded or a seed trained (the records'
    backbone does not exist: reaching it would be another error), nothing written."""
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rec.yaml").write_text(yaml.safe_dump(RECORD))
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**RECORD, "recipe": {"lr": 1e-3, "epoch": 6}}))
    (tmp_path / "negative.yaml").write_text(yaml.safe_dump({**RECORD, "recipe": {"lr": -1e-3}}))
    (tmp_path / "afile").write_text("")
    (tmp_path / "in.md").write_text("a wonderful film\n")
    (tmp_path / "in.txt").write_text("a wonderful film\n\n\n")  # blank lines at the end: fine
    (tmp_path / "latin1.txt").write_bytes("a wonderful film\nun film rat\u00e9\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("\n")
    for seed in (0, 1):  # what `train --out out` writes
        (tmp_path / "out" / f"seed_{seed}").mkdir(parents=True)
        (tmp_path / "out" / f"seed_{seed}" / "petl_config.json").write_text("{}")
    (tmp_path / "e.yaml").write_text(exp())
    before = _snapshot(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("petl-nas: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert _snapshot(tmp_path) == before


def test_a_text_file_with_a_byte_order_mark_is_read_without_it(tmp_path):
    from petl_nas.deploy.runs import read_texts

    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfa wonderful film\nawful\n")
    assert read_texts(path, ["sentence"]) == [("a wonderful film",), ("awful",)]


def test_an_unwritable_file_is_named_not_its_temporary_file(tmp_path):
    from petl_nas.fileio import atomic_write

    target = tmp_path / "no-such-folder" / "best.yaml"
    with pytest.raises(OSError) as raised:
        atomic_write(target, lambda tmp: None)
    assert raised.value.filename == str(target)


def test_a_hub_name_while_the_hub_cannot_be_reached_reads_the_cache_only(tmp_path, monkeypatch, capsys):
    """Offline, a hub name is looked up in the local cache at once (the hub client would retry for
    ~25 s first), and the error line says what happened and what to give instead."""
    import transformers

    from petl_nas.core import models

    asked = []
    real = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(models, "hub_reachable", lambda: False)
    monkeypatch.setattr(
        transformers.AutoConfig, "from_pretrained", lambda path, **kw: asked.append(kw) or real(path, **kw)
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    rc = main(["presets", "--model", "some-org/some-model"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "the hub cannot be reached from here and it is not in the local cache: give the path" in err, err
    assert asked == [{"local_files_only": True}]


@pytest.mark.parametrize(
    "task, words",
    [("sst2", "pass --data-dir DIR with DIR/SST-2/train.tsv"), ("xsum", "pass --data-dir DIR with DIR/train.jsonl")],
)
def test_a_hub_dataset_while_the_hub_cannot_be_reached_reads_the_cache_only(monkeypatch, task, words):
    """Offline, a task without --data-dir looks in the local datasets cache at once (the hub client
    would retry for ~25 s first); the flags are put back after."""
    import datasets
    import huggingface_hub.constants as hub_constants

    from petl_nas.core import models
    from petl_nas.errors import ConfigError
    from petl_nas.tasks import load_splits

    def load_dataset(*args, **kwargs):  # what the hub client would be told, then no network
        seen.append((datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE))
        raise ConnectionError("offline")

    seen = []
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # a user's shell: no offline variables
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(models, "hub_reachable", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(ConfigError, match=words):
        load_splits(task)
    assert seen == [(True, True)] and not datasets.config.HF_HUB_OFFLINE and not hub_constants.HF_HUB_OFFLINE


def test_hub_reachable_asks_the_endpoint_and_respects_offline(monkeypatch):
    """True only when the endpoint (``HF_ENDPOINT``) accepts a connection: a real listening socket on
    this machine, then a closed port; never asked when ``HF_HUB_OFFLINE`` is set."""
    from petl_nas.core.models import hub_reachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        hub_reachable.cache_clear()
        assert hub_reachable()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        hub_reachable.cache_clear()
        assert not hub_reachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_free_port()}")
    hub_reachable.cache_clear()
    assert not hub_reachable()
    hub_reachable.cache_clear()


def test_texts_to_label_need_every_column_the_model_reads(tmp_path):
    """`predict` input for a sentence-pair model: a .txt file (one text a line) is refused, and an
    empty cell of a table is named by its row; numbers in a text column are read as written."""
    from petl_nas.deploy.runs import read_texts
    from petl_nas.errors import ConfigError

    (tmp_path / "in.txt").write_text("a wonderful film\n")
    with pytest.raises(ConfigError, match=r"the model reads 2 texts a row \(sentence1, sentence2\); give a \.csv"):
        read_texts(tmp_path / "in.txt", ["sentence1", "sentence2"])
    (tmp_path / "in.csv").write_text("sentence1,sentence2\na,b\nc,\n")
    with pytest.raises(ConfigError, match=r"in\.csv, row 2: text column 'sentence2' is empty"):
        read_texts(tmp_path / "in.csv", ["sentence1", "sentence2"])
    (tmp_path / "num.csv").write_text("sentence1,sentence2\n12,b\n3,d\n")
    assert read_texts(tmp_path / "num.csv", ["sentence1", "sentence2"]) == [("12", "b"), ("3", "d")]


def test_the_version_is_one_line(capsys):
    from petl_nas import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"petl-nas {__version__}\n"


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["search", "--trials", "abc"],
            "search: argument --trials: invalid int value: 'abc' (see petl-nas search --help)",
        ),
        (["serach"], "argument command: invalid choice: 'serach'"),
        (["search", "--trails", "4"], "search: unrecognized arguments: --trails 4 (see petl-nas search --help)"),
        (["--bogus"], "the following arguments are required: command (see petl-nas --help)"),
    ],
)
def test_a_flag_argparse_refuses_is_one_line_too(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("petl-nas: error: ") and err.count("\n") == 1, err
    assert words in err, err


def test_blank_lines_of_a_text_input_are_skipped_and_said_once(tmp_path, monkeypatch, capsys):
    """A blank line inside a .txt input is not a text: skipped with one warning, and every answer
    carries its own text, so none is shifted."""
    from petl_nas.deploy import runs as deploy

    monkeypatch.setattr(
        deploy,
        "load",
        lambda backbone, directory: type(
            "M", (), {"petl": type("P", (), {"info": {"task": "demo_sentiment", "labels": ["neg", "pos"]}})()}
        )(),
    )
    monkeypatch.setattr(deploy, "predict", lambda model, rows: [{"label": row[0][-3:]} for row in rows])
    (tmp_path / "in.txt").write_text("a good film pos\n\n  \nawful neg\n\n")
    assert main(["predict", "--run", "m", "--input", str(tmp_path / "in.txt")]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == [
        {"text": "a good film pos", "label": "pos"},
        {"text": "awful neg", "label": "neg"},
    ]
    assert err == f"petl-nas: warning: input '{tmp_path / 'in.txt'}': 2 blank lines skipped (line 2, 3)\n"


def test_a_budget_of_half_the_backbone_is_said_not_taken_in_silence(tmp_path, monkeypatch, capsys):
    """``--budget 50%`` (0.5% meant) runs, as a comparison with full fine-tuning may ask, and says
    what it is; 5% of a tiny backbone is an ordinary PETL budget and says nothing."""
    from petl_nas.study.experiment import large_budget_warning

    assert large_budget_warning("5%", 500, 10_000) is None and large_budget_warning("1000", 1000, 10_000) is None
    assert large_budget_warning("1001", 1001, 10_000) == (
        "budget 1001 is 1,001 parameters, 10% of the backbone; PETL configurations usually take under 5%"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.yaml").write_text(exp(trials=1))
    assert main(["search", "--experiment", "e.yaml", "--budget", "50%"]) == 0
    out = capsys.readouterr().out.replace("\n  ", " ")  # a line wrapped at 120 characters, joined
    said = [line for line in out.splitlines() if line.startswith("warning: budget")]
    assert (
        len(said) == 1
        and said[0].startswith("warning: budget 50% is ")
        and said[0].endswith(
            " parameters, 50% of the backbone; PETL configurations usually take under 5% (did you mean 0.5%?)"
        )
    ), said


@pytest.mark.parametrize(
    "url, shown",
    [
        (
            "postgresql://u:secret@h/db?sslpassword=secret&application_name=a",
            "postgresql://u:***@h/db?application_name=a&sslpassword=***",
        ),
        ("sqlite:///x.db?password=secret", "sqlite:///x.db?password=***"),
        (
            "mysql://u@h/db?passwd=secret&secret_key=secret&charset=utf8",
            "mysql://u@h/db?charset=utf8&passwd=***&secret_key=***",
        ),
        ("x://u:secret@h:notaport/db?token=secret&a=1", "x://u:***@h:notaport/db?token=***&a=1"),  # not SQLAlchemy's
        ("sqlite:///study.db", "sqlite:///study.db"),
    ],
)
def test_a_url_is_shown_without_its_user_info_password_or_secret_parameters(url, shown):
    from petl_nas.study.storage import redact

    assert redact(url) == shown
