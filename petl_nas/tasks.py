"""Tasks: the registry (GLUE, demo tasks, generation tasks, local files), loading, and the honest splits.

A `Task` says what to read and how to score it; `load_splits` reads its data into the three
splits of the honest protocol (search trains on ``train`` and scores on ``search_dev``, carved out
of the training data; the task's own dev set is ``test``, touched only by final re-evaluation);
`data.encode` tokenises them once per worker; `data.EncodedSplit.batches` pads batch by batch.

Example:
    >>> task = get_task("demo_sentiment")
    >>> splits = load_splits(task, k=64)
    >>> len(splits.train), len(splits.search_dev), len(splits.test)
    (64, 13, 500)
"""

from __future__ import annotations

import csv
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .config import ConfigError
from .metrics import LM_METRICS, METRICS, TEXT_METRICS, compute_metrics, text_metrics
from .seq2seq import Seq2SeqSettings

__all__ = ["resolve_task", "Task", "Split", "TaskSplits", "get_task", "task_names",
           "register_task", "file_task", "load_splits", "split_indices", "clear_cache"]

KINDS = ("classification", "regression", "seq2seq", "causal_lm")
_KIND_METRICS = {"classification": METRICS, "regression": METRICS, "seq2seq": TEXT_METRICS, "causal_lm": LM_METRICS}
_TEXT_COLUMNS = {"seq2seq": (1,), "causal_lm": (0, 1)}    # source / prompt (none: plain text rows)


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
        main_metric: the one figure the search maximises; one of ``metrics``.
        metrics: every metric reported (names from `petl_nas.metrics.METRICS`).
        source: where the data comes from: ``glue``, ``files`` or ``demo``.
        data_files: ``(split, path)`` pairs for a ``files`` task (splits ``train``, ``dev``, ``test``).
        seq2seq: training and decoding settings of a ``seq2seq`` task (`Seq2SeqSettings`).

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

    def __post_init__(self):
        where = f"task {self.name!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        counts = _TEXT_COLUMNS.get(self.kind, (1, 2))
        if len(self.text_columns) not in counts:
            raise ConfigError(f"{where}: text_columns must name {' or '.join(map(str, counts))} "
                              f"column{'s' if counts != (1,) else ''} for a {self.kind} task, "
                              f"got {list(self.text_columns)}")
        if self.kind == "seq2seq" and self.seq2seq is None:
            object.__setattr__(self, "seq2seq", Seq2SeqSettings())
        if (self.kind == "classification") != bool(self.labels):
            raise ConfigError(f"{where}: a classification task needs labels and a regression task has none")
        accepted = _KIND_METRICS[self.kind]
        bad = [m for m in self.metrics if m not in accepted]
        if bad:
            raise ConfigError(f"{where}: unknown metric {bad[0]!r} for a {self.kind} task; "
                              f"accepted: {', '.join(accepted)}")
        if self.main_metric not in self.metrics:
            raise ConfigError(f"{where}: main_metric {self.main_metric!r} is not among "
                              f"metrics {list(self.metrics)}")

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
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().float() if x.is_floating_point() else x.detach().cpu()
    return np.asarray(x)


@dataclass(frozen=True)
class _GlueFormat:
    folder: str                       # glue_data/<folder>/
    columns: tuple                    # text column(s) then label column: header names, or indices
    hub_config: str
    hub_dev: str = "validation"
    dev_file: str = "dev.tsv"
    header: bool = True


_BINARY, _NLI2 = ("0", "1"), ("entailment", "not_entailment")
_ACC, _PAIR, _STS = ("accuracy",), ("f1", "accuracy", "f1_accuracy"), ("pearson", "spearman", "pearson_spearman")
_GLUE = {  # name: (Task fields..., how its glue_data files are laid out)
    "cola": (("sentence",), _BINARY, "mcc", ("mcc",), _GlueFormat("CoLA", (3, 1), "cola", header=False)),
    "sst2": (("sentence",), _BINARY, "accuracy", _ACC, _GlueFormat("SST-2", ("sentence", "label"), "sst2")),
    "mrpc": (("sentence1", "sentence2"), _BINARY, "f1", _PAIR,
             _GlueFormat("MRPC", ("#1 String", "#2 String", "Quality"), "mrpc")),
    "qqp": (("question1", "question2"), _BINARY, "f1", _PAIR,
            _GlueFormat("QQP", ("question1", "question2", "is_duplicate"), "qqp")),
    "stsb": (("sentence1", "sentence2"), (), "pearson_spearman", _STS,
             _GlueFormat("STS-B", ("sentence1", "sentence2", "score"), "stsb")),
    "mnli": (("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), "accuracy", _ACC,
             _GlueFormat("MNLI", ("sentence1", "sentence2", "gold_label"), "mnli",
                         hub_dev="validation_matched", dev_file="dev_matched.tsv")),
    "qnli": (("question", "sentence"), _NLI2, "accuracy", _ACC,
             _GlueFormat("QNLI", ("question", "sentence", "label"), "qnli")),
    "rte": (("sentence1", "sentence2"), _NLI2, "accuracy", _ACC,
            _GlueFormat("RTE", ("sentence1", "sentence2", "label"), "rte")),
}
_TASKS: dict[str, Task] = {
    name: Task(name, cols, "label", "classification" if labels else "regression", labels, main, metrics)
    for name, (cols, labels, main, metrics, _) in _GLUE.items()
}
_TASKS["demo_sentiment"] = Task("demo_sentiment", ("sentence",), "label", labels=("negative", "positive"),
                                main_metric="accuracy", metrics=("accuracy", "f1"), source="demo")
_TASKS["demo_keyword"] = Task("demo_keyword", ("sentence",), "label", labels=("negative", "positive"),
                              main_metric="accuracy", metrics=("accuracy", "f1"), source="demo")


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
    raise ConfigError(f"unknown task {name!r}{hint}; available: {', '.join(task_names())}")


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


def _make_split(task: Task, texts: Sequence[Sequence[str]], raw_labels: Sequence, where) -> Split:
    """Labels checked against the task; ``where(i)`` names row i of the source in an error."""
    if task.generative:
        labels = np.empty(len(raw_labels), dtype=object)
        for i, value in enumerate(raw_labels):
            if value is None:
                raise ConfigError(f"{where(i)}: {task.label_column!r} is empty")
            labels[i] = str(value)
    elif task.kind == "regression":
        labels = np.empty(len(raw_labels), dtype=np.float32)
        for i, value in enumerate(raw_labels):
            try:
                labels[i] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where(i)}: label {value!r} is not a number "
                                  f"({task.name} is a regression task)") from None
    else:
        ids = {v: i for i, v in enumerate(task.labels)}
        labels = np.empty(len(raw_labels), dtype=np.int64)
        for i, value in enumerate(raw_labels):
            text = str(value).strip()
            if text not in ids:
                raise ConfigError(f"{where(i)}: label {value!r} is not one of {task.name}'s labels "
                                  f"({', '.join(task.labels)})")
            labels[i] = ids[text]
    labels.flags.writeable = False  # splits are cached and shared between trials
    return Split(tuple(tuple(col) for col in texts), labels)


def _read_glue_tsv(task: Task, path: Path, fmt: _GlueFormat) -> Split:
    if not path.is_file():
        raise ConfigError(f"task {task.name!r}: expected file {path} does not exist "
                          f"(GLUE layout: <data-dir>/{fmt.folder}/train.tsv and {fmt.dev_file})")
    # utf-8-sig: GLUE's download script writes MRPC's files with a byte-order mark before the header.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)  # GLUE text contains bare quotes
        cols = list(fmt.columns)
        if fmt.header:
            header = next(reader, [])
            missing = [c for c in cols if c not in header]
            if missing:
                raise ConfigError(f"{path}: not a {fmt.folder} file: expected columns {', '.join(map(repr, cols))}, "
                                  f"found {', '.join(map(repr, header))} (missing {', '.join(map(repr, missing))})")
            cols = [header.index(c) for c in cols]
        rows, lines = [], []
        for row in reader:
            if not row:
                continue
            if len(row) <= max(cols):
                raise ConfigError(f"{path}, line {reader.line_num}: expected at least {max(cols) + 1} "
                                  f"tab-separated fields, found {len(row)}")
            rows.append(row)
            lines.append(reader.line_num)
    texts = [[row[c] for row in rows] for c in cols[:-1]]
    return _make_split(task, texts, [row[cols[-1]] for row in rows], lambda i: f"{path}, line {lines[i]}")


def _load_glue(task: Task, data_dir) -> dict[str, Split]:
    fmt = _GLUE[task.name][-1]
    if data_dir is not None:
        folder = Path(data_dir) / fmt.folder
        return {"train": _read_glue_tsv(task, folder / "train.tsv", fmt),
                "dev": _read_glue_tsv(task, folder / fmt.dev_file, fmt)}
    try:
        import datasets

        hub = datasets.load_dataset("nyu-mll/glue", fmt.hub_config)
    except Exception as e:  # offline, no such repo, network: one message that says what to do
        raise ConfigError(f"task {task.name!r}: no data directory given and GLUE could not be loaded from "
                          f"the Hugging Face hub ({type(e).__name__}); pass --data-dir DIR with "
                          f"DIR/{fmt.folder}/train.tsv") from None
    out = {}
    for split, hub_split in (("train", "train"), ("dev", fmt.hub_dev)):
        data = hub[hub_split]
        raw = data["label"] if task.kind == "regression" else [task.labels[i] for i in data["label"]]
        out[split] = _make_split(task, [data[c] for c in task.text_columns], raw,
                                 lambda i, s=hub_split: f"glue/{fmt.hub_config} {s}, row {i + 1}")
    return out


# utf-8-sig reads a file with or without a byte-order mark (spreadsheets and GLUE's MRPC write one).
_FORMATS = {".csv": ("csv", {"encoding": "utf-8-sig"}), ".tsv": ("csv", {"delimiter": "\t", "encoding": "utf-8-sig"}),
            ".json": ("json", {}), ".jsonl": ("json", {})}


def _read_table(path: str, needed: Sequence[str]):
    import datasets

    builder, kwargs = _FORMATS[Path(path).suffix.lower()]
    table = datasets.load_dataset(builder, data_files={"rows": path}, split="rows", **kwargs)
    for c in needed:
        if c not in table.column_names:
            raise ConfigError(f"{path}: missing column {c!r} (columns: {', '.join(table.column_names)})")
    return table


def file_task(train, dev, test=None, *, text_columns: Sequence[str] | None = None, label_column: str | None = None,
              kind: str = "classification", labels: Sequence[str] | None = None, name: str | None = None,
              metrics: Sequence[str] | None = None, main_metric: str | None = None,
              generation: dict | Seq2SeqSettings | None = None) -> Task:
    """A task over local CSV/TSV/JSON/JSONL files (read with `datasets.load_dataset`).

    Without ``test``, ``dev`` is the test set and the search dev is carved out of ``train``, as for
    GLUE; with ``test``, ``dev`` is the search dev and ``test`` the test set. Classification labels
    default to the sorted distinct values of the train file's label column (``label``).
    A ``seq2seq`` task reads ``source`` -> ``target`` columns unless told otherwise, with
    ``generation`` settings (`Seq2SeqSettings` fields); a ``causal_lm`` task reads
    ``prompt``/``response`` columns, or a ``text`` column alone, whichever the train file has.

    Example:
        >>> task = file_task("train.csv", "dev.csv", text_columns=["text"])  # doctest: +SKIP
    """
    files = {"train": train, "dev": dev, **({"test": test} if test is not None else {})}
    for split, path in files.items():
        if Path(path).suffix.lower() not in _FORMATS:
            raise ConfigError(f"{split} file {path}: unsupported format; accepted: {', '.join(_FORMATS)}")
        if not Path(path).is_file():
            raise ConfigError(f"{split} file {path} does not exist")
    if kind in ("seq2seq", "causal_lm"):
        return _generation_file_task(files, kind, text_columns, label_column, name, metrics, main_metric, generation)
    if text_columns is None:
        raise ConfigError(f"task: a {kind} file task needs text_columns")
    label_column = label_column or "label"
    if kind == "classification" and labels is None:
        values = {str(v).strip() for v in _read_table(str(train), [label_column])[label_column]}
        numeric = all(v.lstrip("-").replace(".", "", 1).isdigit() for v in values)
        labels = sorted(values, key=float if numeric else str)
    labels = tuple(str(v) for v in labels or ())
    if metrics is None:
        metrics = (("pearson", "spearman", "pearson_spearman") if kind == "regression"
                   else ("accuracy", "f1", "mcc") if len(labels) == 2 else ("accuracy",))
    main_metric = main_metric or ("pearson_spearman" if kind == "regression" else "accuracy")
    return Task(name or f"files:{Path(train).stem}", tuple(text_columns), label_column, kind, labels,
                main_metric, tuple(metrics), "files", tuple((s, str(p)) for s, p in files.items()))


def _generation_file_task(files, kind, text_columns, label_column, name, metrics, main_metric, generation) -> Task:
    if kind == "causal_lm" and text_columns is None and label_column is None:
        columns = _read_table(str(files["train"]), ()).column_names
        if {"prompt", "response"} <= set(columns):
            text_columns, label_column = ["prompt"], "response"
        elif "text" in columns:
            text_columns, label_column = [], "text"
        else:
            raise ConfigError(f"{files['train']}: a causal_lm file needs 'prompt' and 'response' columns or "
                              f"a 'text' column (columns: {', '.join(columns)})")
    if kind == "seq2seq":
        text_columns, label_column = text_columns or ["source"], label_column or "target"
        if isinstance(generation, dict):
            from .config import check_keys

            check_keys("task: generation", generation, list(Seq2SeqSettings.__dataclass_fields__))
            generation = Seq2SeqSettings(**generation)
        metrics = tuple(metrics or ("rouge1", "rouge2", "rougeL", "bleu"))
        main_metric = main_metric or ("rougeL" if "rougeL" in metrics else metrics[0])
    else:
        if generation is not None:
            raise ConfigError("task: generation settings apply to seq2seq tasks only")
        text_columns, label_column = text_columns or [], label_column or "response"
        metrics = tuple(metrics or ("token_accuracy", "perplexity"))
        main_metric = main_metric or "token_accuracy"
    return Task(name or f"files:{Path(files['train']).stem}", tuple(text_columns), label_column, kind, (),
                main_metric, metrics, "files", tuple((s, str(p)) for s, p in files.items()), seq2seq=generation)


def resolve_task(task) -> Task:
    """A task from a name (``sst2``), a `Task`, or a file-task mapping as in experiment files::

        task: {train: data/train.csv, dev: data/dev.csv, text_columns: [text], label_column: label}
        task: {train: data/train.jsonl, dev: data/dev.jsonl, kind: seq2seq, generation: {num_beams: 4}}
    """
    if isinstance(task, dict):
        unknown = set(task) - {"train", "dev", "test", "text_columns", "label_column", "kind", "labels",
                               "name", "metrics", "main_metric", "generation"}
        generative = task.get("kind") in ("seq2seq", "causal_lm")
        if unknown or not {"train", "dev", *(() if generative else ("text_columns",))} <= set(task):
            raise ConfigError("task: a file task needs train, dev and text_columns"
                              + (f"; unknown key {sorted(unknown)[0]!r}" if unknown else ""))
        return file_task(task["train"], task["dev"], task.get("test"),
                         **{k: v for k, v in task.items() if k not in ("train", "dev", "test")})
    return get_task(task)


def _load_files(task: Task) -> dict[str, Split]:
    out = {}
    for split, path in task.data_files:
        table = _read_table(path, (*task.text_columns, task.label_column))
        out[split] = _make_split(task, [table[c] for c in task.text_columns], table[task.label_column],
                                 lambda i, p=path: f"{p}, row {i + 1}")
    return out


# The demo task: which sentiment dominates a sentence; "not" flips the word after it, and 5% of
# labels are flipped, so no single token decides the label and accuracy tops out near 95%.
_POSITIVE = ("good", "great", "excellent", "wonderful", "delightful", "superb", "charming", "moving")
_NEGATIVE = ("bad", "awful", "boring", "dull", "terrible", "clumsy", "tedious", "bland")
_FILLER = ("the", "film", "movie", "plot", "actors", "story", "a", "was", "with", "and", "its", "scenes",
           "director", "this", "music", "ending", "script", "quite", "cast", "of", "it", "is")


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


def _load_demo(task: Task) -> dict[str, Split]:
    rng = np.random.default_rng(20220)  # fixed: the data never changes; data_seed only re-splits it
    rows = _keyword_rows if task.name == "demo_keyword" else _demo_rows
    out = {}
    for split, n in (("train", 2000), ("dev", 500)):
        sentences, labels = rows(n, rng)
        out[split] = _make_split(task, [sentences], labels, lambda i, s=split: f"demo {s}, row {i + 1}")
    return out


def _check_k(k, n_rows: int) -> None:
    if k is not None and (isinstance(k, bool) or int(k) != k or not 1 <= k <= n_rows):
        raise ConfigError(f"k must be a whole number from 1 to the {n_rows:,} training rows, got {k!r}")


def split_indices(n_rows: int, k: int | None = None, data_seed: int = 111, search_dev_fraction: float = 0.2,
                  search_dev_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        raise ConfigError(f"search_dev_size must be from 1 to {room} (leaving training rows), got {n_dev}")
    perm = np.random.default_rng(data_seed).permutation(n_rows)
    if k is None:
        train, dev = perm[:n_rows - n_dev], perm[n_rows - n_dev:]
    elif k + n_dev <= n_rows:
        train, dev = perm[:k], perm[n_rows - n_dev:]
    else:
        train, dev = perm[:k - n_dev], perm[k - n_dev:k]
    return np.sort(train), np.sort(dev)


@dataclass(frozen=True, eq=False)
class TaskSplits:
    """The honest protocol's splits: search trains on ``train``, scores on ``search_dev``;
    ``test`` (the task's own dev set) is for final re-evaluation only. ``key`` identifies the data."""

    task: Task
    train: Split
    search_dev: Split
    test: Split
    key: tuple = field(repr=False)


_CACHE: dict[tuple, object] = {}


def clear_cache() -> None:
    """Forget every cached split and encoding (tests; a worker switching tasks to free memory)."""
    _CACHE.clear()


def load_splits(task: str | Task, data_dir=None, k: int | None = None, data_seed: int = 111,
                search_dev_fraction: float = 0.2, search_dev_size: int | None = None) -> TaskSplits:
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
    if key in _CACHE:
        return _CACHE[key]
    loaded = (_load_demo(task) if task.source == "demo" else _load_files(task) if task.source == "files"
              else _load_generation(task, data_dir) if task.source == "generation"
              else _load_glue(task, data_dir))
    train = loaded["train"]
    if "test" in loaded:  # same first-K-of-the-permutation rule as split_indices, no carving
        _check_k(k, len(train))
        perm = np.random.default_rng(data_seed).permutation(len(train))
        train_idx = np.sort(perm[:k]) if k else np.arange(len(train))
        splits = TaskSplits(task, train.select(train_idx), loaded["dev"], loaded["test"], key)
    else:
        train_idx, dev_idx = split_indices(len(train), k, data_seed, search_dev_fraction, search_dev_size)
        splits = TaskSplits(task, train.select(train_idx), train.select(dev_idx), loaded["dev"], key)
    _CACHE[key] = splits
    return splits


def _load_generation(task: Task, data_dir) -> dict[str, Split]:
    from .generation import load_generation

    return load_generation(task, data_dir)


from . import generation as _registered  # noqa: E402,F401  (xsum, wmt16_en_ro, demo_copy, demo_reverse)
