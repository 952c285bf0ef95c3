"""Does search-dev look like the test split? A check of the inputs, made before the search.

The search ranks trials on search-dev (carved from the training data); the final runs report on
the test split (the task's own dev set). Where the two hold different kinds of input, a ranking on
one need not hold on the other: SST-2's training file is mostly phrases of the treebank (median 6
words) and its dev file whole sentences (19), and there one prompt token scored within noise of
LoRA r=8 on search-dev and 3.4 points below it on test (experiments/oneshot/README.md, v8).

`input_shift` compares the words per row (every text column together) of the two splits with the
two-sample Kolmogorov-Smirnov statistic D, the largest gap between their cumulative distributions.
The splits differ when D is at least `SHIFT_D` (a fifth of the rows on one side of some length
beyond the other) and the difference is not chance (p below `SHIFT_P`), so a small search-dev is
not flagged for its noise. It reads the test split's inputs only, never its labels, and decides
nothing: the search prints it and stores it on the study (``input_shift``). Lengths are one view
of a shift, not all of it (same lengths, other topics pass), and text written without spaces is
one word per row, so it is never flagged.

Example:
    >>> from petl_nas.tasks import Split
    >>> import numpy as np
    >>> short = Split((("good",) * 300,), np.zeros(300, dtype=int))
    >>> long = Split((("a long and winding sentence that goes on",) * 300,), np.zeros(300, dtype=int))
    >>> input_shift(short, long)["shifted"]
    True
"""

from __future__ import annotations

import numpy as np
from scipy.stats import ks_2samp

from . import Split

SHIFT_D = 0.2  # the KS statistic from which search-dev and test count as different inputs
SHIFT_P = 0.001  # ... when a difference that large is this unlikely by chance


def words_per_row(split: Split) -> np.ndarray:
    """Whitespace-separated words in each row, every text column together."""
    return np.array([sum(len(col[i].split()) for col in split.texts) for i in range(len(split))], dtype=np.int64)


def input_shift(search_dev: Split, test: Split) -> dict | None:
    """Median words per row of each split, the KS statistic and its p-value, and whether they differ
    (None when either split is empty)."""
    a, b = words_per_row(search_dev), words_per_row(test)
    if not len(a) or not len(b):
        return None
    result = ks_2samp(a, b)
    d, p = float(result.statistic), float(result.pvalue)
    return {
        "search_dev_words": float(np.median(a)),
        "test_words": float(np.median(b)),
        "ks": round(d, 4),
        "p": p,
        "shifted": bool(d >= SHIFT_D and p < SHIFT_P),
    }


def shift_line(shift: dict) -> str:
    """One line for the search's output: the comparison, and what to do when the splits differ."""
    line = (
        f"inputs: search-dev rows have a median of {shift['search_dev_words']:g} words, the test split's "
        f"{shift['test_words']:g} (KS {shift['ks']:.2f})"
    )
    if not shift["shifted"]:
        return line
    return (
        line + ": search-dev does not look like the test split, so search scores may rank configurations "
        "differently from test scores; where you can, give the task a dev file drawn like the test data, "
        "as large as search-dev (task: {train: ..., dev: ..., test: ...} scores the search on it)"
    )


__all__ = ["input_shift", "shift_line", "words_per_row", "SHIFT_D", "SHIFT_P"]
