"""Metrics: hand-computed values, then agreement with scipy and scikit-learn where installed."""

import sys

import numpy as np
import pytest

from petl_nas.tasks import metrics
from petl_nas.tasks.metrics import (
    accuracy,
    compute_metrics,
    evaluate_metric,
    f1,
    f1_accuracy,
    mcc,
    pearson,
    pearson_spearman,
    spearman,
)


def test_hand_computed_classification():
    pred, ref = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]  # TP 2, FP 1, FN 1, TN 1
    assert accuracy(pred, ref) == pytest.approx(3 / 5)
    assert f1(pred, ref) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert mcc(pred, ref) == pytest.approx((2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2))
    assert f1_accuracy(pred, ref) == pytest.approx((2 / 3 + 3 / 5) / 2)


def test_hand_computed_correlations():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # cov 4 / sqrt(5 * 5)
    assert spearman([10, 20, 20, 5], [2, 3, 4, 1]) == pytest.approx(0.9486832980505138)  # tied ranks 3.5, 3.5
    assert spearman([1, 2, 3], [10, 30, 20]) == pytest.approx(1 - 6 * 2 / (3 * 8))
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)  # monotone, not linear
    assert pearson_spearman([1, 2, 3], [10, 30, 20]) == pytest.approx((0.5 + 0.5) / 2)


def test_sts_b_score_is_the_mean_of_two_different_correlations():
    """A case where Pearson (about 0.98) and Spearman (1.0) differ, so dropping either shows."""
    pred, ref = [1, 2, 3, 4], [1, 4, 9, 16]
    assert pearson(pred, ref) < 0.99
    assert pearson_spearman(pred, ref) == pytest.approx((pearson(pred, ref) + 1.0) / 2)
    assert compute_metrics(["pearson_spearman"], pred, ref)["pearson_spearman"] == pytest.approx(
        (pearson(pred, ref) + spearman(pred, ref)) / 2
    )


def test_degenerate_inputs_score_zero_not_nan():
    assert f1([0, 0], [0, 0]) == 0.0
    assert mcc([1, 1, 1], [0, 1, 1]) == 0.0
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0
    assert spearman([2, 2, 2], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError, match="length"):
        accuracy([1, 0], [1])


def test_multiclass_mcc_perfect_and_named_metrics():
    assert mcc([0, 1, 2, 2], [0, 1, 2, 2]) == pytest.approx(1.0)
    assert compute_metrics(["accuracy", "f1"], [1, 0], [1, 1]) == {"accuracy": 0.5, "f1": pytest.approx(2 / 3)}
    with pytest.raises(KeyError, match="unknown metric 'bleu'"):
        compute_metrics(["bleu"], [1], [1])


@pytest.mark.parametrize("seed", range(5))
def test_classification_agrees_with_sklearn(seed):
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    ref, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert accuracy(pred, ref) == pytest.approx(skm.accuracy_score(ref, pred))
    assert f1(pred, ref) == pytest.approx(skm.f1_score(ref, pred))
    assert mcc(pred, ref) == pytest.approx(skm.matthews_corrcoef(ref, pred))
    ref3, pred3 = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert mcc(pred3, ref3) == pytest.approx(skm.matthews_corrcoef(ref3, pred3))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_agree_with_scipy(seed):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    ref = rng.integers(0, 6, 300).astype(float)  # many ties, like STS-B's 0-5 scale
    pred = ref + rng.normal(0, 2, 300).round(1)
    assert pearson(pred, ref) == pytest.approx(stats.pearsonr(pred, ref)[0])
    assert spearman(pred, ref) == pytest.approx(stats.spearmanr(pred, ref)[0])


def test_evaluate_metric_returns_none_when_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "evaluate", None)  # import fails as if not installed
    assert evaluate_metric("accuracy") is None
    assert set(metrics.__all__) >= {"accuracy", "f1", "mcc", "pearson", "spearman", "evaluate_metric"}


def test_rouge_reads_every_script_and_agrees_with_rouge_score_on_english():
    """rouge_score's default tokenizer keeps a-z and 0-9 only: a Russian prediction identical to its
    reference scored 0, and "été" read "t". ROUGE here tokenizes every script (each CJK character
    a token) and gives rouge_score's own figures on English."""
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    from petl_nas.tasks.metrics import rouge

    assert rouge(["Это хороший день"], ["Это хороший день"]) == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}
    assert rouge(["un été chaud"], ["un hiver chaud"])["rouge1"] == pytest.approx(100 * 2 / 3)
    assert rouge(["今天天气很好"], ["今天天气不好"])["rouge1"] == pytest.approx(100 * 5 / 6)  # 5 of 6 characters
    english = (
        ["The cats were running quickly, weren't they? 42 times", "a U.S.A.-made film: 3.14 stars"],
        ["the cat runs quick: 42 time", "an American film of 3 stars"],
    )
    default = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {
        t: 100 * sum(default.score(r, p)[t].fmeasure for p, r in zip(*english)) / 2
        for t in ("rouge1", "rouge2", "rougeL")
    }
    assert rouge(*english) == pytest.approx(expected)
