"""Search-dev against the test split: a split of other inputs is flagged, in the search's output, the
study and the summary; one of the same inputs, or too small to tell, is not."""

import csv
import dataclasses
import random

import numpy as np
import optuna
import pytest
from conftest import NO_RATES, SHARED_GLUE, TINY_BACKBONE

from petl_nas.search.driver import run_search
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval
from petl_nas.tasks import Split, load_splits
from petl_nas.tasks.shift import input_shift, words_per_row

GLUE = SHARED_GLUE


def rows(*lengths: int) -> Split:
    return Split((tuple(" ".join(["w"] * n) for n in lengths),), np.zeros(len(lengths), dtype=np.int64))


def test_words_are_counted_over_every_text_column():
    pair = Split((("a b", "c"), ("d e f", "")), np.zeros(2, dtype=np.int64))
    assert words_per_row(pair).tolist() == [5, 1]


@pytest.mark.skipif(not (GLUE / "SST-2" / "train.tsv").exists(), reason="needs ../shared/data/glue")
def test_sst2s_phrases_are_flagged_against_its_sentences_and_colas_rows_are_not():
    sst2 = load_splits("sst2", data_dir=GLUE, k=1000, search_dev_size=1000)
    shift = input_shift(sst2.search_dev, sst2.test)
    assert shift["shifted"] and shift["search_dev_words"] == 6 and shift["test_words"] == 19
    cola = load_splits("cola", data_dir=GLUE, k=1000, search_dev_size=1000)
    assert not input_shift(cola.search_dev, cola.test)["shifted"]


def test_a_search_dev_too_small_to_tell_is_not_flagged():
    test = rows(*([5] * 150 + [10] * 150))
    assert input_shift(rows(*[5] * 6), test)["ks"] == 0.5  # a large gap, but six rows could draw it
    assert not input_shift(rows(*[5] * 6), test)["shifted"]
    assert input_shift(rows(*[5] * 60), test)["shifted"]
    assert not input_shift(rows(*([5] * 100 + [10] * 100)), test)["shifted"]
    assert input_shift(rows(), test) is None


def test_a_difference_beyond_chance_but_small_is_not_flagged():
    big = input_shift(rows(*([5] * 900 + [10] * 100)), rows(*([5] * 800 + [10] * 200)))
    assert big["ks"] == 0.1 and big["p"] < 0.001 and not big["shifted"]


def test_a_search_whose_search_dev_is_shorter_than_its_test_rows_says_so(tmp_path, monkeypatch):
    """The search dev is carved from train (short rows); the test split is the dev file (long rows)."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(0)
    words = {"1": ["great", "fine", "superb"], "0": ["bad", "dull", "awful"]}
    for split, n, length in (("train", 200, 2), ("dev", 60, 12)):
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for _ in range(n):
                y = rng.choice("01")
                w.writerow([" ".join(rng.choice(words[y]) for _ in range(length)), y])
    task = {"train": "train.csv", "dev": "dev.csv", "text_columns": ["text"], "label_column": "label"}
    exp = Experiment(
        rates=NO_RATES,
        name="shift",
        backbone=TINY_BACKBONE,
        task=task,
        budget="5%",
        space="small",
        trials=1,
        presets=["bitfit"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/study.db",
        fidelity=Fidelity(length_buckets=0, k=None, epochs=1, batch_size=16, max_length=16, search_dev=60),
        final=FinalEval(seeds=0, baselines=False),
    )
    out = []
    summary = run_search(exp, printer=out.append)
    stored = optuna.load_study(study_name="shift", storage=exp.storage_url).user_attrs["input_shift"]
    assert stored["shifted"] and stored["search_dev_words"] == 2 and stored["test_words"] == 12
    warning = [line for line in out if line.startswith("inputs: ")]
    assert len(warning) == 1 and "does not look like the test split" in warning[0]
    assert "does not look like" not in summary.table()  # said once: not again under the front
    later = dataclasses.replace(summary, said=set()).table().replace("\n  ", " ")  # a later read says it
    assert "does not look like the test split" in later
