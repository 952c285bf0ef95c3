"""The honest splits and the in-process cache they (and their encodings) live in.

`load_splits` reads a task's rows through its registered source and splits them by the honest
protocol: search trains on ``train`` and scores on ``search_dev``, carved out of the training
data; the task's own dev set is ``test``, touched only by final re-evaluation. `split_indices` is
the rule. Splits are cached by `cached` (as are `petl_nas.tasks.encoding.encode`'s encodings); `clear_cache`
forgets both.

Example:
    >>> splits = load_splits("demo_sentiment", k=64)
    >>> len(splits.train), len(splits.search_dev), len(splits.test)
    (64, 13, 500)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ..errors import ConfigError
from .registry import Split, Task, get_task, load_source

__all__ = ["TaskSplits", "split_indices", "load_splits", "cached", "clear_cache"]

T = TypeVar("T")


def _check_k(k, n_rows: int) -> None:
    """Raise unless K is a whole number of training rows from 1 to ``n_rows`` (None: all rows)."""
    if k is not None and (isinstance(k, bool) or int(k) != k or not 1 <= k <= n_rows):
        raise ConfigError(f"k (fidelity.k) must be a whole number from 1 to the {n_rows:,} training rows, got {k!r}")


def split_indices(
    n_rows: int,
    k: int | None = None,
    data_seed: int = 111,
    search_dev_fraction: float = 0.2,
    search_dev_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint ``(train, search_dev)`` row indices of a training set of ``n_rows``.

    The rule: shuffle the rows with ``data_seed`` into ``perm``; the search dev has
    ``search_dev_size`` rows, or ``round(search_dev_fraction * pool)`` (at least 1) where the pool
    is K or, without K, all rows. Full data: search_dev = the last n_dev of ``perm``, train = the
    rest. K-shot: train = the first K of ``perm`` (so smaller K are subsets of larger K) and
    search_dev = the last n_dev, if K + n_dev rows exist; otherwise both come out of the first K
    (train = its first K - n_dev, search_dev = the rest), and training sees fewer than K rows.

    Example:
        >>> train, dev = split_indices(10, k=4, search_dev_size=2)
        >>> len(train), len(dev), set(train) & set(dev)
        (4, 2, set())
    """
    _check_k(k, n_rows)
    if search_dev_size is None and not 0 < search_dev_fraction < 1:
        raise ConfigError(f"search_dev_fraction must be between 0 and 1, got {search_dev_fraction!r}")
    pool = n_rows if k is None else int(k)
    n_dev = search_dev_size if search_dev_size is not None else max(1, round(search_dev_fraction * pool))
    # The search dev fits if it leaves training rows: beside the K when K + n_dev rows exist, else inside the pool.
    room = n_rows - k if k is not None and k + n_dev <= n_rows else pool - 1
    if not 1 <= n_dev <= room:
        raise ConfigError(
            f"search_dev_size (fidelity.search_dev) must be from 1 to {room} (leaving training rows), got {n_dev}"
        )
    perm = np.random.default_rng(data_seed).permutation(n_rows)
    if k is None:
        train, dev = perm[: n_rows - n_dev], perm[n_rows - n_dev :]
    elif k + n_dev <= n_rows:
        train, dev = perm[:k], perm[n_rows - n_dev :]
    else:
        train, dev = perm[: k - n_dev], perm[k - n_dev : k]
    return np.sort(train), np.sort(dev)


@dataclass(frozen=True, eq=False)
class TaskSplits:
    """The honest protocol's splits: search trains on ``train``, scores on ``search_dev``;
    ``test`` (the task's own dev set) is for final re-evaluation only. ``key`` identifies the data;
    ``carved`` says the search dev was cut out of the training data (not a dev file of its own);
    ``train_rows`` counts the training data's rows before K drew from them."""

    task: Task
    train: Split
    search_dev: Split
    test: Split
    key: tuple = field(repr=False)
    carved: bool = True
    train_rows: int = 0

    def for_final_training(self) -> TaskSplits:
        """These splits with a carved search dev handed back to training (a final run trains on all
        the training data); a search dev read from its own file stays out of training."""
        if not self.carved:
            return self
        texts = tuple(a + b for a, b in zip(self.train.texts, self.search_dev.texts))
        train = Split(texts, np.concatenate([self.train.labels, self.search_dev.labels]))
        return TaskSplits(
            self.task, train, self.search_dev, self.test, self.key + ("all-rows",), train_rows=self.train_rows
        )


_CACHE: dict[tuple, object] = {}


def cached(key: tuple, make: Callable[[], T]) -> T:
    """The object cached under ``key``, made by ``make()`` and kept on first use (in-process).

    Keys are tuples whose first item says what is cached (``"splits"``, ``"encoded"``).

    Example:
        >>> cached(("demo", 1), lambda: [1, 2]) is cached(("demo", 1), lambda: [3])
        True
    """
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def clear_cache() -> None:
    """Forget every cached split and encoding (tests; a worker switching tasks to free memory)."""
    _CACHE.clear()


def load_splits(
    task: str | Task,
    data_dir=None,
    k: int | None = None,
    data_seed: int = 111,
    search_dev_fraction: float = 0.2,
    search_dev_size: int | None = None,
) -> TaskSplits:
    """Read a task and split it by the honest protocol.

    ``test`` is the task's own dev set (GLUE ``dev.tsv``; MNLI ``dev_matched.tsv``). ``train`` and
    ``search_dev`` are disjoint parts of the training data, chosen by `split_indices`: rows shuffled
    with ``data_seed``; K-shot trains on the first K (K counts training rows) and takes the search
    dev (``search_dev_size`` rows, else ``search_dev_fraction`` of K, or of all rows without K)
    from the end of the shuffle, or out of the K when fewer than K + n_dev rows exist. A ``files``
    task given a test file scores the search on its dev file instead (K still samples train).

    GLUE reads ``data_dir/<TASK>/{train,dev}.tsv`` when ``data_dir`` is given, else the hub. Cached
    in-process: the same arguments return the same object.

    Example:
        >>> splits = load_splits("sst2", data_dir="glue_data", k=1000)  # doctest: +SKIP
    """
    task = get_task(task)
    data_dir = str(Path(data_dir).resolve()) if data_dir is not None else None
    key = ("splits", task, data_dir, k, data_seed, search_dev_fraction, search_dev_size)
    return cached(
        key, lambda: _split(task, load_source(task, data_dir), key, k, data_seed, search_dev_fraction, search_dev_size)
    )


def _split(
    task: Task, loaded: dict[str, Split], key: tuple, k, data_seed, search_dev_fraction, search_dev_size
) -> TaskSplits:
    train = loaded["train"]
    if "test" in loaded:  # same first-K-of-the-permutation rule as split_indices, no carving
        _check_k(k, len(train))
        perm = np.random.default_rng(data_seed).permutation(len(train))
        train_idx = np.sort(perm[:k]) if k else np.arange(len(train))
        return TaskSplits(
            task, train.select(train_idx), loaded["dev"], loaded["test"], key, carved=False, train_rows=len(train)
        )
    train_idx, dev_idx = split_indices(len(train), k, data_seed, search_dev_fraction, search_dev_size)
    return TaskSplits(task, train.select(train_idx), train.select(dev_idx), loaded["dev"], key, train_rows=len(train))
