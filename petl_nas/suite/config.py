"""Suite files: one backbone and protocol, a list of tasks and a list of budgets.

A suite runs one study per task and budget, each an ordinary experiment: ``study`` holds the
experiment fields every study shares (the protocol), and each study's name, task, data and budget
come from the suite. Studies are named ``<suite>_<task>_<budget>`` (``0.05%`` written ``0.05pct``),
so a suite that is run again resumes every one of them.

Example (``suites/budgets.yaml`` with a file task and one supernet per task)::

    name: budgets
    data_dir: ../shared/data/glue
    tasks: [sst2, stsb, {name: qnli, task: {train: q/train.tsv, dev: q/test.tsv, ...}}]
    budgets: [0.01%, 0.05%, 0.5%]
    study: {strategy: oneshot, trials: 0, fidelity: {k: 1000}}
    supernet: shared       # each task's largest budget's supernet proposes for its other budgets too
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, check_keys, read_text, read_yaml
from ..rules import option
from ..study.experiment import BUDGET_SCHEMA, Experiment, OneShot, Rates, check_budget_list, check_budget_text

FROM_THE_SUITE = ("name", "task", "budget", "data_dir", "study", "source")  # each study's own
SUPERNET = ("per_budget", "shared")  # a supernet per study, or one per task serving its budgets
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite: its ``label`` (in study names and the table), the experiment's ``task``
    (a built-in name or a file task's mapping) and its ``data_dir`` (None: the suite's)."""

    label: str
    task: object
    data_dir: str | None = None
    study: dict | None = None  # experiment fields this task changes in the protocol


_TASK_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": f"^{_LABEL.pattern}$"},
        {
            "type": "object",
            "required": ["task"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": f"^{_LABEL.pattern}$"},
                "task": {"anyOf": [{"type": "string"}, {"type": "object"}]},
                "data_dir": {"type": ["string", "null"]},
                "study": {"type": ["object", "null"]},
            },
        },
    ]
}


@dataclass(frozen=True)
class Suite:
    name: str = option(
        meaning="the suite's name: its `runs/NAME/` folder and the prefix of its studies' names",
        accepts="letters, digits, '_' or '-'",
        schema={"type": "string", "pattern": f"^{_LABEL.pattern}$"},
    )
    tasks: tuple[SuiteTask, ...] = option(
        meaning="task names, or mappings `{name, task, data_dir, study}`: a file task, its own data folder, the "
        "protocol's keys this task changes",
        accepts="a non-empty list of names or mappings",
        schema={"type": "array", "minItems": 1, "items": _TASK_SCHEMA},
    )
    budgets: tuple[str, ...] = option(
        meaning="each task's studies' budgets (`0.01%` or counts), each given once",
        accepts="a non-empty list of budgets",
        schema={"type": "array", "minItems": 1, "items": BUDGET_SCHEMA},
    )
    study: dict = option(
        meaning="the protocol: the experiment-file keys every study shares, except `name`, `task`, "
        "`budget`, `data_dir` and `study`",
        accepts="a mapping of experiment-file keys",
        schema={"type": ["object", "null"]},
        factory=dict,
    )  # the reference fills in the experiment's keys
    data_dir: str | None = option(
        None,
        "the folder of the tasks' files (a task's own `data_dir` wins)",
        accepts="a folder, or null",
        schema={"type": ["string", "null"]},
    )
    source: str = "<suite>"
    supernet: str = option(
        "per_budget",
        "`per_budget` (a supernet per study) or `shared` (each task's largest "
        "budget's supernet proposes for its other budgets)",
        accepts="one of " + ", ".join(SUPERNET),
        schema={"enum": list(SUPERNET)},
    )

    @classmethod
    def load(cls, path: str | Path) -> Suite:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"suite {str(path)!r}: no such file")
        data = read_yaml(read_text(path), path)
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a suite file is a mapping of name, tasks, budgets and study")
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<suite>") -> Suite:
        check_keys(source, data, ["name", "tasks", "budgets", "study", "data_dir", "supernet"], sep=": ")
        for key in ("name", "tasks", "budgets"):
            if key not in data:
                raise ConfigError(f"{source}: {key}: missing (a suite names its tasks, budgets and name)")
        _check_name(data["name"], source)
        tasks = data["tasks"]
        if not isinstance(tasks, list) or not tasks:
            raise ConfigError(f"{source}: tasks: expected a non-empty list of task names or mappings")
        budgets = check_budget_list(data["budgets"], f"{source}: budgets")
        study = data.get("study") or {}
        _check_protocol(study, f"{source}: study")
        supernet = data.get("supernet", "per_budget")
        if supernet not in SUPERNET:
            raise ConfigError(f"{source}: supernet: expected one of {', '.join(SUPERNET)}, got {supernet!r}")
        suite = cls(
            data["name"],
            tuple(_task(t, source) for t in tasks),
            tuple(str(b) for b in budgets),
            study,
            data.get("data_dir"),
            source,
            supernet,
        )
        labels = [t.label for t in suite.tasks]
        twice = next((n for n in labels if labels.count(n) > 1), None)
        if twice is not None:
            raise ConfigError(f"{source}: tasks: {twice!r} is given twice (give each a distinct name)")
        values = [budget_value(b) for b in suite.budgets]
        twice = next((b for b, v in zip(suite.budgets, values) if values.count(v) > 1), None)
        if twice is not None:
            same = [b for b, v in zip(suite.budgets, values) if v == budget_value(twice)]
            raise ConfigError(f"{source}: budgets: a budget is given twice ({', '.join(same)})")
        if supernet == "shared" and len({bool(check_budget_text(b).group(2)) for b in suite.budgets}) > 1:
            raise ConfigError(
                f"{source}: supernet: shared needs budgets of one kind (all percentages or all "
                f"counts), so that the largest is known before the backbone is read"
            )
        _check_files_read(suite.experiments(), source)  # every study is checked before any study trains
        return suite

    def experiments(self) -> list[tuple[str, str, Experiment]]:
        """(task label, budget, its study's experiment), task by task, budgets in the order given.
        Where the protocol measures rates (``rates: auto`` without a file), a task's largest budget
        measures them and its other budgets reuse its ``rates.json`` (`calibrating`). With
        ``supernet: shared``, a one-shot task's largest budget also proposes for the others
        (``oneshot.budgets``), which read its ``oneshot.json`` (``oneshot.file``) and train no supernet."""
        out, first = [], self.calibrating()
        for t in self.tasks:
            for budget in self.budgets:
                fields = {
                    **_merged(self.study, t.study or {}),
                    "name": self.study_name(t.label, budget),
                    "task": t.task,
                    "budget": budget,
                    "data_dir": t.data_dir or self.data_dir,
                }
                exp = Experiment.from_dict(fields, f"{self.source}: {t.label} at {budget}")
                if exp.rates.on and exp.rates.file is None and budget != first:
                    reuse = str(Path("runs") / self.study_name(t.label, first) / Rates.FILE)
                    exp = dataclasses.replace(exp, rates=dataclasses.replace(exp.rates, file=reuse))
                if self.supernet == "shared" and exp.strategy != "sampler" and len(self.budgets) > 1:
                    try:
                        exp = dataclasses.replace(exp, oneshot=self._shared(exp.oneshot, t.label, budget, first))
                    except ConfigError as e:
                        raise ConfigError(f"{self.source}: {t.label} at {budget}: {e}") from None
                out.append((t.label, budget, exp))
        if self.supernet == "shared" and all(exp.strategy == "sampler" for _, _, exp in out):
            raise ConfigError(
                f"{self.source}: supernet: shared applies to one-shot studies (study: {{strategy: "
                f"oneshot}} or both), and every study here samples"
            )
        return out

    def with_executor(self, executor: str) -> Suite:
        """This suite with every study running its trials by ``executor`` (a task's own ``study``
        setting included): how trials run, not what they measure."""
        tasks = tuple(
            dataclasses.replace(t, study={**t.study, "executor": executor}) if t.study and "executor" in t.study else t
            for t in self.tasks
        )
        return dataclasses.replace(self, study={**self.study, "executor": executor}, tasks=tasks)

    def _shared(self, oneshot, label: str, budget: str, first: str):
        """``oneshot`` of a study when one supernet serves every budget of its task: the largest
        budget's proposes for the others too; theirs read its file."""
        if budget == first:
            return dataclasses.replace(oneshot, budgets=[b for b in self.budgets if b != first])
        made = str(Path("runs") / self.study_name(label, first) / OneShot.FILE)
        return dataclasses.replace(oneshot, file=made, runs=1, search=None)

    def in_running_order(self) -> list[tuple[str, str, Experiment]]:
        """`experiments`, each task's calibrating budget first (the others read its rates and, with
        ``supernet: shared``, its supernet's proposals)."""
        first = self.calibrating()
        return sorted(self.experiments(), key=lambda e: (self.tasks.index(self._task(e[0])), e[1] != first))

    def calibrating(self) -> str:
        """The budget whose study measures a task's rates: the largest (rates measured where every
        family's preset fits; at 0.01% of MiniLM none does), the first given when some are
        percentages and some counts."""
        values = [check_budget_text(b) for b in self.budgets]
        if len({bool(m.group(2)) for m in values}) > 1:
            return self.budgets[0]
        return max(self.budgets, key=lambda b: float(check_budget_text(b).group(1)))

    def study_name(self, label: str, budget: str) -> str:
        return f"{self.name}_{label}_{budget.replace('%', 'pct')}"

    def _task(self, label: str) -> SuiteTask:
        return next(t for t in self.tasks if t.label == label)

    @property
    def run_dir(self) -> Path:
        return Path("runs") / self.name


def budget_value(text: str) -> tuple[float, bool]:
    """A budget as a number and whether it is a percentage: ``5%`` and ``5.0%`` are one budget."""
    m = check_budget_text(text)
    return float(m.group(1)), bool(m.group(2))


def _check_name(name, source: str) -> None:
    """A suite's name names its folder and studies: a string (YAML reads ``12345`` as a number and
    ``2026-12-07`` as a date; quoted, either is a name)."""
    if not isinstance(name, str):
        kind = (
            "a number"
            if isinstance(name, (int, float))
            else "a date"
            if hasattr(name, "isoformat")
            else f"a {type(name).__name__}"
        )
        raise ConfigError(
            f"{source}: name: expected a string, got {name} (YAML reads it as {kind}: write name: '{name}')"
        )
    if not _LABEL.fullmatch(name):
        raise ConfigError(f"{source}: name: {name!r}: letters, digits, '_' or '-' (it names runs/NAME and the studies)")


SEARCH_FLAGS = (
    (
        re.compile(r"use a new --study name or --force-new-study to replace it"),
        "rename the suite (name:) or delete that study to start it again",
    ),
    (re.compile(r"--data-dir (DIR)?"), "data_dir: DIR in the suite file "),
    (re.compile(r"--study\b"), "suite name:"),
)


def in_suite_terms(message: str) -> str:
    """A search's error line said for a suite: its flags that ``suite`` does not have become the
    suite file's keys (``--data-dir DIR``: ``data_dir: DIR``)."""
    for pattern, words in SEARCH_FLAGS:
        message = pattern.sub(words, message)
    return message.replace("  ", " ")


def _check_protocol(study, where: str) -> None:
    if not isinstance(study, dict):
        raise ConfigError(f"{where}: expected a mapping of experiment fields (the protocol)")
    given = [k for k in FROM_THE_SUITE if k in study]
    if given:
        raise ConfigError(
            f"{where}: {given[0]} comes from the suite (its name, tasks, budgets and data_dir), not from study"
        )


def files_written(experiments) -> dict[Path, Experiment]:
    """The rates and proposals files the studies of ``experiments`` (task, budget, experiment) may
    write, each with the study that writes it."""
    return {exp.run_dir / name: exp for _, _, exp in experiments for name in (Rates.FILE, OneShot.FILE)}


def files_read(exp, experiments) -> list[Path]:
    """The files ``exp`` reads that a study of ``experiments`` writes (its rates, its proposals)."""
    written = files_written(experiments)
    return [Path(p) for p in (exp.rates.file, exp.oneshot.file) if p is not None and Path(p) in written]


def _check_files_read(experiments, source: str) -> None:
    """A rates or proposals file a study reads must exist, unless a study of this suite writes it
    (a task's calibrating budget writes what its other budgets read): a typo is said at once, not
    after the studies before it have trained."""
    written = files_written(experiments)
    for label, budget, exp in experiments:
        for key, path in (("rates: file", exp.rates.file), ("oneshot: file", exp.oneshot.file)):
            if path is not None and Path(path) not in written and not Path(path).exists():
                raise ConfigError(
                    f"{source}: {label} at {budget}: {key} {path!r}: no such file "
                    f"(and no study of this suite writes it)"
                )


def _merged(protocol: dict, changes: dict) -> dict:
    """The protocol with a task's changes; a mapping (``fidelity``, ``final``) is merged key by key."""
    out = dict(protocol)
    for key, value in changes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _task(entry, source: str) -> SuiteTask:
    if isinstance(entry, str):
        label, task, data_dir, study = entry, entry, None, None
    elif isinstance(entry, dict):
        check_keys(f"{source}: tasks", entry, ["name", "task", "data_dir", "study"], sep=": ")
        if "task" not in entry:
            raise ConfigError(f"{source}: tasks: a task given as a mapping needs task: (a name or a file task)")
        task = entry["task"]
        label = entry.get("name") or (task if isinstance(task, str) else None)
        if label is None:
            raise ConfigError(f"{source}: tasks: a file task needs a name: (it names the study and the table's row)")
        data_dir, study = entry.get("data_dir"), entry.get("study")
        if study is not None:
            _check_protocol(study, f"{source}: tasks: {label}: study")
    else:
        raise ConfigError(f"{source}: tasks: expected a task name or a mapping, got {entry!r}")
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise ConfigError(f"{source}: tasks: name {label!r}: letters, digits, '_' or '-' (it names the studies)")
    return SuiteTask(label, task, data_dir, study)


__all__ = ["Suite", "SuiteTask", "FROM_THE_SUITE", "budget_value", "files_read", "files_written", "in_suite_terms"]
