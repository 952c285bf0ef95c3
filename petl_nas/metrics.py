"""Task metrics in plain numpy: accuracy, F1, Matthews correlation, Pearson, Spearman.

Every metric takes ``(predictions, references)`` as 1-D arrays (class ids for classification,
scores for regression) and returns a float. The GLUE tasks use them as follows (``main`` is the
one figure a search maximises; the others are reported next to it):

=========  ==========================================  ====================
task       reported                                    main
=========  ==========================================  ====================
CoLA       mcc                                         mcc
SST-2      accuracy                                    accuracy
MRPC, QQP  f1, accuracy, f1_accuracy (their mean)      f1
STS-B      pearson, spearman, pearson_spearman (mean)  pearson_spearman
MNLI       accuracy (dev matched)                      accuracy
QNLI, RTE  accuracy                                    accuracy
=========  ==========================================  ====================

MRPC/QQP use F1 as UniPELT and He et al. report them; STS-B uses the mean of both correlations
as the GLUE score does, since neither paper's single choice is a better proxy for it. Degenerate
inputs (a constant column, no positive class) give 0.0 rather than NaN, so a collapsed model
scores badly instead of poisoning an optimiser with NaN.

Example:
    >>> accuracy([1, 0, 1], [1, 1, 1])
    0.6666666666666666
    >>> spearman([1, 2, 3], [10, 30, 20])
    0.5
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["accuracy", "f1", "mcc", "pearson", "spearman", "f1_accuracy", "pearson_spearman",
           "rankdata", "METRICS", "compute_metrics", "evaluate_metric"]


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
    np.add.at(confusion, (idx[:r.size], idx[r.size:]), 1)  # rows: truth, columns: prediction
    true_k, pred_k = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_pp = n * n - pred_k @ pred_k
    cov_tt = n * n - true_k @ true_k
    denom = np.sqrt(cov_pp * cov_tt)
    return float((correct * n - true_k @ pred_k) / denom) if denom else 0.0


def pearson(predictions, references) -> float:
    """Pearson's r; 0.0 when either side is constant."""
    p, r = _pair(predictions, references)
    p, r = p.astype(np.float64) - p.mean(), r.astype(np.float64) - r.mean()
    denom = np.sqrt((p @ p) * (r @ r))
    return float(np.clip((p @ r) / denom, -1.0, 1.0)) if denom else 0.0


def rankdata(values) -> np.ndarray:
    """1-based ranks, ties sharing the average of the ranks they span (scipy's ``average``).

    Example:
        >>> rankdata([10, 20, 20, 5]).tolist()
        [2.0, 3.5, 3.5, 1.0]
    """
    v = np.asarray(values).ravel()
    order = np.argsort(v, kind="mergesort")
    sorted_v = v[order]
    # Each run of equal values gets the mean of its first and last 1-based positions.
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    ends = np.r_[starts[1:], v.size]
    run_rank = (starts + 1 + ends) / 2.0
    ranks = np.empty(v.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(predictions, references) -> float:
    """Spearman's ρ: Pearson's r of the average-tie ranks."""
    p, r = _pair(predictions, references)
    return pearson(rankdata(p), rankdata(r))


def f1_accuracy(predictions, references) -> float:
    """Mean of binary F1 and accuracy (GLUE's score for MRPC and QQP)."""
    return (f1(predictions, references) + accuracy(predictions, references)) / 2


def pearson_spearman(predictions, references) -> float:
    """Mean of Pearson and Spearman correlation (GLUE's score for STS-B)."""
    return (pearson(predictions, references) + spearman(predictions, references)) / 2


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman,
    "f1_accuracy": f1_accuracy, "pearson_spearman": pearson_spearman,
}


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
    """``evaluate.load(name, config_name)``, or None when it cannot be had (offline, not installed).

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
