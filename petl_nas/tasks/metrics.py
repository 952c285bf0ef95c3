"""Task metrics: accuracy, F1, Matthews correlation, Pearson, Spearman (plain numpy); ROUGE and
sacreBLEU for generated text; token accuracy and perplexity for language modelling.

Every metric takes ``(predictions, references)`` as 1-D arrays (class ids for classification,
scores for regression) and returns a float. The GLUE tasks use them as follows (``ranks`` is the
figure a search maximises, the task's ``main_metric``; ``customary`` the one papers report, shown
beside it; every metric listed is computed and recorded for each trial):

=========  ==========================================  ================  ================
task       recorded                                    ranks             customary
=========  ==========================================  ================  ================
CoLA       mcc                                         mcc               mcc
SST-2      accuracy                                    accuracy          accuracy
MRPC, QQP  f1, accuracy, f1_accuracy (their mean)      accuracy          f1
STS-B      pearson, spearman, pearson_spearman (mean)  pearson_spearman  pearson_spearman
MNLI       accuracy (dev matched)                      accuracy          accuracy
QNLI, RTE  accuracy                                    accuracy          accuracy
=========  ==========================================  ================  ================

MRPC/QQP report F1 as UniPELT and He et al. do, and rank by accuracy (`ranking_metric`): where
the positive class is the majority, F1 hardly separates a learner from the constant predictor
(68% positive: F1 0.81 for predicting "positive" throughout), and GLUE's mean of F1 and accuracy
separates about half as well as accuracy alone (`RANKED_INSTEAD`). STS-B uses the mean of both
correlations as the GLUE score does, since neither paper's single choice is a better proxy for
it. Degenerate inputs (a constant column, no positive class) give 0.0 rather than NaN, so a
collapsed model scores badly instead of poisoning an optimiser with NaN.

Generation tasks score decoded strings with `text_metrics` (``rouge1``, ``rouge2``, ``rougeL``:
mean F1 of Google's ``rouge_score`` with Porter stemming, as He et al.'s scripts and BART's XSum
figures use; ``bleu``: sacreBLEU's corpus BLEU with its standard 13a tokenisation), both on the
0-100 scale the papers print. They run offline (the ``evaluate`` package would fetch metric
scripts from the hub); install them with ``pip install 'petl-nas[generation]'``. Causal-LM tasks
report ``token_accuracy`` (0-1, the main metric, higher is better) and ``perplexity``.

Example:
    >>> accuracy([1, 0, 1], [1, 1, 1])
    0.6666666666666666
    >>> spearman([1, 2, 3], [10, 30, 20])
    0.5
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

__all__ = [
    "accuracy",
    "f1",
    "mcc",
    "pearson",
    "spearman",
    "f1_accuracy",
    "pearson_spearman",
    "METRICS",
    "compute_metrics",
    "evaluate_metric",
    "rouge",
    "bleu",
    "RANKED_INSTEAD",
    "ranking_metric",
    "TEXT_METRICS",
    "text_metrics",
    "points_per_unit",
    "LM_METRICS",
    "LOWER_IS_BETTER",
    "lm_metrics",
]


def _pair(predictions, references) -> tuple[np.ndarray, np.ndarray]:
    p, r = np.asarray(predictions).ravel(), np.asarray(references).ravel()
    if p.shape != r.shape:
        raise ValueError(f"predictions and references differ in length: {p.size} vs {r.size}")
    if p.size == 0:
        raise ValueError("metrics need at least one example")
    return p, r


def accuracy(predictions, references) -> float:
    """Fraction of exact matches."""
    p, r = _pair(predictions, references)
    return float(np.mean(p == r))


def f1(predictions, references, positive=1) -> float:
    """Binary F1 of the ``positive`` class: 2·TP / (2·TP + FP + FN); 0.0 when that is 0/0.

    Example:
        >>> f1([1, 1, 0, 0], [1, 0, 1, 0])
        0.5
    """
    p, r = _pair(predictions, references)
    tp = np.sum((p == positive) & (r == positive))
    wrong = np.sum((p == positive) != (r == positive))  # FP + FN
    return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def mcc(predictions, references) -> float:
    """Matthews correlation, in its multiclass form (Gorodkin's R_K; the binary φ for two classes).

    Example:
        >>> mcc([1, 1, 0, 0], [1, 0, 0, 0])
        0.5773502691896258
    """
    p, r = _pair(predictions, references)
    classes, idx = np.unique(np.concatenate([r, p]), return_inverse=True)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (idx[: r.size], idx[r.size :]), 1)  # rows: truth, columns: prediction
    true_k, pred_k = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_pp = n * n - pred_k @ pred_k
    cov_tt = n * n - true_k @ true_k
    denom = np.sqrt(cov_pp * cov_tt)
    return float((correct * n - true_k @ pred_k) / denom) if denom else 0.0


def pearson(predictions, references) -> float:
    """Pearson's r (`scipy.stats.pearsonr`); 0.0 when either side is constant."""
    p, r = _pair(predictions, references)
    if np.ptp(p) == 0 or np.ptp(r) == 0:
        return 0.0
    from scipy import stats  # here: importing scipy costs a worker that never scores a pair

    return float(np.clip(stats.pearsonr(p.astype(np.float64), r.astype(np.float64)).statistic, -1.0, 1.0))


def spearman(predictions, references) -> float:
    """Spearman's ρ (`scipy.stats.spearmanr`: Pearson's r of the average-tie ranks); 0.0 when either
    side is constant."""
    p, r = _pair(predictions, references)
    if np.ptp(p) == 0 or np.ptp(r) == 0:
        return 0.0
    from scipy import stats

    return float(stats.spearmanr(p, r).statistic)


def f1_accuracy(predictions, references) -> float:
    """Mean of binary F1 and accuracy (GLUE's score for MRPC and QQP)."""
    return (f1(predictions, references) + accuracy(predictions, references)) / 2


def pearson_spearman(predictions, references) -> float:
    """Mean of Pearson and Spearman correlation (GLUE's score for STS-B)."""
    return (pearson(predictions, references) + spearman(predictions, references)) / 2


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "mcc": mcc,
    "pearson": pearson,
    "spearman": spearman,
    "f1_accuracy": f1_accuracy,
    "pearson_spearman": pearson_spearman,
}


RANKED_INSTEAD = {"f1": "accuracy"}
"""Customary metric -> the metric a search ranks classification trials by in its place. F1 of a
majority positive class is near its constant predictor's: on 400 rows, 68% positive, a predictor 5
points more accurate than "always positive" with the same F1 is 0.1 standard errors above it by
F1, 1.3 by the mean of F1 and accuracy (GLUE's MRPC score: its F1 half adds noise, no signal) and
2.3 by accuracy, the only one beyond the two that "did not learn" allows
(tests/tasks/test_significance.py). Between two learners, F1 and accuracy separate alike."""


def ranking_metric(customary: str, kind: str = "classification") -> str:
    """The metric a search ranks by when papers report ``customary`` (`RANKED_INSTEAD`; itself
    for every other metric, and for every metric of a task that is not a classification).

    Example:
        >>> ranking_metric("f1"), ranking_metric("mcc")
        ('accuracy', 'mcc')
    """
    return RANKED_INSTEAD.get(customary, customary) if kind == "classification" else customary


def compute_metrics(names, predictions, references) -> dict[str, float]:
    """Each named metric of 1-D predictions against references.

    Example:
        >>> compute_metrics(["accuracy", "f1"], [1, 0], [1, 1])
        {'accuracy': 0.5, 'f1': 0.6666666666666666}
    """
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric {unknown[0]!r}; available: {', '.join(METRICS)}")
    return {n: METRICS[n](predictions, references) for n in names}


def evaluate_metric(name: str, config_name: str | None = None):
    """``evaluate.load(name, config_name)``, or None when it cannot be had (offline, or the
    ``evaluate`` extra not installed: ``pip install 'petl-nas[evaluate]'``; nothing else needs it).

    Useful to cross-check the numpy metrics where the hub is reachable; never raises, and imports
    ``evaluate`` only when called because that import takes seconds.

    Example:
        >>> glue = evaluate_metric("glue", "mrpc")  # doctest: +SKIP
        >>> glue is None or "f1" in glue.compute(predictions=[1], references=[1])  # doctest: +SKIP
        True
    """
    try:
        import evaluate

        return evaluate.load(name, config_name)
    except Exception:  # offline, missing module, unknown name: all mean "not available here"
        return None


# ---- generated text --------------------------------------------------------------------------
TEXT_METRICS = ("rouge1", "rouge2", "rougeL", "bleu")


def _require(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        from ..errors import ConfigError

        raise ConfigError(
            f"generation metrics need the {package} package: pip install 'petl-nas[generation]'"
        ) from None


def _texts(predictions, references) -> tuple[list[str], list[str]]:
    p, r = [str(x) for x in predictions], [str(x) for x in references]
    if len(p) != len(r):
        raise ValueError(f"predictions and references differ in length: {len(p)} vs {len(r)}")
    if not p:
        raise ValueError("metrics need at least one example")
    return p, r


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # kana and CJK ideographs
_TOKEN = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")


class _AnyScriptTokenizer:
    """ROUGE's tokenization for every script: lower case, runs of letters and digits, Porter stems
    of ASCII words over 3 letters, and each kana or CJK ideograph a token of its own (no spaces
    part their words). rouge_score's default keeps only a-z and 0-9, so a Cyrillic, Greek or Arabic
    prediction identical to its reference scores 0 and "été" reads "t". On ASCII text the two agree."""

    def __init__(self):
        from nltk.stem import porter  # what rouge_score's default tokenizer stems with

        self._stem = porter.PorterStemmer().stem

    def tokenize(self, text: str) -> list[str]:
        return [self._stem(t) if len(t) > 3 and t.isascii() else t for t in _TOKEN.findall(text.lower())]


def rouge(predictions, references, types=("rouge1", "rouge2", "rougeL")) -> dict[str, float]:
    """Mean ROUGE F1 (x100) per type, with Porter stemming, in any script (`_AnyScriptTokenizer`).

    Example:
        >>> {k: round(v, 2) for k, v in rouge(["the cat sat on the mat"], ["the cat is on the mat"]).items()}
        {'rouge1': 83.33, 'rouge2': 60.0, 'rougeL': 83.33}
        >>> rouge(["Это хороший день"], ["Это хороший день"])["rougeL"]
        100.0
    """
    p, r = _texts(predictions, references)
    scorer = _require("rouge_score.rouge_scorer", "rouge-score").RougeScorer(
        list(types), tokenizer=_AnyScriptTokenizer()
    )
    sums = dict.fromkeys(types, 0.0)
    for hyp, ref in zip(p, r):
        for t, score in scorer.score(ref, hyp).items():  # score(target, prediction)
            sums[t] += score.fmeasure
    return {t: 100.0 * v / len(p) for t, v in sums.items()}


def bleu(predictions, references) -> float:
    """sacreBLEU corpus BLEU (0-100) of detokenised predictions against one reference each.

    Example:
        >>> round(bleu(["the cat sat on the mat"], ["the cat is on the mat"]), 2)
        37.99
    """
    p, r = _texts(predictions, references)
    return float(_require("sacrebleu", "sacrebleu").corpus_bleu(p, [r]).score)


def points_per_unit(metric: str) -> float:
    """How many points (as margins and differences are given) one unit of ``metric`` is: 100 for a
    metric from 0 to 1 (an accuracy of 0.01 is one point), 1 for ROUGE and BLEU (already 0-100).

    Example:
        >>> points_per_unit("accuracy"), points_per_unit("rougeL")
        (100.0, 1.0)
    """
    return 1.0 if metric in TEXT_METRICS else 100.0


def text_metrics(names, predictions, references) -> dict[str, float]:
    """Each named text metric (``rouge1``, ``rouge2``, ``rougeL``, ``bleu``) of decoded strings."""
    unknown = [n for n in names if n not in TEXT_METRICS]
    if unknown:
        raise KeyError(f"unknown text metric {unknown[0]!r}; available: {', '.join(TEXT_METRICS)}")
    out = {}
    kinds = [n for n in names if n.startswith("rouge")]
    if kinds:
        out.update(rouge(predictions, references, kinds))
    if "bleu" in names:
        out["bleu"] = bleu(predictions, references)
    return {n: out[n] for n in names}


# ---- language modelling ----------------------------------------------------------------------
LM_METRICS = ("token_accuracy", "perplexity")
LOWER_IS_BETTER = ("perplexity",)  # reported beside the main metric; the search maximises that one


def lm_metrics(names, nll_sum: float, correct: int, tokens: int) -> dict[str, float]:
    """``token_accuracy`` (share of scored tokens predicted exactly) and ``perplexity``
    (exp of the mean negative log-likelihood per scored token) from sums over a split.

    Example:
        >>> lm_metrics(["token_accuracy", "perplexity"], nll_sum=0.0, correct=3, tokens=4)
        {'token_accuracy': 0.75, 'perplexity': 1.0}
    """
    if tokens <= 0:
        raise ValueError("metrics need at least one scored token")
    values = {"token_accuracy": correct / tokens, "perplexity": float(np.exp(min(nll_sum / tokens, 700.0)))}
    return {n: values[n] for n in names}
