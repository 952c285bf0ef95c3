"""What a search is about to train and score on, said before it starts: `data_lines`.

One line gives the rows of each split (K of how many training rows, where the search dev comes
from), the classes' shares of the training rows and, with two classes, the one f1 scores, and
what ranks trials where that is not the figure reported (MRPC: accuracy, f1 beside it);
warnings follow for what would otherwise pass silently: a K cut short because the search dev came
out of it, accuracy ranking trials when one class is most of the rows, a class with no training
or no search-dev rows, and search-dev or test rows whose text is also a training row's (their
scores reward memorising).

Example:
    >>> from petl_nas.tasks import load_splits
    >>> line, = data_lines(load_splits("demo_sentiment", k=64), k=64)
    >>> line.split("; ")[1:]
    ['train classes: negative 50%, positive 50%', "f1 scores 'positive' as the positive class"]
"""

from __future__ import annotations

import numpy as np

from .splits import TaskSplits

__all__ = ["data_lines", "REPEATS_WARN", "SKEWED"]

REPEATS_WARN = 0.05
"""Share of search-dev rows repeating a training row's text from which a warning is printed."""
SKEWED = 0.8
"""Share of the training rows in one class from which accuracy as the main metric is warned of."""
_SHOWN_CLASSES = 8


def data_lines(splits: TaskSplits, k: int | None) -> list[str]:
    """The data line and its warnings (each line starts with ``warning:``)."""
    task, train, dev = splits.task, splits.train, splits.search_dev
    rows = splits.train_rows
    drawn = f"K={k:,} of {rows:,}" if k is not None else f"of {rows:,}" if splits.carved else "all"
    where = "carved from the training data" if splits.carved else "its own file"
    seen = set(zip(*train.texts))  # every training row's text, once for both checks
    repeats = _repeats(seen, dev)
    line = (
        f"data: train {len(train):,} rows ({drawn}), search-dev {len(dev):,} ({where}"
        f"{f'; {repeats:,} repeat a training text' if repeats else ''}), test {len(splits.test):,}"
    )
    warnings = []
    if k is not None and len(train) < k:
        warnings.append(
            f"warning: K={k:,} and a search dev of {len(dev):,} need {k + len(dev):,} training rows and "
            f"there are {rows:,}: the search dev comes out of the K, so trials train on {len(train):,} "
            f"(lower fidelity.search_dev or fidelity.k)"
        )
    if task.kind == "classification":
        counts = np.bincount(train.labels, minlength=len(task.labels))
        shares = [f"{label} {c / max(1, len(train)):.0%}" for label, c in zip(task.labels, counts)]
        line += "; train classes: " + ", ".join(shares[:_SHOWN_CLASSES])
        line += f", ... ({len(shares)} in all)" if len(shares) > _SHOWN_CLASSES else ""
        if len(task.labels) == 2 and any("f1" in m for m in task.metrics):
            line += f"; f1 scores {task.labels[1]!r} as the positive class" + (
                " (the second label: task labels: [...] orders them)" if task.source == "files" else ""
            )
        top = int(counts.argmax())
        if task.main_metric == "accuracy" and counts[top] >= SKEWED * max(1, len(train)):
            setting = "main_metric: mcc" + ("" if "mcc" in task.metrics else " with metrics: [accuracy, mcc]")
            warnings.append(
                f"warning: {task.labels[top]!r} is {counts[top] / len(train):.0%} of the training rows, so "
                f"accuracy mostly rewards predicting it; {setting} ranks trials by how well they tell "
                f"the classes apart"
            )
        warnings += _absent(task.labels, counts, "training rows", "trials cannot learn")
        warnings += _absent(
            task.labels, np.bincount(dev.labels, minlength=len(task.labels)), "search-dev rows", "no trial is scored on"
        )
    if task.customary_metric != task.main_metric:
        line += f"; trials rank by {task.main_metric}, {task.customary_metric} is reported beside it"
    if repeats >= REPEATS_WARN * len(dev):
        warnings.append(
            f"warning: {repeats:,} of {len(dev):,} search-dev rows ({repeats / len(dev):.0%}) repeat a "
            f"training row's text: their scores reward memorising (remove duplicate rows from the data)"
        )
    seen_test = _repeats(seen, splits.test)
    if seen_test >= REPEATS_WARN * len(splits.test):
        share = seen_test / len(splits.test)
        warnings.append(
            f"warning: {seen_test:,} of {len(splits.test):,} test rows ({share:.0%}) repeat a training "
            f"row's text: test scores overrate (is the dev file drawn from the train file?)"
        )
    return [line, *warnings]


def _repeats(seen: set, split) -> int:
    """Rows of ``split`` whose text (every text column) is among the training texts ``seen``."""
    return sum(row in seen for row in zip(*split.texts))


def _absent(labels, counts, what: str, consequence: str) -> list[str]:
    missing = [label for label, c in zip(labels, counts) if c == 0]
    if not missing:
        return []
    shown = ", ".join(map(repr, missing[:_SHOWN_CLASSES])) + (", ..." if len(missing) > _SHOWN_CLASSES else "")
    return [
        f"warning: {len(missing)} of {len(labels)} classes have no {what} ({shown}): {consequence} them "
        f"(raise fidelity.k, or change data_seed)"
    ]
