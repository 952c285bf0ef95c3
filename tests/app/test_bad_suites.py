"""Bad input to `petl-nas suite`: one `error:` line naming the suite file, the task and the budget,
exit status 2, said before the first study trains: no study, no database, no run folder made.

One table, one row per mistake; each row runs the real CLI in this process on a fresh folder, and
compares every file's bytes before and after (the first task is sound: a suite that trained it
before finding the mistake writes its study, and the row fails)."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import TINY_BACKBONE

from petl_nas.app.cli import main

PROTOCOL = {
    "backbone": TINY_BACKBONE,
    "space": "small",
    "trials": 1,
    "presets": ["lora"],
    "executor": "local",
    "rates": "off",
    "storage": "sqlite:///study.db",
    "fidelity": {"k": 32, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 16},
    "final": {"seeds": 0, "baselines": False},
}


def suite(tasks=("demo_keyword",), budgets=("1%", "5%"), name="s", **study) -> str:
    return json.dumps(
        {"name": name, "tasks": list(tasks), "budgets": list(budgets), "study": {**PROTOCOL, **study}}
    )  # JSON is YAML


def file_task(name: str, path: str) -> dict:
    return {"name": name, "task": {"train": path, "dev": path, "text_columns": ["sentence"], "label_column": "label"}}


def rows(n: int, label=lambda i: i % 2) -> str:
    return "sentence\tlabel\n" + "".join(f"a film number {i}\t{label(i)}\n" for i in range(n))


# (id, files beside suite.yaml, words the error line must contain)
CASES = [
    (
        "later-task-unknown",
        {"suite.yaml": suite(["demo_keyword", "demo_bogus"])},
        "suite.yaml: demo_bogus at 5%: unknown task 'demo_bogus' (did you mean 'demo_copy'?)",
    ),
    (
        "later-task-file-missing",
        {"suite.yaml": suite(["demo_keyword", file_task("f", "no/train.tsv")])},
        "suite.yaml: f at 5%: ",
    ),
    (
        "later-task-header-only",
        {"suite.yaml": suite(["demo_keyword", file_task("f", "t.tsv")]), "t.tsv": rows(0)},
        "suite.yaml: f at 5%: t.tsv: the file has no rows",
    ),
    (
        "later-task-one-class",
        {"suite.yaml": suite(["demo_keyword", file_task("f", "t.tsv")]), "t.tsv": rows(100, lambda i: 1)},
        "f at 5%: t.tsv: 'label' holds one class ('1'); a classifier needs two or more",
    ),
    (
        "later-task-fewer-rows-than-k",
        {"suite.yaml": suite(["demo_keyword", file_task("f", "t.tsv")]), "t.tsv": rows(6)},
        "f at 5%: k (fidelity.k) must be a whole number from 1 to the 6 training rows, got 32",
    ),
    (
        "budget-zero",
        {"suite.yaml": suite(budgets=["5%", "0"])},
        "demo_keyword at 0: budget 0 admits no PETL module of space 'small'",
    ),
    (
        "budget-a-sliver",
        {"suite.yaml": suite(budgets=["5%", "1e-9%"])},
        "demo_keyword at 1e-9%: budget 0 admits no PETL module of space 'small'",
    ),
    (
        "budget-twice-as-numbers",
        {"suite.yaml": suite(budgets=["5%", "5.0%"])},
        "suite.yaml: budgets: a budget is given twice (5%, 5.0%)",
    ),
    (
        "name-a-number",
        {"suite.yaml": suite().replace('"name": "s"', '"name": 12345')},
        "suite.yaml: name: expected a string, got 12345 (YAML reads it as a number: write name: '12345')",
    ),
    (
        "name-a-date",
        {"suite.yaml": suite().replace('"name": "s"', '"name": 2026-12-07')},
        "suite.yaml: name: expected a string, got 2026-12-07 (YAML reads it as a date: write name: '2026-12-07')",
    ),
    (
        "data-advice-in-suite-terms",
        {"suite.yaml": suite(["demo_keyword", "sst2"])},
        "pass data_dir: DIR in the suite file with DIR/SST-2/train.tsv",
    ),
    ("study-made-otherwise", "other-study", "rename the suite (name:) or delete that study to start it again"),
]


def _snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _other_study(root) -> None:
    """The suite's first study, made before with another space (its hash differs)."""
    import optuna

    from petl_nas.study.storage import close_storage, open_storage

    storage = open_storage(f"sqlite:///{root}/study.db")
    study = optuna.create_study(study_name="s_demo_keyword_5pct", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("space_hash", "0123456789ab")
    study.set_user_attr("space_name", "small")
    close_storage(storage)


@pytest.mark.parametrize("files, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_suite_is_one_line_before_any_study_trains(tmp_path, monkeypatch, capsys, files, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    if files == "other-study":
        _other_study(tmp_path)
        files = {"suite.yaml": suite()}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    before = _snapshot(tmp_path)
    rc = main(["suite", "--experiment", "suite.yaml"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("petl-nas: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "--force-new-study" not in err and "--data-dir" not in err and "--study" not in err, err
    assert _snapshot(tmp_path) == before  # no study, no database, no run folder


def test_a_quoted_name_of_digits_is_a_name(tmp_path):
    from petl_nas.suite.config import Suite

    path = tmp_path / "s.yaml"
    path.write_text(suite().replace('"name": "s"', "\"name\": '2026-12-07'"))
    assert [e.study_name for _, _, e in Suite.load(path).experiments()] == [
        "2026-12-07_demo_keyword_1pct",
        "2026-12-07_demo_keyword_5pct",
    ]


def test_side_by_side_the_plan_is_checked_before_any_study_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(suite(["demo_keyword", "demo_bogus"]))
    assert main(["suite", "--experiment", "suite.yaml", "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert "suite.yaml: demo_bogus at 5%: unknown task 'demo_bogus'" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.yaml"]
