"""Every score has a floor and an error bar: trivial baselines, standard errors, noise-aware comparisons.

- `trivial_baseline`: what a model that learned nothing scores on the search-dev split: the best
  constant class (the majority class, or the class a metric such as F1 favours), a constant for
  regression (no correlation: 0), or copying the source for sequence-to-sequence tasks.
- `standard_error`: a score's standard error over the rows it was measured on: binomial for
  accuracy (Agresti-Coull's, two successes and two failures added, so that 0 and 1 keep an error
  bar), a bootstrap (fixed seed) for F1, MCC and correlations.
- `did_not_learn`: within noise of the baseline (no more than two standard errors above it).
- `clearly_better`: a difference beyond two standard errors of the difference.
- `paired_difference`: per-seed differences of two configurations trained with the same seeds.
- `row_gain`: the gain of one configuration's mean over seeds above another's, with its standard
  error over the rows (a paired bootstrap: the same resampled rows for every seed of both), and
  `encode_rows` / `decode_rows`, the compact text in which trials and studies keep per-row
  predictions and labels for it.

Example:
    >>> did_not_learn(0.7988, 0.012, {"score": 0.7988})
    True
"""

from __future__ import annotations

import base64
import math
import statistics
from collections import Counter

import numpy as np

Z = 2.0  # "beyond noise": more than two standard errors
BOOTSTRAP_SAMPLES = 200


def trivial_baseline(task, splits) -> dict | None:
    """``{"score", "metric", "what", "test_score"}`` of the task's trivial predictor: chosen and
    scored on ``splits.search_dev``, and the same predictor scored on the test split (reported
    beside test scores, never used to choose; None when the test split has no labels). Where the
    task ranks by another metric than its customary one, ``"customary"`` holds the same predictor's
    ``{"metric", "score", "test_score"}`` by that one (MRPC: F1 beside accuracy)."""
    dev, test, metric = splits.search_dev, getattr(splits, "test", None), task.main_metric
    if task.kind == "classification":
        refs = np.asarray(dev.labels, dtype=np.int64)
        majority = Counter(np.asarray(splits.train.labels, dtype=np.int64).tolist()).most_common(1)[0][0]
        scored = [(task.compute_metrics(np.full(len(refs), c), refs), c) for c in range(task.num_labels)]
        on_dev, best = max(scored, key=lambda sc: (sc[0][metric], sc[1] == majority))
        kind = "the majority class" if best == majority else "the best constant class"
        on_test = _on_test(
            test, lambda refs: task.compute_metrics(np.full(len(refs), best), np.asarray(refs, dtype=np.int64))
        )
        out = {
            "score": float(on_dev[metric]),
            "metric": metric,
            "what": f"constant {task.labels[best]!r} ({kind})",
            "test_score": None if on_test is None else float(on_test[metric]),
        }
        customary = task.customary_metric
        if customary != metric:
            out["customary"] = {
                "metric": customary,
                "score": float(on_dev[customary]),
                "test_score": None if on_test is None else float(on_test[customary]),
            }
        return out
    if task.kind == "regression":
        return {
            "score": 0.0,
            "metric": metric,
            "what": "a constant (the training mean): no correlation",
            "test_score": 0.0,
        }
    if task.kind == "seq2seq":
        sources = [texts[0] for texts in zip(*dev.texts)]
        if sources == [str(t) for t in dev.labels]:
            return None  # every target is its source: copying is the task itself, not a floor
        score = task.compute_metrics(sources, list(dev.labels))[metric]
        on_test = _on_test(
            test, lambda refs: float(task.compute_metrics([texts[0] for texts in zip(*test.texts)], list(refs))[metric])
        )
        return {"score": float(score), "metric": metric, "what": "copying the source", "test_score": on_test}
    return None  # causal LM: token accuracy needs a model; no trivial floor is computed


def _on_test(test, score_of):
    """``score_of(the test split's labels)``, or None without a labelled test split."""
    labels = getattr(test, "labels", None)
    if labels is None or len(labels) == 0:
        return None
    return score_of(labels)


def mean_std(mean: float, std: float | None, n: int | None) -> str:
    """``mean ± std`` over ``n`` seeds; one seed has no spread to show, so it is said instead
    (``0.7661 (1 seed)``, not ``± 0.0000``)."""
    if n == 1:
        return f"{mean:.4f} (1 seed)"
    return f"{mean:.4f} ± {std or 0.0:.4f}"


def has_error_bar(task) -> bool:
    """Whether trials of ``task`` get a standard error (`standard_error`): not generation's metrics."""
    return task.kind in ("classification", "regression")


def standard_error(task, predictions, references) -> float | None:
    """The main metric's standard error over these rows (None where none is computed: generation)."""
    if not has_error_bar(task):
        return None
    p, r = np.asarray(predictions), np.asarray(references).ravel()
    if task.kind == "classification" and p.ndim == 2:
        p = p.argmax(-1)
    p, n = p.ravel(), len(r)
    if n < 2:
        return None
    if task.main_metric == "accuracy":  # Agresti-Coull at z = 2: as the plain binomial one inside,
        right = float(np.sum(p == r))  # and not 0 at an accuracy of 0 or 1 (where any gap was "beyond noise")
        acc = (right + Z**2 / 2) / (n + Z**2)
        return math.sqrt(acc * (1 - acc) / (n + Z**2))
    rng = np.random.default_rng(0)
    scores = []
    for _ in range(BOOTSTRAP_SAMPLES):
        idx = rng.integers(0, n, n)
        value = task.compute_metrics(p[idx], r[idx])[task.main_metric]
        if math.isfinite(value):
            scores.append(value)
    return float(np.std(scores, ddof=1)) if len(scores) > 1 else None


def did_not_learn(score: float, se: float | None, baseline: dict | None) -> bool:
    """True when ``score`` is within noise of the baseline (at most ``Z`` standard errors above)."""
    if baseline is None or score is None:
        return False
    return score - baseline["score"] <= Z * (se or 0.0) + 1e-12


def clearly_better(a: float, se_a: float | None, b: float, se_b: float | None) -> bool:
    """``a`` beats ``b`` beyond noise: by more than ``Z`` standard errors of the difference."""
    return a - b > Z * math.sqrt((se_a or 0.0) ** 2 + (se_b or 0.0) ** 2)


def paired_difference(a: list[float], b: list[float]) -> dict:
    """Mean and standard deviation of per-seed differences a_i - b_i (same seeds, same data order);
    one seed has no standard deviation (None)."""
    diffs = [x - y for x, y in zip(a, b)]
    return {
        "mean": statistics.fmean(diffs),
        "std": statistics.stdev(diffs) if len(diffs) > 1 else None,
        "n": len(diffs),
        "wins": sum(d > 0 for d in diffs),
    }


def encode_rows(values) -> str:
    """Per-row values (class ids, scores or labels) as compact text: base64 of little-endian float32
    (exact for class ids; a score to float32's 7 digits)."""
    return base64.b64encode(np.asarray(values, dtype="<f4").ravel().tobytes()).decode("ascii")


def decode_rows(text: str) -> np.ndarray:
    """What `encode_rows` wrote, as a float array."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float64)


def row_gain(a: list, b: list, labels, metric: str, samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float | None]:
    """(gain, its standard error over rows): ``metric``'s mean over ``a``'s seeds minus its mean over
    ``b``'s, each seed a per-row prediction array on the same ``labels``; the error from a paired
    bootstrap of the rows (fixed seed; every seed of both scored on the same resampled rows). None
    when the rows cannot be resampled (fewer than 2, or arrays of other lengths than the labels).

    A gain that holds on every seed is still measured on one draw of rows: over seeds alone, a
    384-parameter prompt that trailed by 0.2-0.6 points on three seeds (under 2 of 500 rows) was
    beyond noise on search-dev, and led by 0.7 points on test."""
    from .metrics import compute_metrics

    labels = np.asarray(labels, dtype=np.float64)
    a, b = [np.asarray(x, dtype=np.float64) for x in a], [np.asarray(x, dtype=np.float64) for x in b]
    n = len(labels)

    def gain(idx) -> float:
        score = lambda runs: statistics.fmean(compute_metrics([metric], r[idx], labels[idx])[metric] for r in runs)
        return score(a) - score(b)

    whole = gain(slice(None)) if n and all(len(x) == n for x in a + b) else None
    if whole is None or n < 2 or not a or not b:
        return (whole if whole is not None else math.nan), None
    rng = np.random.default_rng(0)
    draws = [gain(rng.integers(0, n, n)) for _ in range(samples)]
    draws = [d for d in draws if math.isfinite(d)]
    return whole, (float(np.std(draws, ddof=1)) if len(draws) > 1 else None)


__all__ = [
    "trivial_baseline",
    "has_error_bar",
    "standard_error",
    "did_not_learn",
    "clearly_better",
    "paired_difference",
    "row_gain",
    "encode_rows",
    "decode_rows",
    "Z",
]
