"""The demo classification tasks: generated sentences, no download, the same rows on every machine.

- ``demo_sentiment``: which sentiment dominates a sentence; "not" flips the word after it, and 5%
  of labels are flipped, so no single token decides the label and accuracy tops out near 95%.
- ``demo_keyword``: one sentiment word among filler words decides the label, no negation, no
  noise: a task a tiny random model learns in seconds (tests and smoke runs).

Both have 2,000 training rows and 500 dev rows (the test set); ``data_seed`` only re-splits them.

Example:
    >>> load_demo(DEMO_TASKS["demo_keyword"])["train"].texts[0][0]  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from .registry import Split, Task, make_split, register_source, register_task

__all__ = ["DEMO_TASKS", "load_demo"]

DEMO_TASKS: dict[str, Task] = {
    name: Task(
        name,
        ("sentence",),
        "label",
        labels=("negative", "positive"),
        main_metric="accuracy",
        metrics=("accuracy", "f1"),
        source="demo",
    )
    for name in ("demo_sentiment", "demo_keyword")
}

_POSITIVE = ("good", "great", "excellent", "wonderful", "delightful", "superb", "charming", "moving")
_NEGATIVE = ("bad", "awful", "boring", "dull", "terrible", "clumsy", "tedious", "bland")
_FILLER = (
    "the",
    "film",
    "movie",
    "plot",
    "actors",
    "story",
    "a",
    "was",
    "with",
    "and",
    "its",
    "scenes",
    "director",
    "this",
    "music",
    "ending",
    "script",
    "quite",
    "cast",
    "of",
    "it",
    "is",
)


def _demo_rows(n: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    sentences, labels = [], []
    while len(sentences) < n:
        words = list(rng.choice(_FILLER, size=rng.integers(4, 11)))
        score = 0
        for _ in range(rng.integers(1, 5)):
            positive, negated = rng.random() < 0.5, rng.random() < 0.2
            word = rng.choice(_POSITIVE if positive else _NEGATIVE)
            score += 1 if positive != negated else -1
            words.insert(int(rng.integers(0, len(words) + 1)), f"not {word}" if negated else word)
        if score == 0:
            continue
        noisy = rng.random() < 0.05
        labels.append("positive" if (score > 0) != noisy else "negative")
        sentences.append(" ".join(words))
    return sentences, labels


def _keyword_rows(n: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """demo_keyword: one sentiment word among filler words decides the label, no negation, no
    noise: a task a tiny random model learns in seconds (tests and smoke runs)."""
    sentences, labels = [], []
    for _ in range(n):
        positive = rng.random() < 0.5
        words = list(rng.choice(_FILLER, size=rng.integers(3, 9)))
        words.insert(int(rng.integers(0, len(words) + 1)), rng.choice(_POSITIVE if positive else _NEGATIVE))
        sentences.append(" ".join(words))
        labels.append("positive" if positive else "negative")
    return sentences, labels


def load_demo(task: Task, data_dir=None) -> dict[str, Split]:
    """``train`` (2,000) and ``dev`` (500) rows of a demo task; ``data_dir`` is ignored."""
    rng = np.random.default_rng(20220)  # fixed: the data never changes; data_seed only re-splits it
    rows = _keyword_rows if task.name == "demo_keyword" else _demo_rows
    out = {}
    for split, n in (("train", 2000), ("dev", 500)):
        sentences, labels = rows(n, rng)
        out[split] = make_split(task, [sentences], labels, lambda i, s=split: f"demo {s}, row {i + 1}")
    return out


for _task in DEMO_TASKS.values():
    register_task(_task)
register_source("demo", load_demo)
