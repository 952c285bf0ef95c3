"""The task registry: the `Task` and `Split` types, task names, and the loader of each data source.

A `Task` says what to read and how to score it; its ``source`` names the loader that reads its
rows. A task family registers its tasks with `register_task` and its loader with
`register_source`; `load_source` reads a task's rows through that loader, so nothing here (nor in
`petl_nas.tasks.splits`) knows the families. Loaders build their splits with `make_split`, which
checks every label against the task.

Example:
    >>> get_task("STS-B").kind
    'regression'
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, suggest
from .metrics import LM_METRICS, LOWER_IS_BETTER, METRICS, TEXT_METRICS, compute_metrics, text_metrics
from .seq2seq import Seq2SeqSettings

__all__ = [
    "KINDS",
    "Task",
    "Split",
    "Loader",
    "task_names",
    "register_task",
    "get_task",
    "make_split",
    "label_text",
    "checked_texts",
    "register_source",
    "source_names",
    "load_source",
]

KINDS = ("classification", "regression", "seq2seq", "causal_lm")
_KIND_METRICS = {"classification": METRICS, "regression": METRICS, "seq2seq": TEXT_METRICS, "causal_lm": LM_METRICS}
_TEXT_COLUMNS = {"seq2seq": (1,), "causal_lm": (0, 1)}  # source / prompt (none: plain text rows)


@dataclass(frozen=True)
class Task:
    """What a task reads and how it is scored.

    Attributes:
        name: registry name (``sst2``, ``demo_sentiment``, ...).
        text_columns: one or two text columns (a single sentence or a sentence pair); for
            ``seq2seq`` the source column; for ``causal_lm`` the prompt column, or none.
        label_column: the column holding the label (the target / response text of a generation task).
        kind: ``classification``, ``regression``, ``seq2seq`` (encoder-decoder generation) or
            ``causal_lm`` (decoder-only fine-tuning, loss on the response).
        labels: the label values as they appear in the data, in class-id order; empty for regression.
        main_metric: the figure the search ranks trials by (maximises): one of ``metrics``.
        metrics: every metric computed and recorded (names from `petl_nas.tasks.metrics.METRICS`).
        source: where the data comes from, the name of a registered loader: ``glue``, ``files``,
            ``demo`` or ``generation`` (see `register_source`).
        data_files: ``(split, path)`` pairs for a ``files`` task (splits ``train``, ``dev``, ``test``).
        seq2seq: training and decoding settings of a ``seq2seq`` task (`Seq2SeqSettings`).
        customary_metric: the figure papers report for the task, reported beside ``main_metric``;
            one of ``metrics``, ``main_metric`` when not given. They differ where the customary
            figure barely separates a learner from a constant predictor (`metrics.ranking_metric`:
            MRPC and QQP rank by accuracy and report F1).

    Example:
        >>> get_task("mrpc").compute_metrics([[0.1, 0.9], [2.0, 0.0]], [1, 1])["f1"]
        0.6666666666666666
    """

    name: str
    text_columns: tuple[str, ...]
    label_column: str
    kind: str = "classification"
    labels: tuple[str, ...] = ()
    main_metric: str = "accuracy"
    metrics: tuple[str, ...] = ("accuracy",)
    source: str = "glue"
    data_files: tuple[tuple[str, str], ...] = ()
    seq2seq: Seq2SeqSettings | None = None
    customary_metric: str | None = None

    def __post_init__(self):
        where = f"task {self.name!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}: kind: unknown value {self.kind!r}{suggest(str(self.kind), KINDS)}")
        counts = _TEXT_COLUMNS.get(self.kind, (1, 2))
        if len(self.text_columns) not in counts:
            raise ConfigError(
                f"{where}: text_columns must name {' or '.join(map(str, counts))} "
                f"column{'s' if counts != (1,) else ''} for a {self.kind} task, "
                f"got {list(self.text_columns)}"
            )
        if self.kind == "seq2seq" and self.seq2seq is None:
            object.__setattr__(self, "seq2seq", Seq2SeqSettings())
        if (self.kind == "classification") != bool(self.labels):
            raise ConfigError(f"{where}: a classification task needs labels and a regression task has none")
        accepted = _KIND_METRICS[self.kind]
        bad = [m for m in self.metrics if m not in accepted]
        if bad:
            raise ConfigError(
                f"{where}: unknown metric {bad[0]!r} for a {self.kind} task; accepted: {', '.join(accepted)}"
            )
        if self.main_metric not in self.metrics:
            raise ConfigError(f"{where}: main_metric {self.main_metric!r} is not among metrics {list(self.metrics)}")
        if self.main_metric in LOWER_IS_BETTER:
            higher = [m for m in accepted if m not in LOWER_IS_BETTER]
            raise ConfigError(
                f"{where}: main_metric {self.main_metric!r} is lower-is-better and the search "
                f"maximises its main metric; use {' or '.join(higher)} "
                f"({self.main_metric} is still reported when it is in metrics)"
            )
        if self.customary_metric is None:
            object.__setattr__(self, "customary_metric", self.main_metric)
        elif self.customary_metric not in self.metrics:
            raise ConfigError(
                f"{where}: customary_metric {self.customary_metric!r} is not among metrics {list(self.metrics)}"
            )

    def ranked_by(self, metric: str | None) -> Task:
        """This task ranking its trials by ``metric`` (one of its metrics; None: as it is), its
        customary metric unchanged. A study keeps ranking by the metric it recorded (its ``metric``
        attribute) when the task's own has changed since: earlier MRPC and QQP studies ranked by F1.

        Example:
            >>> get_task("mrpc").ranked_by("f1").main_metric, get_task("mrpc").main_metric
            ('f1', 'accuracy')
        """
        if metric is None or metric == self.main_metric:
            return self
        if metric not in self.metrics:
            raise ConfigError(
                f"task {self.name!r}: cannot rank by {metric!r}, which it does not compute; "
                f"its metrics: {', '.join(self.metrics)}"
            )
        return dataclasses.replace(self, main_metric=metric)

    def check_max_length(self, max_length: int, where: str = "max_length") -> None:
        """Refuse a length that leaves a generation task nothing to learn: a causal LM needs a start,
        one response token and the end; a seq2seq source one token and its end."""
        shortest = {"causal_lm": 3, "seq2seq": 2}.get(self.kind)
        if shortest is not None and max_length < shortest:
            raise ConfigError(
                f"{where} {max_length} leaves no room for a {self.kind} task's "
                f"{'response' if self.kind == 'causal_lm' else 'source'}: give at least {shortest}"
            )

    @property
    def num_labels(self) -> int:
        """Width of the model's head: the number of classes, or 1 for regression."""
        return len(self.labels) or 1

    @property
    def generative(self) -> bool:
        """Whether the model produces text (``seq2seq``, ``causal_lm``) rather than a label or score."""
        return self.kind in ("seq2seq", "causal_lm")

    def compute_metrics(self, predictions, references) -> dict[str, float]:
        """Every metric of this task, from logits ``[N, C]`` (or class ids ``[N]``) or scores ``[N]``;
        from decoded strings for a ``seq2seq`` task."""
        if self.kind == "seq2seq":
            return text_metrics(self.metrics, predictions, references)
        p, r = _numpy(predictions), _numpy(references).ravel()
        if self.kind == "classification":
            p = p.argmax(-1) if p.ndim == 2 else p
        return compute_metrics(self.metrics, p.ravel(), r)


def _numpy(x) -> np.ndarray:
    torch = sys.modules.get("torch")  # a tensor means torch is loaded; a study read loads none
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().float() if x.is_floating_point() else x.detach().cpu()
    return np.asarray(x)


# ---- task names -------------------------------------------------------------------------------
_TASKS: dict[str, Task] = {}


def task_names() -> list[str]:
    """Every registered task name, sorted."""
    return sorted(_TASKS)


def register_task(task: Task, overwrite: bool = False) -> Task:
    """Add a task to the registry so `get_task` (and the CLI) can find it by name."""
    if task.name in _TASKS and not overwrite:
        raise ConfigError(f"task {task.name!r} is already registered (pass overwrite=True to replace it)")
    _TASKS[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """A registered task by name (case and hyphens ignored: ``SST-2`` is ``sst2``).

    Example:
        >>> get_task("STS-B").kind
        'regression'
    """
    if isinstance(name, Task):
        return name
    key = str(name).strip().lower().replace("-", "")
    if key in _TASKS:
        return _TASKS[key]
    close = difflib.get_close_matches(key, list(_TASKS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if not close and str(name).strip().lower().endswith((".csv", ".tsv", ".json", ".jsonl")):
        hint = (
            " (a task over your own files is a mapping in the experiment file: task: {train: ..., dev: ..., "
            "text_columns: [...]})"
        )
    raise ConfigError(f"unknown task {name!r}{hint}; available: {', '.join(task_names())}")


# ---- rows -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Split:
    """Rows of one split: ``texts`` holds one tuple per text column; ``labels`` class ids or scores."""

    texts: tuple[tuple[str, ...], ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, indices) -> Split:
        idx = np.asarray(indices, dtype=np.int64)
        return Split(tuple(tuple(col[i] for i in idx) for col in self.texts), self.labels[idx])


def make_split(task: Task, texts: Sequence[Sequence[str]], raw_labels: Sequence, where) -> Split:
    """A `Split` with its labels checked against the task: class ids (classification), floats
    (regression) or strings (generation). ``where(i)`` names row i of the source in an error.

    Example:
        >>> make_split(get_task("sst2"), [["a fine film"]], ["1"], lambda i: f"row {i + 1}").labels
        array([1])
    """
    names = [*task.text_columns, *(f"text {j + 1}" for j in range(len(task.text_columns), len(texts)))]
    texts = [checked_texts(name, column, where) for name, column in zip(names, texts)]
    if task.generative:
        labels = np.empty(len(raw_labels), dtype=object)
        for i, value in enumerate(raw_labels):
            if value is None or not str(value).strip():  # nothing to learn to generate
                raise ConfigError(f"{where(i)}: {task.label_column!r} is empty")
            labels[i] = str(value)
    elif task.kind == "regression":
        labels = np.empty(len(raw_labels), dtype=np.float32)
        for i, value in enumerate(raw_labels):
            try:
                labels[i] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{where(i)}: label {value!r} is not a number ({task.name} is a regression task)"
                ) from None
            if not np.isfinite(labels[i]):  # a NaN or inf target makes every loss NaN
                raise ConfigError(
                    f"{where(i)}: label {value!r} is not a finite number ({task.name} is a regression task)"
                )
    else:
        ids = {v: i for i, v in enumerate(task.labels)}
        labels = np.empty(len(raw_labels), dtype=np.int64)
        for i, value in enumerate(raw_labels):
            if value is None:
                raise ConfigError(f"{where(i)}: {task.label_column!r} is empty")
            text = label_text(value)
            if text not in ids:
                shown = repr(text) if isinstance(value, str) else text
                listed = ", ".join(task.labels[:10]) + (
                    f", ... ({len(task.labels)} in all)" if len(task.labels) > 10 else ""
                )
                raise ConfigError(f"{where(i)}: label {shown} is not one of {task.name}'s labels ({listed})")
            labels[i] = ids[text]
    labels.flags.writeable = False  # splits are cached and shared between trials
    return Split(tuple(tuple(col) for col in texts), labels)


def label_text(value) -> str:
    """A class label as text: 1.0 as "1" (a file reader turns a column of whole numbers into floats
    when one cell is empty, or when it is written 0.0/1.0), anything else as written."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def checked_texts(name: str, column: Sequence, where) -> Sequence[str]:
    """A text column with every row a string (numbers as written); an empty cell or a missing key
    is one error naming its row."""
    if all(isinstance(v, str) for v in column):
        return column
    out = []
    for i, value in enumerate(column):
        if value is None:
            raise ConfigError(f"{where(i)}: text column {name!r} is empty")
        out.append(value if isinstance(value, str) else label_text(value))
    return out


# ---- data sources -----------------------------------------------------------------------------
Loader = Callable[[Task, str | None], dict[str, Split]]
"""``loader(task, data_dir)`` -> ``{"train": Split, "dev": Split}``, plus ``"test"`` when the
source has its own test set (then ``dev`` is the search dev and nothing is carved out of train).
``data_dir`` is an absolute path or None; sources that never read a directory ignore it."""

_SOURCES: dict[str, Loader] = {}


def register_source(name: str, loader: Loader, overwrite: bool = False) -> Loader:
    """Name the loader that reads the rows of every task whose ``source`` is ``name``."""
    if name in _SOURCES and not overwrite:
        raise ConfigError(f"task source {name!r} is already registered (pass overwrite=True to replace it)")
    _SOURCES[name] = loader
    return loader


def source_names() -> list[str]:
    """Every registered data source, sorted."""
    return sorted(_SOURCES)


def load_source(task: Task, data_dir: str | None = None) -> dict[str, Split]:
    """A task's rows, read by the loader registered for its ``source`` (uncached: see `load_splits`)."""
    loader = _SOURCES.get(task.source)
    if loader is None:
        raise ConfigError(
            f"task {task.name!r}: unknown source {task.source!r}; registered: {', '.join(source_names())}"
        )
    return loader(task, data_dir)
