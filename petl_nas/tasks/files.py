"""Tasks over local files: CSV, TSV, JSON or JSONL tables, read with `datasets.load_dataset`.

`file_task` builds a (classification, regression, seq2seq or causal-LM) task from file paths;
`resolve_task` turns what an experiment file or the CLI names (a registered name, a `Task`, or a
file-task mapping) into a task; `read_table` reads one table and checks its columns (also used to
read texts to label, `petl_nas.deploy.runs.read_texts`, and the generation tasks' local files).

Example:
    >>> task = resolve_task({"train": "train.csv", "dev": "dev.csv", "text_columns": ["text"]})  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError
from .metrics import ranking_metric
from .registry import Split, Task, get_task, label_text, make_split, register_source
from .seq2seq import Seq2SeqSettings

__all__ = [
    "FORMATS",
    "FILE_KEYS",
    "read_table",
    "file_task",
    "resolve_task",
    "recorded_task",
    "load_files",
    "file_fingerprints",
]

FILE_KEYS = ("train", "dev", "test")
"""The keys of a file-task mapping that name files."""

# utf-8-sig reads a file with or without a byte-order mark (spreadsheets and GLUE's MRPC write one).
FORMATS = {
    ".csv": ("csv", {"encoding": "utf-8-sig", "keep_default_na": False}),
    ".tsv": ("csv", {"delimiter": "\t", "encoding": "utf-8-sig", "keep_default_na": False, "quoting": 3}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
}
"""File suffix -> (`datasets` builder, its keyword arguments): the tables `read_table` reads. A cell
reading "None", "NA" or "null" is that text, not a missing value; a TSV's quotes are characters of
its cells (csv.QUOTE_NONE, as GLUE's files are written), so a stray quote cannot merge rows."""


def _blank(path: Path, window: int = 1 << 16) -> bool:
    """Nothing but whitespace in the file (datasets would say "StopIteration" or "EmptyDataError")."""
    with open(path, "rb") as f:
        head = f.read(window)
    return not head.strip() and path.stat().st_size <= window


def read_table(path: str, needed: Sequence[str], label: str | None = None):
    """The rows of a CSV/TSV/JSON/JSONL file as a `datasets.Dataset`, with every ``needed`` column.

    Raises `ConfigError` naming the file and its columns when one is missing.
    """
    import datasets

    if Path(path).is_dir():
        raise ConfigError(f"{path}: a folder, not a file")
    if Path(path).suffix.lower() not in FORMATS:
        raise ConfigError(
            f"{path}: unknown file type {Path(path).suffix or '(none)'!r}; accepted: {', '.join(FORMATS)}"
        )
    builder, kwargs = FORMATS[Path(path).suffix.lower()]
    if Path(path).is_file() and _blank(Path(path)):
        raise ConfigError(f"{path}: the file has no rows (it is empty)")
    datasets.disable_progress_bars()  # one line per file read is noise in a search's output
    try:
        table = datasets.load_dataset(builder, data_files={"rows": path}, split="rows", **kwargs)
    except Exception as e:  # a file datasets cannot parse, or one without rows
        if "no data" in str(e).lower():  # datasets: 'Instruction "rows" corresponds to no data!'
            raise ConfigError(f"{path}: the file has no rows") from None
        cause = e.__cause__ or e
        raise ConfigError(
            f"{path}: could not be read as {builder.upper()} ({type(cause).__name__}: "
            f"{(str(cause).splitlines() or [''])[0][:160]})"
        ) from None
    if len(table) == 0:
        raise ConfigError(f"{path}: the file has no rows")
    for c in needed:
        if c not in table.column_names:
            raise ConfigError(
                f"{path}: missing column {c!r} (columns: {', '.join(table.column_names)})"
                + _header_hint(path, table.column_names, needed, c)
            )
    for c in needed:  # an empty cell, or only spaces: nothing to read or learn
        blank = next((i for i, v in enumerate(table[c]) if v is None or isinstance(v, str) and not v.strip()), None)
        if blank is not None:  # None: a JSON row without the key (or null), a CSV row cut short
            raise ConfigError(
                f"{path}, row {blank + 1}: {'' if c == label else 'text column '}{c!r} is "
                f"{'missing' if table[c][blank] is None else 'empty'}"
            )
    return table


def _header_hint(path: str, columns: list[str], needed: Sequence[str], missing: str) -> str:
    """Why a file's columns may not be what the user wrote: a name that differs in case or by a
    typo; for a CSV/TSV file, another separator than its suffix says, or no header row (its first
    row read as one)."""
    close = [c for c in columns if c.lower() == missing.lower()] or difflib.get_close_matches(
        missing, columns, n=1, cutoff=0.75
    )
    if close:
        return f"; did you mean {close[0]!r}? (column names are case-sensitive)"
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".tsv"):
        return ""
    if len(columns) == 1 and any(sep in columns[0] for sep in ",\t;|"):
        return f"; the header is one column: a {suffix} file is read {'tab' if suffix == '.tsv' else 'comma'}-separated"
    if not set(needed) & set(columns):
        return "; the first row is read as the header: does the file have one?"
    return ""


def file_task(
    train,
    dev,
    test=None,
    *,
    text_columns: Sequence[str] | None = None,
    label_column: str | None = None,
    kind: str = "classification",
    labels: Sequence[str] | None = None,
    name: str | None = None,
    metrics: Sequence[str] | None = None,
    main_metric: str | None = None,
    generation: dict | Seq2SeqSettings | None = None,
    check_files: bool = True,
) -> Task:
    """A task over local CSV/TSV/JSON/JSONL files (read with `datasets.load_dataset`).

    Without ``test``, ``dev`` is the test set and the search dev is carved out of ``train``, as for
    GLUE; with ``test``, ``dev`` is the search dev and ``test`` the test set. Classification labels
    default to the sorted distinct values of the train file's label column (``label``).
    A ``seq2seq`` task reads ``source`` -> ``target`` columns unless told otherwise, with
    ``generation`` settings (`Seq2SeqSettings` fields); a ``causal_lm`` task reads
    ``prompt``/``response`` columns, or a ``text`` column alone, whichever the train file has.
    ``main_metric`` is the figure reported (the task's ``customary_metric``); trials rank by it,
    except a classification task's ``f1``, reported beside accuracy, which ranks in its place and
    is added to ``metrics`` if missing (`petl_nas.tasks.metrics.ranking_metric`).

    Example:
        >>> task = file_task("train.csv", "dev.csv", text_columns=["text"])  # doctest: +SKIP
    """
    files = {"train": train, "dev": dev, **({"test": test} if test is not None else {})}
    _check_files(files, check_files)
    if kind in ("seq2seq", "causal_lm"):
        return _generation_file_task(
            files, kind, text_columns, label_column, name, metrics, main_metric, generation, labels
        )
    if text_columns is None:
        raise ConfigError(f"task: a {kind} file task needs text_columns")
    label_column = label_column or "label"
    labels = _class_labels(train, text_columns, label_column, kind, labels)
    if metrics is None:
        metrics = (
            ("pearson", "spearman", "pearson_spearman")
            if kind == "regression"
            else ("accuracy", "f1", "mcc")
            if len(labels) == 2
            else ("accuracy",)
        )
    customary = main_metric or ("pearson_spearman" if kind == "regression" else "accuracy")
    ranks, metrics = customary, tuple(metrics)
    if customary in metrics:  # else the Task's error says what is missing
        ranks = ranking_metric(customary, kind)
        metrics += (ranks,) if ranks not in metrics else ()
    return Task(
        name or f"files:{Path(train).stem}",
        tuple(text_columns),
        label_column,
        kind,
        labels,
        ranks,
        metrics,
        "files",
        tuple((s, str(p)) for s, p in files.items()),
        customary_metric=customary,
    )


def _check_files(files: dict, check_files: bool) -> None:
    """Each split's file has a format read here and (``check_files``) exists; one line naming it if not."""
    for split, path in files.items():
        if Path(path).suffix.lower() not in FORMATS:
            raise ConfigError(f"{split} file {path}: unsupported format; accepted: {', '.join(FORMATS)}")
        if check_files and not Path(path).is_file():
            where = (
                "" if Path(path).is_absolute() else f" (relative paths are read from the current folder, {Path.cwd()})"
            )
            raise ConfigError(f"{split} file {path} does not exist{where}")


def _class_labels(train, text_columns, label_column: str, kind: str, labels) -> tuple[str, ...]:
    """The task's labels: those given, else (classification) the train file's distinct values,
    sorted (numerically where all are numbers); each once, two at least for a classifier."""
    given = labels is not None
    if kind == "classification" and not given:
        values = {
            label_text(v)
            for v in read_table(str(train), [*text_columns, label_column], label_column)[label_column]
            if v is not None
        }
        numeric = all(v.lstrip("-").replace(".", "", 1).isdigit() for v in values)
        labels = sorted(values, key=float if numeric else str)
        if numeric and any("." in v for v in labels):
            raise ConfigError(
                f"{train}: labels such as {next(v for v in labels if '.' in v)} look like scores: "
                f"set kind: regression, or list the classes with labels: [...]"
            )
    labels = tuple(str(v) for v in labels or ())
    twice = next((v for i, v in enumerate(labels) if v in labels[:i]), None)
    if twice is not None:
        raise ConfigError(f"task: labels lists {twice!r} twice (each class once, in class-id order)")
    if kind == "classification" and len(labels) < 2:
        where = "task: labels lists" if given else f"{train}: {label_column!r} holds"
        raise ConfigError(
            f"{where} one class ({', '.join(map(repr, labels)) or 'none'}); a classifier needs two "
            f"or more" + ("" if given else " (kind: regression for scores, or labels: [...] to list them)")
        )
    return labels


def _generation_file_task(
    files, kind, text_columns, label_column, name, metrics, main_metric, generation, labels=None
) -> Task:
    if labels is not None:
        raise ConfigError(f"task: labels apply to classification tasks; a {kind} task generates text")
    if kind == "causal_lm" and text_columns is None and label_column is None:
        columns = read_table(str(files["train"]), ()).column_names
        if {"prompt", "response"} <= set(columns):
            text_columns, label_column = ["prompt"], "response"
        elif "text" in columns:
            text_columns, label_column = [], "text"
        else:
            raise ConfigError(
                f"{files['train']}: a causal_lm file needs 'prompt' and 'response' columns or "
                f"a 'text' column (columns: {', '.join(columns)})"
            )
    if kind == "seq2seq":
        text_columns, label_column = text_columns or ["source"], label_column or "target"
        if isinstance(generation, dict):
            from ..errors import check_keys

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
    return Task(
        name or f"files:{Path(files['train']).stem}",
        tuple(text_columns),
        label_column,
        kind,
        (),
        main_metric,
        metrics,
        "files",
        tuple((s, str(p)) for s, p in files.items()),
        seq2seq=generation,
    )


def recorded_task(task, labels: Sequence[str] | None = None) -> Task:
    """The task a trained run recorded (`deploy`), built from the record alone: a file task's files
    need not be there any more, its classes are the ``labels`` the run was trained with."""
    if not isinstance(task, dict):
        return resolve_task(task)
    spec = dict(task)
    if labels and spec.get("kind", "classification") == "classification":
        spec["labels"] = list(labels)
    return file_task(spec.pop("train"), spec.pop("dev"), spec.pop("test", None), check_files=False, **spec)


def resolve_task(task) -> Task:
    """A task from a name (``sst2``), a `Task`, or a file-task mapping as in experiment files::

    task: {train: data/train.csv, dev: data/dev.csv, text_columns: [text], label_column: label}
    task: {train: data/train.jsonl, dev: data/dev.jsonl, kind: seq2seq, generation: {num_beams: 4}}
    """
    if isinstance(task, dict):
        unknown = set(task) - {
            "train",
            "dev",
            "test",
            "text_columns",
            "label_column",
            "kind",
            "labels",
            "name",
            "metrics",
            "main_metric",
            "generation",
        }
        generative = task.get("kind") in ("seq2seq", "causal_lm")
        if unknown or not {"train", "dev", *(() if generative else ("text_columns",))} <= set(task):
            raise ConfigError(
                "task: a file task needs train, dev and text_columns"
                + (f"; unknown key {sorted(unknown)[0]!r}" if unknown else "")
                + (
                    ""
                    if unknown or "kind" in task
                    else " (a generation task names its kind instead: kind: seq2seq or causal_lm)"
                )
            )
        return file_task(
            task["train"],
            task["dev"],
            task.get("test"),
            **{k: v for k, v in task.items() if k not in ("train", "dev", "test")},
        )
    return get_task(task)


def file_fingerprints(task) -> dict[str, str] | None:
    """The sha256 of each file a file-task mapping names (``train``, ``dev``, ``test``: its
    contents, whatever its path), so a study resumed from a moved data folder is known to read the
    same rows; None for a named task."""
    if not isinstance(task, dict):
        return None
    out = {}
    for key in FILE_KEYS:
        if isinstance(task.get(key), str) and Path(task[key]).is_file():
            with open(task[key], "rb") as f:
                out[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def load_files(task: Task, data_dir=None) -> dict[str, Split]:
    """The rows of a file task's ``train``, ``dev`` (and ``test``) files; ``data_dir`` is ignored."""
    out = {}
    for split, path in task.data_files:
        table = read_table(path, (*task.text_columns, task.label_column), task.label_column)
        out[split] = make_split(
            task, [table[c] for c in task.text_columns], table[task.label_column], lambda i, p=path: f"{p}, row {i + 1}"
        )
    return out


register_source("files", load_files)
