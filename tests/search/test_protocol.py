"""The honest protocol: no decision reads the test split.

Two searches that differ only in their test split (the second has every test label flipped) make
the same decisions: the sampler proposes the same configurations, the same trials are trained and
scored the same, the front is the same and `export` picks the same trial. Only the final
re-evaluation, which reports on the test split, differs. If sampling, pruning, the front or the
export choice ever read a test score, the flipped labels would show up here.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import optuna
import pytest
from conftest import NO_RATES, TINY_BACKBONE

from petl_nas.deploy.export import choose
from petl_nas.search.driver import run_search
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval
from petl_nas.tasks import clear_cache


def write_rows(path, sentences, labels) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"])
        w.writerows(zip(sentences, labels))
    return str(path)


def rows(n: int, seed: int):
    """An easy task a tiny random model learns in seconds: one sentiment word among filler words."""
    rng = np.random.default_rng(seed)
    words = {"positive": ["good", "great", "superb", "lovely"], "negative": ["bad", "awful", "dull", "poor"]}
    filler = ["the", "film", "plot", "was", "a", "and", "its", "cast", "story", "music"]
    sentences, labels = [], []
    for _ in range(n):
        label = str(rng.choice(["positive", "negative"]))
        sentence = list(rng.choice(filler, size=int(rng.integers(3, 8))))
        sentence.insert(int(rng.integers(0, len(sentence) + 1)), str(rng.choice(words[label])))
        sentences.append(" ".join(sentence))
        labels.append(label)
    return sentences, labels


@pytest.fixture
def two_test_splits(tmp_path):
    """One train file, and a test file in two versions: the second with every label flipped."""
    train_file = write_rows(tmp_path / "train.csv", *rows(400, seed=1))
    sentences, labels = rows(120, seed=2)
    flipped = ["negative" if y == "positive" else "positive" for y in labels]
    tests = [write_rows(tmp_path / f"test{i}.csv", sentences, ys) for i, ys in enumerate((labels, flipped))]
    return train_file, tests


def search(tmp_path, name: str, train_file: str, test_file: str) -> optuna.Study:
    task = {"train": train_file, "dev": test_file, "text_columns": ["sentence"], "labels": ["negative", "positive"]}
    exp = Experiment(
        rates=NO_RATES,
        name=name,
        backbone=TINY_BACKBONE,
        task=task,
        budget="5%",
        space="small",
        trials=5,
        presets=["pfeiffer", "bitfit"],
        executor="local",
        sampler="tpe",
        startup_trials=2,
        storage=f"sqlite:///{tmp_path}/{name}.db",
        fidelity=Fidelity(length_buckets=0, k=None, epochs=4, batch_size=16, max_length=24, search_dev=100),
        final=FinalEval(seeds=1, epochs=4, max_front=3, presets="best", baselines=False),
    )
    clear_cache()
    run_search(dataclasses.replace(exp), printer=lambda line: None)
    return optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)


@pytest.mark.slow
def test_flipping_every_test_label_changes_no_decision(tmp_path, monkeypatch, two_test_splits):
    monkeypatch.chdir(tmp_path)
    train_file, (test_a, test_b) = two_test_splits
    a, b = (search(tmp_path, name, train_file, t) for name, t in (("a", test_a), ("b", test_b)))

    def decisions(study):
        return [(t.number, t.state, t.params, t.values, t.user_attrs.get("preset")) for t in study.trials]

    assert decisions(a) == decisions(b)  # sampling, training, pruning
    assert [t.number for t in a.best_trials] == [t.number for t in b.best_trials]  # the front
    for pick in ("best", "smallest-within=5"):
        assert choose(a, None, pick).number == choose(b, None, pick).number  # the export choice
    by_search = max(a.best_trials, key=lambda t: (t.values[0], -t.values[1])).number
    assert choose(a).number == choose(b).number == by_search  # ... by search score
    finals = {k: (a.user_attrs[k]["mean"], b.user_attrs[k]["mean"]) for k in a.user_attrs if k.startswith("final:")}
    assert finals and all(abs(x + y - 1) < 1e-9 for x, y in finals.values())  # the test split did differ: a = 1 - b
