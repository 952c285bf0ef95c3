"""The GLUE tasks (CoLA, SST-2, MRPC, QQP, STS-B, MNLI, QNLI, RTE): their labels and metrics, and
where their rows come from: ``DATA_DIR/<folder>/{train,dev}.tsv`` (GLUE's download layout) when
a data directory is given, else the Hugging Face hub (``nyu-mll/glue``). The task's own dev set
(MNLI: matched) is the test set of the honest protocol.

Example:
    >>> from petl_nas.tasks import get_task
    >>> get_task("mnli").labels
    ('entailment', 'neutral', 'contradiction')
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .metrics import ranking_metric
from .registry import Split, Task, make_split, register_source, register_task

__all__ = ["GLUE_TASKS", "LABEL_NAMES", "label_names", "load_glue"]


@dataclass(frozen=True)
class _GlueFormat:
    folder: str  # glue_data/<folder>/
    columns: tuple  # text column(s) then label column: header names, or indices
    hub_config: str
    hub_dev: str = "validation"
    dev_file: str = "dev.tsv"
    header: bool = True


_BINARY, _NLI2 = ("0", "1"), ("entailment", "not_entailment")
_ACC, _PAIR, _STS = ("accuracy",), ("f1", "accuracy", "f1_accuracy"), ("pearson", "spearman", "pearson_spearman")
_GLUE = {  # name: (text columns, labels, customary metric, metrics, how its glue_data files are laid out)
    "cola": (("sentence",), _BINARY, "mcc", ("mcc",), _GlueFormat("CoLA", (3, 1), "cola", header=False)),
    "sst2": (("sentence",), _BINARY, "accuracy", _ACC, _GlueFormat("SST-2", ("sentence", "label"), "sst2")),
    "mrpc": (
        ("sentence1", "sentence2"),
        _BINARY,
        "f1",
        _PAIR,
        _GlueFormat("MRPC", ("#1 String", "#2 String", "Quality"), "mrpc"),
    ),
    "qqp": (
        ("question1", "question2"),
        _BINARY,
        "f1",
        _PAIR,
        _GlueFormat("QQP", ("question1", "question2", "is_duplicate"), "qqp"),
    ),
    "stsb": (
        ("sentence1", "sentence2"),
        (),
        "pearson_spearman",
        _STS,
        _GlueFormat("STS-B", ("sentence1", "sentence2", "score"), "stsb"),
    ),
    "mnli": (
        ("premise", "hypothesis"),
        ("entailment", "neutral", "contradiction"),
        "accuracy",
        _ACC,
        _GlueFormat(
            "MNLI",
            ("sentence1", "sentence2", "gold_label"),
            "mnli",
            hub_dev="validation_matched",
            dev_file="dev_matched.tsv",
        ),
    ),
    "qnli": (
        ("question", "sentence"),
        _NLI2,
        "accuracy",
        _ACC,
        _GlueFormat("QNLI", ("question", "sentence", "label"), "qnli"),
    ),
    "rte": (
        ("sentence1", "sentence2"),
        _NLI2,
        "accuracy",
        _ACC,
        _GlueFormat("RTE", ("sentence1", "sentence2", "label"), "rte"),
    ),
}
# What GLUE's 0/1 labels mean, where its files write numbers (MNLI, QNLI and RTE write the names).
LABEL_NAMES = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
}
GLUE_TASKS: dict[str, Task] = {
    name: Task(name, cols, "label", kind, labels, ranking_metric(customary, kind), metrics, customary_metric=customary)
    for name, (cols, labels, customary, metrics, _) in _GLUE.items()
    for kind in ["classification" if labels else "regression"]
}


def label_names(task, labels) -> list[str]:
    """The names of a recorded task's ``labels`` (in their order): GLUE's for a GLUE task whose files
    write numbers, else the labels as they are. ``task``: its name, or the spec of a task on files."""
    names = LABEL_NAMES.get(task) if isinstance(task, str) else None
    return list(names) if names and tuple(labels) == GLUE_TASKS[task].labels else list(labels)


def _read_glue_tsv(task: Task, path: Path, fmt: _GlueFormat) -> Split:
    if not path.is_file():
        raise ConfigError(
            f"task {task.name!r}: expected file {path} does not exist "
            f"(GLUE layout: <data-dir>/{fmt.folder}/train.tsv and {fmt.dev_file})"
        )
    # utf-8-sig: GLUE's download script writes MRPC's files with a byte-order mark before the header.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)  # GLUE text contains bare quotes
        cols = list(fmt.columns)
        if fmt.header:
            header = next(reader, [])
            missing = [c for c in cols if c not in header]
            if missing:
                raise ConfigError(
                    f"{path}: not a {fmt.folder} file: expected columns {', '.join(map(repr, cols))}, "
                    f"found {', '.join(map(repr, header))} (missing {', '.join(map(repr, missing))})"
                )
            cols = [header.index(c) for c in cols]
        rows, lines = [], []
        for row in reader:
            if not row:
                continue
            if len(row) <= max(cols):
                raise ConfigError(
                    f"{path}, line {reader.line_num}: expected at least {max(cols) + 1} "
                    f"tab-separated fields, found {len(row)}"
                )
            rows.append(row)
            lines.append(reader.line_num)
    texts = [[row[c] for row in rows] for c in cols[:-1]]
    return make_split(task, texts, [row[cols[-1]] for row in rows], lambda i: f"{path}, line {lines[i]}")


def load_glue(task: Task, data_dir=None) -> dict[str, Split]:
    """``train`` and ``dev`` rows of a GLUE task: from ``data_dir`` when given, else the hub."""
    fmt = _GLUE[task.name][-1]
    if data_dir is not None:
        folder = Path(data_dir) / fmt.folder
        return {
            "train": _read_glue_tsv(task, folder / "train.tsv", fmt),
            "dev": _read_glue_tsv(task, folder / fmt.dev_file, fmt),
        }
    try:
        import datasets

        from ..core.models import hub_datasets_offline_when_unreachable

        with hub_datasets_offline_when_unreachable():
            hub = datasets.load_dataset("nyu-mll/glue", fmt.hub_config)
    except Exception as e:  # offline, no such repo, network: one message that says what to do
        raise ConfigError(
            f"task {task.name!r}: no data directory given and GLUE could not be loaded from "
            f"the Hugging Face hub ({type(e).__name__}); pass --data-dir DIR with "
            f"DIR/{fmt.folder}/train.tsv"
        ) from None
    out = {}
    for split, hub_split in (("train", "train"), ("dev", fmt.hub_dev)):
        data = hub[hub_split]
        raw = data["label"] if task.kind == "regression" else [task.labels[i] for i in data["label"]]
        out[split] = make_split(
            task,
            [data[c] for c in task.text_columns],
            raw,
            lambda i, s=hub_split: f"glue/{fmt.hub_config} {s}, row {i + 1}",
        )
    return out


for _task in GLUE_TASKS.values():
    register_task(_task)
register_source("glue", load_glue)
