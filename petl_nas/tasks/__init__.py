"""Tasks: the registry, the task families that fill it, and the honest splits.

A `Task` says what to read and how to score it; `load_splits` reads its rows into the three
splits of the honest protocol (search trains on ``train`` and scores on ``search_dev``, carved out
of the training data; the task's own dev set is ``test``, touched only by final re-evaluation);
`petl_nas.tasks.encoding.encode` tokenises them once per worker. What lives where:

==============  ===========================================================================
registry.py     `Task`, `Split`, `make_split`; task names (`register_task`, `get_task`); the
                loader of each data source (`register_source`, `load_source`)
splits.py       the honest splits (`split_indices`, `load_splits`) and their in-process cache
                (`cached`, `clear_cache`)
overview.py     `data_lines`: the rows and classes a search trains and scores on, and warnings
glue.py         GLUE: labels, metrics, the glue_data layout and the hub (source ``glue``)
files.py        local CSV/TSV/JSON/JSONL tasks: `file_task`, `resolve_task`, `recorded_task`, `read_table`
                (source ``files``)
demo.py         demo_sentiment and demo_keyword, generated rows (source ``demo``)
generation.py   XSum, WMT16 en-ro, demo_copy and demo_reverse (source ``generation``)
==============  ===========================================================================

Adding a task family is one file in this package that imports only public names of
`registry` (and, to read tables, `files`): define its `Task` objects with ``source="<family>"``,
call `register_task` for each, write ``load_<family>(task, data_dir) -> {"train": Split,
"dev": Split}`` (add ``"test"`` when the data has its own test set) building each split with
`make_split`, and call ``register_source("<family>", load_<family>)``; then add the module to the
imports below. `load_splits` needs nothing new: it reads any source through its loader, splits
it and caches it.

Example:
    >>> task = get_task("demo_sentiment")
    >>> splits = load_splits(task, k=64)
    >>> len(splits.train), len(splits.search_dev), len(splits.test)
    (64, 13, 500)
"""

from __future__ import annotations

# The families register their tasks and sources on import; this order is the registry's order.
from . import demo, files, generation, glue  # noqa: F401
from .files import file_task, recorded_task, resolve_task
from .overview import data_lines
from .registry import (
    KINDS,
    Split,
    Task,
    get_task,
    load_source,
    make_split,
    register_source,
    register_task,
    source_names,
    task_names,
)
from .splits import TaskSplits, cached, clear_cache, load_splits, split_indices

__all__ = [
    "resolve_task",
    "recorded_task",
    "Task",
    "Split",
    "TaskSplits",
    "get_task",
    "task_names",
    "register_task",
    "file_task",
    "load_splits",
    "split_indices",
    "clear_cache",
    "KINDS",
    "make_split",
    "register_source",
    "source_names",
    "load_source",
    "cached",
    "data_lines",
]
