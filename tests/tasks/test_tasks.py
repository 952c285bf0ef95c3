"""Tasks: registry, GLUE readers (real data when present), honest splits, file tasks, the demo
task, encoding and its cache, and the tiny tokenizer + backbone they feed."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, SHARED_GLUE

from petl_nas.core.tiny import SPECIAL_TOKENS, tiny_backbone, tiny_tokenizer
from petl_nas.errors import ConfigError
from petl_nas.tasks import Task, clear_cache, file_task, get_task, load_splits, split_indices, task_names
from petl_nas.tasks.encoding import encode

GLUE = SHARED_GLUE
GLUE_NAMES = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture(scope="module")
def tokenizer():
    from petl_nas.tasks.demo import load_demo as _load_demo

    return tiny_tokenizer(_load_demo(get_task("demo_sentiment"))["train"].texts[0], vocab_size=200)


# --- registry -------------------------------------------------------------------------------------


def test_registry_lists_glue_and_demo():
    assert set(task_names()) >= {*GLUE_NAMES, "demo_sentiment"}
    assert get_task("SST-2") is get_task("sst2")
    assert (get_task("cola").main_metric, get_task("mrpc").main_metric, get_task("stsb").main_metric) == (
        "mcc",
        "accuracy",
        "pearson_spearman",
    )
    assert get_task("stsb").num_labels == 1 and get_task("mnli").num_labels == 3


@pytest.mark.parametrize("name", ["mrpc", "qqp"])
def test_mrpc_and_qqp_rank_by_accuracy_and_report_f1_beside_it(name):
    """F1 of their positive class barely separates a learner from "always positive" (see
    test_significance); both figures, and GLUE's mean of them, are still recorded for each trial."""
    task = get_task(name)
    assert (task.main_metric, task.customary_metric) == ("accuracy", "f1")
    assert set(task.compute_metrics([1, 1, 0], [1, 0, 0])) == {"f1", "accuracy", "f1_accuracy"}
    assert (get_task("sst2").customary_metric, get_task("cola").customary_metric) == ("accuracy", "mcc")
    old = task.ranked_by("f1")  # a study that recorded F1 keeps ranking by it
    assert (old.main_metric, old.customary_metric, task.ranked_by(None)) == ("f1", "f1", task)
    with pytest.raises(
        ConfigError,
        match=f"task '{name}': cannot rank by 'mcc', which it does not compute; its metrics: f1, accuracy, f1_accuracy",
    ):
        task.ranked_by("mcc")


def test_a_file_task_reporting_f1_ranks_by_accuracy_and_says_so(tmp_path):
    from petl_nas.tasks import data_lines

    (tmp_path / "train.csv").write_text("a,b,label\n" + "".join(f"x{i},y{i},{'ny'[i % 3 > 0]}\n" for i in range(30)))
    files = (tmp_path / "train.csv", tmp_path / "train.csv")
    task = file_task(*files, text_columns=["a", "b"], main_metric="f1")
    assert (task.main_metric, task.customary_metric, task.metrics) == ("accuracy", "f1", ("accuracy", "f1", "mcc"))
    only_f1 = file_task(*files, text_columns=["a", "b"], main_metric="f1", metrics=["f1"])
    assert (only_f1.main_metric, only_f1.metrics) == ("accuracy", ("f1", "accuracy"))  # what ranks is computed
    assert data_lines(load_splits(task), k=None)[0].endswith("; trials rank by accuracy, f1 is reported beside it")
    plain = file_task(*files, text_columns=["a", "b"], main_metric="mcc")
    assert (plain.main_metric, plain.customary_metric) == ("mcc", "mcc")
    assert "trials rank by" not in data_lines(load_splits(plain), k=None)[0]
    with pytest.raises(ConfigError, match=r"main_metric 'f1' is not among metrics \['mcc'\]"):
        file_task(*files, text_columns=["a", "b"], main_metric="f1", metrics=["mcc"])
    with pytest.raises(ConfigError, match=r"customary_metric 'f1' is not among metrics \['accuracy'\]"):
        Task("t", ("text",), "label", labels=("a", "b"), customary_metric="f1")


def test_unknown_task_suggests_and_lists():
    with pytest.raises(ConfigError, match=r"unknown task 'sst3' \(did you mean 'sst2'\?\); available: cola"):
        get_task("sst3")


def test_task_validates_its_fields():
    with pytest.raises(ConfigError, match="main_metric 'f1' is not among"):
        Task("t", ("text",), "label", labels=("a", "b"), main_metric="f1")
    with pytest.raises(ConfigError, match="1 or 2 columns"):
        Task("t", ("a", "b", "c"), "label", labels=("0", "1"))
    with pytest.raises(
        ConfigError,
        match=r"main_metric 'perplexity' is lower-is-better and the search maximises "
        r"its main metric; use token_accuracy",
    ):  # it would pick the worst
        Task(
            "t",
            ("prompt",),
            "response",
            kind="causal_lm",
            main_metric="perplexity",
            metrics=("token_accuracy", "perplexity"),
        )
    Task(
        "t",
        ("prompt",),
        "response",
        kind="causal_lm",
        main_metric="token_accuracy",
        metrics=("token_accuracy", "perplexity"),
    )  # reported beside it: fine


def test_compute_metrics_from_logits_and_scores():
    assert get_task("sst2").compute_metrics(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), [0, 0]) == {"accuracy": 0.5}
    out = get_task("stsb").compute_metrics(np.array([[1.0], [2.0], [3.0]]), [0.5, 2.5, 2.0])
    assert out["spearman"] == pytest.approx(0.5) and set(out) == {"pearson", "spearman", "pearson_spearman"}


# --- GLUE readers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, folder, n_train, n_dev",
    [("sst2", "SST-2", 67_349, 872), ("cola", "CoLA", 8_551, 1_043), ("stsb", "STS-B", 5_749, 1_500)],
)
def test_real_glue_row_counts(name, folder, n_train, n_dev):
    if not (GLUE / folder / "train.tsv").exists():
        pytest.skip(f"no GLUE data at {GLUE / folder}")
    splits = load_splits(name, data_dir=GLUE)
    assert len(splits.train) + len(splits.search_dev) == n_train
    assert len(splits.search_dev) == round(0.2 * n_train) and len(splits.test) == n_dev


def test_real_glue_first_rows():
    if not (GLUE / "SST-2").exists():
        pytest.skip(f"no GLUE data at {GLUE}")
    sst2, cola = load_splits("sst2", data_dir=GLUE).test, load_splits("cola", data_dir=GLUE).test
    assert sst2.texts[0][0] == "it 's a charming and often affecting journey . " and sst2.labels[0] == 1
    assert cola.texts[0][0] == "The sailors rode the breeze clear of the rocks." and cola.labels[0] == 1
    stsb = load_splits("stsb", data_dir=GLUE).test
    assert stsb.texts[1][0] == "A man wearing a hard hat is dancing." and stsb.labels[0] == 5.0


def test_real_qnli_without_train_names_the_file():
    if not (GLUE / "QNLI" / "dev.tsv").exists():
        pytest.skip(f"no GLUE data at {GLUE}")
    with pytest.raises(ConfigError, match=r"expected file .*QNLI/train\.tsv does not exist"):
        load_splits("qnli", data_dir=GLUE)


def write_tsv(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


PAIR_FORMATS = {  # GLUE layouts absent from ../shared/data, built here from their documented headers
    "mrpc": ("MRPC", "dev.tsv", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], ["7", "8"], ("0", "1")),
    "qqp": (
        "QQP",
        "dev.tsv",
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        ["5", "1", "2"],
        ("0", "1"),
    ),
    "mnli": (
        "MNLI",
        "dev_matched.tsv",
        ["index", "sentence1", "sentence2", "gold_label"],
        ["3"],
        ("neutral", "contradiction"),
    ),
    "qnli": ("QNLI", "dev.tsv", ["index", "question", "sentence", "label"], ["4"], ("entailment", "not_entailment")),
    "rte": ("RTE", "dev.tsv", ["index", "sentence1", "sentence2", "label"], ["9"], ("not_entailment", "entailment")),
}


@pytest.mark.parametrize("name", sorted(PAIR_FORMATS))
def test_pair_task_layouts(tmp_path, name):
    folder, dev_file, header, ids, (label_a, label_b) = PAIR_FORMATS[name]
    label_first = header[0] == "Quality"
    row = lambda a, b, y: [y, *ids, a, b] if label_first else [*ids, a, b, y]
    train = [row(f'"quoted {i} starts', f"second {i}", label_a if i % 2 else label_b) for i in range(10)]
    write_tsv(tmp_path / folder / "train.tsv", [header, *train])
    write_tsv(tmp_path / folder / dev_file, [header, row("a", "b", label_b)])
    splits = load_splits(name, data_dir=tmp_path, search_dev_size=2)
    task = get_task(name)
    assert (len(splits.train), len(splits.search_dev), len(splits.test)) == (8, 2, 1)
    assert splits.test.texts == (("a",), ("b",)) and splits.test.labels[0] == task.labels.index(label_b)
    assert all(t.startswith('"quoted') for t in splits.train.texts[0])  # a bare quote is just a character


def test_glue_errors_name_file_column_value_and_line(tmp_path):
    with pytest.raises(ConfigError, match=r"expected file .*SST-2/train\.tsv does not exist"):
        load_splits("sst2", data_dir=tmp_path)
    write_tsv(tmp_path / "SST-2" / "train.tsv", [["text", "label"], ["fine", "1"]])
    write_tsv(tmp_path / "SST-2" / "dev.tsv", [["sentence", "label"], ["ok", "1"]])
    with pytest.raises(
        ConfigError,
        match=r"SST-2/train\.tsv: not a SST-2 file: expected columns 'sentence', 'label', found .* "
        r"\(missing 'sentence'\)",
    ):
        load_splits("sst2", data_dir=tmp_path)
    write_tsv(tmp_path / "SST-2" / "train.tsv", [["sentence", "label"], ["fine", "1"], ["odd", "positive"]])
    with pytest.raises(ConfigError, match=r"train\.tsv, line 3: label 'positive' is not one of sst2's labels \(0, 1\)"):
        load_splits("sst2", data_dir=tmp_path)
    write_tsv(tmp_path / "STS-B" / "train.tsv", [["sentence1", "sentence2", "score"], ["a", "b", "high"]])
    with pytest.raises(ConfigError, match=r"line 2: label 'high' is not a number"):
        load_splits("stsb", data_dir=tmp_path)


def test_hub_failure_says_pass_data_dir(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # as offline: the hub load fails
    with pytest.raises(ConfigError, match=r"could not be loaded from the Hugging Face hub .*pass --data-dir"):
        load_splits("rte")


def test_hub_rows_map_label_ids_to_labels(monkeypatch):
    import types

    rows = {
        "train": {"premise": ["p1", "p2", "p3"], "hypothesis": ["h1", "h2", "h3"], "label": [2, 0, 1]},
        "validation_matched": {"premise": ["p"], "hypothesis": ["h"], "label": [1]},
    }
    calls = []
    fake = types.SimpleNamespace(load_dataset=lambda *args: calls.append(args) or rows)
    monkeypatch.setitem(__import__("sys").modules, "datasets", fake)
    splits = load_splits("mnli", search_dev_size=1)
    assert calls == [("nyu-mll/glue", "mnli")]
    assert len(splits.train) == 2 and splits.test.texts == (("p",), ("h",)) and splits.test.labels.tolist() == [1]
    assert sorted(splits.train.labels.tolist() + splits.search_dev.labels.tolist()) == [0, 1, 2]


# --- honest splits --------------------------------------------------------------------------------


def test_split_indices_rule():
    train, dev = split_indices(100, search_dev_fraction=0.2, data_seed=1)
    assert (len(train), len(dev)) == (80, 20) and not set(train) & set(dev)
    small, dev_small = split_indices(100, k=10, search_dev_size=20, data_seed=1)
    large, dev_large = split_indices(100, k=30, search_dev_size=20, data_seed=1)
    assert set(small) <= set(large) and dev_small.tolist() == dev_large.tolist() == dev.tolist()
    assert not set(large) & set(dev_large)
    again = split_indices(100, k=10, search_dev_size=20, data_seed=1)
    assert again[0].tolist() == small.tolist()
    assert split_indices(100, k=10, search_dev_size=20, data_seed=2)[0].tolist() != small.tolist()
    train, dev = split_indices(12, k=10, search_dev_size=4)  # not enough rows: carve from K
    assert (len(train), len(dev)) == (6, 4) and not set(train) & set(dev)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(k=0), "k \\(fidelity.k\\) must be a whole number from 1"),
        (dict(k=101), "k \\(fidelity.k\\) must be a whole number"),
        (dict(search_dev_fraction=1.5), "search_dev_fraction must be between 0 and 1"),
        (dict(search_dev_size=100), "search_dev_size \\(fidelity.search_dev\\) must be from 1 to 99"),
    ],
)
def test_split_indices_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        split_indices(100, **kwargs)


def test_k_shot_demo_is_deterministic_and_disjoint():
    a = load_splits("demo_sentiment", k=100, data_seed=7)
    clear_cache()
    b = load_splits("demo_sentiment", k=100, data_seed=7)
    assert a is not b and a.train.texts == b.train.texts and len(a.train) == 100
    assert len(a.search_dev) == 20 and not set(a.train.texts[0]) & set(a.search_dev.texts[0])
    assert load_splits("demo_sentiment", k=100, data_seed=8).train.texts != a.train.texts


# --- demo and file tasks --------------------------------------------------------------------------


def test_demo_task_is_balanced_and_not_one_token():
    splits = load_splits("demo_sentiment")
    assert (len(splits.train) + len(splits.search_dev), len(splits.test)) == (2000, 500)
    assert 0.35 < splits.test.labels.mean() < 0.65
    best_single_token = max(
        np.mean([(word in s.split()) == bool(y) for s, y in zip(splits.test.texts[0], splits.test.labels)])
        for word in ("good", "great", "bad", "awful", "not")
    )
    assert best_single_token < 0.75


def test_csv_and_jsonl_file_tasks(tmp_path):
    (tmp_path / "train.csv").write_text(
        "text,label\n" + "".join(f'"row, {i}",{"pos" if i % 3 else "neg"}\n' for i in range(20))
    )
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps({"text": f"d{i}", "label": "pos"}) + "\n" for i in range(5)))
    task = file_task(tmp_path / "train.csv", tmp_path / "dev.jsonl", text_columns=["text"])
    assert task.labels == ("neg", "pos") and task.metrics == ("accuracy", "f1", "mcc")
    splits = load_splits(task, k=10, search_dev_size=4)
    assert (len(splits.train), len(splits.search_dev), len(splits.test)) == (10, 4, 5)
    assert splits.train.texts[0][0].startswith("row, ")

    (tmp_path / "test.json").write_text(json.dumps({"text": "t", "label": "neg"}) + "\n")
    with_test = file_task(tmp_path / "train.csv", tmp_path / "dev.jsonl", tmp_path / "test.json", text_columns=["text"])
    splits = load_splits(with_test)
    assert (len(splits.train), len(splits.search_dev), len(splits.test)) == (20, 5, 1)


def test_a_final_run_trains_on_the_carved_search_dev_never_on_a_dev_file(tmp_path):
    """With all the data (k: null) the rows carved for the search dev train in a final run; a search
    dev read from its own file (train, dev and test files) is not training data, and stays out."""
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(20)))
    (tmp_path / "dev.csv").write_text("text,label\n" + "".join(f"d{i},{'ab'[i % 2]}\n" for i in range(6)))
    (tmp_path / "test.csv").write_text("text,label\nx,a\ny,b\n")
    carved = load_splits(
        file_task(tmp_path / "train.csv", tmp_path / "dev.csv", text_columns=["text"]), search_dev_size=4
    ).for_final_training()
    assert sorted(carved.train.texts[0]) == sorted(f"t{i}" for i in range(20)) and len(carved.train.labels) == 20
    own = load_splits(
        file_task(tmp_path / "train.csv", tmp_path / "dev.csv", tmp_path / "test.csv", text_columns=["text"])
    ).for_final_training()
    assert sorted(own.train.texts[0]) == sorted(f"t{i}" for i in range(20)) and len(own.search_dev) == 6


def test_the_data_line_says_what_would_otherwise_pass_silently(tmp_path):
    """Rows per split and class shares; a warning for a K cut short by the search dev, for a class
    with no training or no search-dev rows, and for search-dev rows repeating training texts."""
    from petl_nas.tasks import data_lines

    rows = [(f"t{i}", "abc"[min(i % 5, 2)]) for i in range(40)]  # c is 3 of 5 rows, a and b 1 each
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    (tmp_path / "dev.csv").write_text("text,label\nx,a\ny,b\n")
    task = file_task(tmp_path / "train.csv", tmp_path / "dev.csv", text_columns=["text"])
    splits = load_splits(task, k=20, search_dev_size=10)
    (line,) = data_lines(splits, k=20)
    assert line.startswith("data: train 20 rows (K=20 of 40), search-dev 10 (carved from the training data), test 2;")
    shares = [f"{y} {5 * c}%" for y, c in zip("abc", np.bincount(splits.train.labels))]  # 5% a row
    assert line.endswith("train classes: " + ", ".join(shares)) and shares[2] != "c 100%"
    (tmp_path / "skewed.csv").write_text("text,label\n" + "".join(f"s{i},{'ny'[i % 10 == 0]}\n" for i in range(40)))
    (tmp_path / "skewed_dev.csv").write_text("text,label\nx,n\ny,y\n")
    skewed = file_task(
        tmp_path / "skewed.csv", tmp_path / "skewed_dev.csv", tmp_path / "skewed_dev.csv", text_columns=["text"]
    )
    assert data_lines(load_splits(skewed), k=None)[1] == (
        "warning: 'n' is 90% of the training rows, so accuracy mostly rewards predicting it; main_metric: mcc "
        "ranks trials by how well they tell the classes apart"
    )
    three = file_task(
        tmp_path / "skewed.csv",
        tmp_path / "skewed_dev.csv",
        tmp_path / "skewed_dev.csv",
        text_columns=["text"],
        labels=["n", "y", "z"],
    )
    assert "main_metric: mcc with metrics: [accuracy, mcc] ranks" in data_lines(load_splits(three), k=None)[1]

    line, cut = data_lines(load_splits(task, k=36, search_dev_size=8), k=36)
    assert line.startswith("data: train 28 rows (K=36 of 40)") and cut.startswith(
        "warning: K=36 and a search dev of 8 need 44 training rows and there are 40: the search dev comes out "
        "of the K, so trials train on 28"
    )

    lines = data_lines(load_splits(task, k=3, search_dev_size=2, data_seed=1), k=3)
    assert lines[1].startswith("warning: 'c' is 100% of the training rows")
    assert "warning: 2 of 3 classes have no training rows ('a', 'b'): trials cannot learn them" in lines[2]
    assert "warning: 2 of 3 classes have no search-dev rows ('a', 'b')" in lines[3]

    twice = [(f"t{i % 20}", "ab"[i % 2]) for i in range(40)]  # every text twice
    (tmp_path / "twice.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in twice))
    task = file_task(tmp_path / "twice.csv", tmp_path / "dev.csv", tmp_path / "dev.csv", text_columns=["text"])
    (line,) = data_lines(load_splits(task), k=None)  # a dev file: nothing repeats it
    assert line.startswith("data: train 40 rows (all), search-dev 2 (its own file), test 2;")
    assert line.endswith("; f1 scores 'b' as the positive class (the second label: task labels: [...] orders them)")
    task = file_task(
        tmp_path / "twice.csv", tmp_path / "dev.csv", tmp_path / "dev.csv", text_columns=["text"], labels=["b", "a"]
    )
    assert "; f1 scores 'a' as the positive class" in data_lines(load_splits(task), k=None)[0]
    task = file_task(tmp_path / "twice.csv", tmp_path / "dev.csv", text_columns=["text"])
    line, repeats = data_lines(load_splits(task, search_dev_size=10), k=None)
    assert "search-dev 10 (carved from the training data; 10 repeat a training text)" in line
    assert repeats.startswith("warning: 10 of 10 search-dev rows (100%) repeat a training row's text")
    same = file_task(tmp_path / "twice.csv", tmp_path / "twice.csv", text_columns=["text"])  # dev = train
    assert data_lines(load_splits(same, search_dev_size=4), k=None)[-1].startswith(
        "warning: 40 of 40 test rows (100%) repeat a training row's text: test scores overrate"
    )


def test_file_task_errors(tmp_path, monkeypatch):
    (tmp_path / "train.csv").write_text("sentence,label\na,1\n")
    with pytest.raises(ConfigError, match=r"dev file .*missing\.csv does not exist$"):
        file_task(tmp_path / "train.csv", tmp_path / "missing.csv", text_columns=["sentence"])
    monkeypatch.chdir(tmp_path)  # a relative path: the error says where it was looked for
    with pytest.raises(
        ConfigError,
        match=r"dev file data/dev\.csv does not exist \(relative paths are read from "
        rf"the current folder, {re.escape(str(tmp_path))}\)",
    ):
        file_task("train.csv", "data/dev.csv", text_columns=["sentence"])
    with pytest.raises(ConfigError, match=r"unsupported format"):
        file_task(tmp_path / "train.csv", tmp_path / "dev.txt", text_columns=["sentence"])
    (tmp_path / "dev.csv").write_text("text,label\nb,0\n")
    task = file_task(tmp_path / "train.csv", tmp_path / "dev.csv", text_columns=["sentence"], labels=["0", "1"])
    with pytest.raises(ConfigError, match=r"dev\.csv: missing column 'sentence' \(columns: text, label\)"):
        load_splits(task, search_dev_size=None, search_dev_fraction=0.5)
    (tmp_path / "dev.csv").write_text("sentence,label\nb,2\n")
    with pytest.raises(ConfigError, match=r"dev\.csv, row 1: label 2 is not one of"):
        load_splits(task, search_dev_fraction=0.5)


def test_file_task_says_why_a_table_is_not_what_the_user_wrote(tmp_path):
    """One class in the train file; comma-separated rows in a .tsv; a file without a header row."""
    (tmp_path / "dev.csv").write_text("text,label\nb,pos\n")
    (tmp_path / "one.csv").write_text("text,label\na,pos\nb,pos\n")
    with pytest.raises(
        ConfigError, match=r"one\.csv: 'label' holds one class \('pos'\); a classifier needs two or more"
    ):
        file_task(tmp_path / "one.csv", tmp_path / "dev.csv", text_columns=["text"])
    with pytest.raises(ConfigError, match=r"^task: labels lists one class \('pos'\); a classifier needs two or more$"):
        file_task(tmp_path / "dev.csv", tmp_path / "dev.csv", text_columns=["text"], labels=["pos"])
    (tmp_path / "commas.tsv").write_text("text,label\na,pos\nb,neg\n")
    with pytest.raises(
        ConfigError,
        match=r"missing column 'text' \(columns: text,label\); the header is one column: "
        r"a \.tsv file is read tab-separated$",
    ):
        file_task(tmp_path / "commas.tsv", tmp_path / "dev.csv", text_columns=["text"])
    (tmp_path / "bare.csv").write_text("a fine film,pos\na dull one,neg\n")
    with pytest.raises(ConfigError, match=r"the first row is read as the header: does the file have one\?$"):
        file_task(tmp_path / "bare.csv", tmp_path / "dev.csv", text_columns=["text"])
    (tmp_path / "nolabel.csv").write_text("text\na\n")  # a header, and a column missing from it
    with pytest.raises(ConfigError, match=r"missing column 'label' \(columns: text\)$"):
        file_task(tmp_path / "nolabel.csv", tmp_path / "dev.csv", text_columns=["text"])
    (tmp_path / "cased.jsonl").write_text('{"Text": "a", "label": "pos"}\n{"Text": "b", "label": "neg"}\n')
    with pytest.raises(
        ConfigError,
        match=r"missing column 'text' \(columns: Text, label\); did you mean 'Text'\? "
        r"\(column names are case-sensitive\)$",
    ):
        file_task(tmp_path / "cased.jsonl", tmp_path / "dev.csv", text_columns=["text"])
    with pytest.raises(ConfigError, match=r"missing column 'lable' \(columns: text, label\); did you mean 'label'\?"):
        file_task(tmp_path / "dev.csv", tmp_path / "dev.csv", text_columns=["text"], label_column="lable")
    with pytest.raises(ConfigError, match=r"^task: labels lists 'pos' twice \(each class once, in class-id order\)$"):
        file_task(tmp_path / "dev.csv", tmp_path / "dev.csv", text_columns=["text"], labels=["pos", "neg", "pos"])


def test_file_task_refuses_blank_cells_and_targets_that_are_not_finite(tmp_path):
    """JSON keeps "" and "  " as strings (a CSV or TSV cell of spaces too); a NaN or inf regression
    target made every trial's loss NaN. A cell reading NA or None is that text, and a quote in a TSV
    is a character of its cell, not the start of a field that swallows the next rows."""
    import json

    def rows(name, items):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in items))
        return tmp_path / name

    good = rows("good.jsonl", [{"text": "a", "label": "pos"}, {"text": "b", "label": "neg"}])
    for bad, column in (
        ([{"text": "a", "label": "pos"}, {"text": "b", "label": "  "}], "'label'"),
        ([{"text": "a", "label": "pos"}, {"text": "", "label": "neg"}], "text column 'text'"),
    ):
        task = file_task(good, rows("bad.jsonl", bad), text_columns=["text"])
        with pytest.raises(ConfigError, match=rf"bad\.jsonl, row 2: {column} is empty$"):
            load_splits(task, search_dev_fraction=0.5)
    (tmp_path / "na.csv").write_text("text,label\nNA,None\nfine,neg\n")
    (tmp_path / "quotes.tsv").write_text('text\tlabel\n"a quote opens\tpos\nb\tneg\nc"\tpos\nd\tneg\n')
    task = file_task(tmp_path / "na.csv", tmp_path / "quotes.tsv", text_columns=["text"], labels=["None", "neg", "pos"])
    splits = load_splits(task, search_dev_fraction=0.5)
    assert splits.test.texts[0] == ('"a quote opens', "b", 'c"', "d") and list(splits.test.labels) == [2, 1, 2, 1]
    assert sorted(splits.train.texts[0] + splits.search_dev.texts[0]) == ["NA", "fine"]
    scores = rows("scores.jsonl", [{"text": "a", "y": 1.5}, {"text": "b", "y": 2.0}])
    for value in (float("nan"), float("inf")):  # json writes NaN and Infinity
        task = file_task(
            scores,
            rows("dev.jsonl", [{"text": "a", "y": 1.0}, {"text": "b", "y": value}]),
            text_columns=["text"],
            label_column="y",
            kind="regression",
        )
        with pytest.raises(ConfigError, match=r"dev\.jsonl, row 2: label .* is not a finite number"):
            load_splits(task, search_dev_fraction=0.5)


# --- encoding, cache, tiny backbone ---------------------------------------------------------------


def test_encode_batches_pad_per_batch(tokenizer):
    encoded = encode(load_splits("demo_sentiment", k=50), tokenizer, max_length=12)
    batches = list(encoded.train.batches(16, shuffle=True, seed=3))
    assert [len(b["labels"]) for b in batches] == [16, 16, 16, 2]
    b = batches[0]
    assert set(b) == {"input_ids", "attention_mask", "token_type_ids", "labels"} and b["labels"].dtype == torch.long
    lengths = b["attention_mask"].sum(1)
    assert b["input_ids"].shape[1] == lengths.max() <= 12  # padded to this batch's longest
    assert (b["input_ids"][b["attention_mask"] == 0] == tokenizer.pad_token_id).all()
    again = next(encoded.train.batches(16, shuffle=True, seed=3))
    assert torch.equal(again["input_ids"], b["input_ids"])
    assert sorted(torch.cat([x["labels"] for x in batches]).tolist()) == sorted(encoded.train.labels.tolist())


def test_encode_pairs_and_regression(tmp_path, tokenizer):
    write_tsv(
        tmp_path / "STS-B" / "train.tsv",
        [["sentence1", "sentence2", "score"]]
        + [[f"a good film {i}", "a dull plot", f"{i / 2:.3f}"] for i in range(10)],
    )
    write_tsv(tmp_path / "STS-B" / "dev.tsv", [["sentence1", "sentence2", "score"], ["x", "y", "1.000"]])
    b = next(encode(load_splits("stsb", data_dir=tmp_path), tokenizer).train.batches(4))
    assert b["labels"].dtype == torch.float32 and (b["token_type_ids"].sum(1) > 0).all()


def test_cache_returns_same_objects(tokenizer):
    splits = load_splits("demo_sentiment", k=40)
    assert load_splits("demo_sentiment", k=40) is splits
    encoded = encode(splits, tokenizer, max_length=32)
    assert encode(splits, tokenizer, max_length=32) is encoded
    assert encode(splits, tokenizer, max_length=16) is not encoded
    clear_cache()
    assert encode(load_splits("demo_sentiment", k=40), tokenizer, max_length=32) is not encoded


def test_tiny_tokenizer_and_backbone_forward(tokenizer):
    assert tokenizer.convert_ids_to_tokens(range(5)) == list(SPECIAL_TOKENS)
    assert tokenizer.name_or_path.startswith("tiny-wordpiece-") and len(tokenizer) <= 200
    batch = next(encode(load_splits("demo_sentiment", k=20), tokenizer).train.batches(8))
    model = tiny_backbone(tokenizer=tokenizer, num_labels=2, seed=1)
    out = model(**batch)
    assert out.logits.shape == (8, 2) and torch.isfinite(out.loss)
    same = tiny_backbone(tokenizer=tokenizer, num_labels=2, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters()))
    regression = tiny_backbone("roberta", num_labels=1, tokenizer=tokenizer, num_hidden_layers=1)
    assert regression.config.num_hidden_layers == 1 and regression.config.problem_type == "regression"


@pytest.mark.slow
def test_tiny_tokenizer_is_the_same_in_every_process():
    """A tiny backbone's vocabulary decides its embeddings, so a search rerun (or a Ray worker)
    reproduces a trial only if every process builds the same one (a trained WordPiece vocabulary
    tie-breaks its merges in hash order and did not)."""
    build = (
        "from petl_nas.tasks import get_task, load_splits; from petl_nas.core.tiny import tiny_tokenizer; "
        "s = load_splits(get_task('demo_keyword'), k=400); "
        "tok = tiny_tokenizer([t for col in s.train.texts for t in col], vocab_size=600); "
        "print(tok.name_or_path, len(tok))"
    )
    runs = {
        subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, check=True).stdout
        for _ in range(3)
    }
    assert len(runs) == 1, runs
    tok = tiny_tokenizer(["Kind words, kinder deeds", "the deed"], vocab_size=40)
    # whole words seen are one piece, unseen words are spelled from seen characters, else unknown
    assert tok.tokenize("Kinder deed tin unseen") == ["kinder", "deed", "t", "##i", "##n", "[UNK]"]


# --- GLUE files exactly as distributed ------------------------------------------------------------
GLUE_HEADERS = {  # task: (folder, dev file, header or None, a row), as download_glue_data.py writes them
    "cola": ("CoLA", "dev.tsv", None, ["gj04", "1", "", "Our friends won't buy this analysis."]),
    "sst2": ("SST-2", "dev.tsv", ["sentence", "label"], ["a gripping film ", "1"]),
    "mrpc": (
        "MRPC",
        "dev.tsv",
        ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        ["1", "1", "2", "He said so .", "He said it ."],
    ),
    "qqp": (
        "QQP",
        "dev.tsv",
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        ["0", "1", "2", "Why?", "Why not?", "0"],
    ),
    "stsb": (
        "STS-B",
        "dev.tsv",
        ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
        ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", "A man plays.", "A man sings.", "2.5"],
    ),
    "mnli": (
        "MNLI",
        "dev_matched.tsv",
        [
            "index",
            "promptID",
            "pairID",
            "genre",
            "sentence1_binary_parse",
            "sentence2_binary_parse",
            "sentence1_parse",
            "sentence2_parse",
            "sentence1",
            "sentence2",
            "label1",
            "gold_label",
        ],
        ["0", "1", "1e", "gov", "(", "(", "(", "(", "It rains.", "It is wet.", "entailment", "entailment"],
    ),
    "qnli": ("QNLI", "dev.tsv", ["index", "question", "sentence", "label"], ["0", "Who?", "Him.", "entailment"]),
    "rte": (
        "RTE",
        "dev.tsv",
        ["index", "sentence1", "sentence2", "label"],
        ["0", "A cat.", "An animal.", "entailment"],
    ),
}


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "byte-order-mark"])
@pytest.mark.parametrize("name", sorted(GLUE_HEADERS))
def test_every_glue_task_reads_its_files_as_distributed(tmp_path, name, bom):
    from petl_nas.tasks import clear_cache, load_splits

    folder, dev, header, row = GLUE_HEADERS[name]
    (tmp_path / folder).mkdir()
    lines = ([header] if header else []) + [row] * 6
    text = "\n".join("\t".join(r) for r in lines) + "\n"
    for file in ("train.tsv", dev):
        (tmp_path / folder / file).write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    clear_cache()
    splits = load_splits(name, data_dir=tmp_path, search_dev_size=2)
    assert len(splits.train) + len(splits.search_dev) == 6 and len(splits.test) == 6
    task = get_task(name)
    first_text = task.text_columns[0]
    assert splits.test.texts[0][0] == row[header.index(_GLUE_COLUMN[name][0])] if header else row[3]
    assert first_text and len(splits.test.texts) == len(task.text_columns)


_GLUE_COLUMN = {
    "sst2": ("sentence",),
    "mrpc": ("#1 String",),
    "qqp": ("question1",),
    "stsb": ("sentence1",),
    "mnli": ("sentence1",),
    "qnli": ("question",),
    "rte": ("sentence1",),
    "cola": (3,),
}


def test_a_wrong_glue_file_names_the_file_and_the_columns(tmp_path):
    from petl_nas.tasks import clear_cache, load_splits

    (tmp_path / "MRPC").mkdir()
    for file in ("train.tsv", "dev.tsv"):
        (tmp_path / "MRPC" / file).write_text("\ufeffid\ttext\tlabel\n1\thello\t0\n", encoding="utf-8")
    clear_cache()
    with pytest.raises(
        ConfigError,
        match=r"MRPC/train\.tsv: not a MRPC file: expected columns '#1 String', "
        r"'#2 String', 'Quality', found 'id', 'text', 'label'",
    ):
        load_splits("mrpc", data_dir=tmp_path)


def test_a_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path):
    from petl_nas.tasks import clear_cache, file_task, load_splits

    for split in ("train", "dev"):
        (tmp_path / f"{split}.csv").write_text("\ufefftext,label\ngood,pos\nbad,neg\nfine,pos\n", encoding="utf-8")
    clear_cache()
    task = file_task(str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"), text_columns=["text"])
    assert load_splits(task, search_dev_size=1).test.texts[0] == ("good", "bad", "fine")


def test_the_guides_task_family_example_registers_and_splits(tmp_path):
    """The guide's "Adding a task family" example, run as written in a fresh interpreter (the
    registry is process-wide): its task is found by name, its labels are checked, it splits."""
    import re
    import subprocess
    import sys

    guide = (REPO / "docs" / "architecture.md").read_text()
    section = guide.split("## Adding a task family", 1)[1].split("\n## ", 1)[0]
    code = (
        re.search(r"```text\n(.*?)```", section, re.S)
        .group(1)
        .replace("from .registry", "from petl_nas.tasks.registry")
    )
    check = (
        "from petl_nas.tasks import get_task, load_splits\n"
        "s = load_splits(get_task('my_polarity'), k=40)\n"
        "print(len(s.train), len(s.search_dev), len(s.test), sorted(set(s.train.labels.tolist())))\n"
    )
    (tmp_path / "family.py").write_text(code + "\n" + check)
    out = subprocess.run([sys.executable, str(tmp_path / "family.py")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["40", "8", "1", "[0,", "1]"]


def test_length_buckets_see_every_row_once_reproducibly_and_pad_less():
    """`bucketed_order`: a permutation of the rows (every row once per epoch), the same for a seed,
    another for another seed, batches of similar lengths (less padding than a uniform shuffle), and
    only the last batch short."""
    from petl_nas.tasks.encoding import EncodedSplit

    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 64, size=1000).tolist()
    split = EncodedSplit(tuple([1] * n for n in lengths), None, torch.zeros(1000, dtype=torch.long), 0)

    def padded(order, size=32):
        return sum(
            size_ * max(lengths[i] for i in b)
            for b in (order[s : s + size].tolist() for s in range(0, 1000, size))
            for size_ in [len(b)]
        )

    order = split.bucketed_order(32, seed=5, pool=8)
    assert sorted(order.tolist()) == list(range(1000))  # every row, once
    assert torch.equal(order, split.bucketed_order(32, seed=5, pool=8))  # a seed's order is reproducible
    assert not torch.equal(order, split.bucketed_order(32, seed=6, pool=8))  # another seed, another order
    uniform = torch.randperm(1000, generator=torch.Generator().manual_seed(5))
    assert padded(order) < 0.75 * padded(uniform)  # 1000 rows, 3-63 tokens
    batch_sizes = [len(b["labels"]) for b in split.batches(32, order=order)]
    assert batch_sizes[:-1] == [32] * (len(batch_sizes) - 1)
    widths = [max(lengths[i] for i in order[s : s + 32].tolist()) for s in range(0, 992, 32)]
    descents = sum(a > b for a, b in zip(widths, widths[1:]))
    assert descents > 8  # batches shuffled: not rising by length within each pool of 8


@pytest.mark.slow
def test_training_with_length_buckets_is_reproducible_and_another_order(tokenizer):
    """`Recipe.length_buckets` reaches the training loop: the same seed trains the same weights
    twice, and the bucketed order trains other weights than the uniform shuffle."""
    from petl_nas import PetlConfig, apply_petl
    from petl_nas.core.config import ModuleSpec
    from petl_nas.training.loop import Recipe, train

    encoded = encode(load_splits("demo_sentiment", k=96), tokenizer, max_length=24)
    data = type("Data", (), {"train": encoded.train, "dev": encoded.search_dev})()

    def trained(buckets):
        model = tiny_backbone(tokenizer=tokenizer, num_labels=2, seed=1)
        torch.manual_seed(0)  # the LoRA initialisation
        apply_petl(model, PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=2),)))
        train(
            model,
            data,
            get_task("demo_sentiment"),
            Recipe(lr=1e-2, epochs=1, batch_size=8, evals_per_epoch=0, length_buckets=buckets),
        )
        return torch.cat([p.detach().flatten() for p in model.parameters() if p.requires_grad])

    bucketed = trained(4)
    assert torch.equal(bucketed, trained(4))
    assert not torch.equal(bucketed, trained(0))


@pytest.mark.parametrize(
    "train, dev, words",
    [
        ("sentence,label\na,1\n,0\nc,1\n", None, "train.csv, row 2: text column 'sentence' is empty"),
        (
            '{"sentence": "a", "label": 1}\n{"label": 0}\n',
            None,
            "train.jsonl, row 2: text column 'sentence' is missing",
        ),
        ("sentence,label\n", None, "train.csv: the file has no rows"),
        ("", None, "train.csv: the file has no rows (it is empty)"),
        ("\n \n", None, "train.csv: the file has no rows (it is empty)"),
        ("sentence,label\na,1\nb,0\n", "sentence,label\n", "dev.csv: the file has no rows"),
        ("sentence,label\na,1\nb,0\n", "sentence,label\nc,1\nd,\n", "dev.csv, row 2: 'label' is empty"),
        ("sentence,label\na,2.5\nb,0\nc,4\n", None, "labels such as 2.5 look like scores: set kind: regression"),
    ],
    ids=[
        "empty-text-cell",
        "missing-text-key",
        "train-without-rows",
        "train-zero-bytes",
        "train-blank-lines",
        "dev-without-rows",
        "empty-label",
        "scores-as-classes",
    ],
)
def test_bad_rows_of_a_file_task_are_one_error_naming_the_row(tmp_path, train, dev, words):
    suffix = ".jsonl" if train.startswith("{") else ".csv"
    (tmp_path / f"train{suffix}").write_text(train)
    (tmp_path / f"dev{suffix}").write_text(dev or train)
    with pytest.raises(ConfigError) as e:
        task = file_task(tmp_path / f"train{suffix}", tmp_path / f"dev{suffix}", text_columns=["sentence"])
        load_splits(task, search_dev_fraction=0.5)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_whole_number_labels_match_however_the_file_reader_typed_them(tmp_path):
    """A label column read as floats (written 0.0/1.0, or made float by an empty cell elsewhere)
    names the same classes as one read as integers."""
    (tmp_path / "train.csv").write_text("sentence,label\na,0.0\nb,1.0\nc,1.0\nd,0.0\n")
    (tmp_path / "dev.csv").write_text("sentence,label\ne,1\nf,0\n")
    task = file_task(tmp_path / "train.csv", tmp_path / "dev.csv", text_columns=["sentence"])
    assert task.labels == ("0", "1")
    splits = load_splits(task, search_dev_fraction=0.5)
    assert splits.test.labels.tolist() == [1, 0]
    assert sorted(splits.train.labels.tolist() + splits.search_dev.labels.tolist()) == [0, 0, 1, 1]
