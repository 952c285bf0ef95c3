"""petl-nas suite: one protocol over tasks and budgets, resumed after a kill without training anything
twice, and a table whose Δ is the paired test difference of the pick and the best baseline."""

from __future__ import annotations

import json
import statistics
import warnings

import numpy as np
import optuna
import pytest
import yaml
from conftest import TINY_BACKBONE, trained_runs

from petl_nas import ConfigError
from petl_nas.app.cli import main
from petl_nas.study import pick as pick_rule
from petl_nas.study.records import sessions
from petl_nas.suite.cells import empty, macro, markdown, plot_png
from petl_nas.suite.config import Suite
from petl_nas.suite.runner import run_suite


def keyword_files(folder) -> dict:
    """A file task the suite was never told about: a colour word among filler words decides the label."""
    rng = np.random.default_rng(0)
    filler, warm, cold = ("the", "a", "of", "it", "was", "and", "with", "this"), ("red", "orange"), ("blue", "green")
    for split, n in (("train", 600), ("test", 200)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = int(rng.random() < 0.5)
            words = list(rng.choice(filler, size=5))
            words.insert(int(rng.integers(0, 6)), str(rng.choice(warm if label else cold)))
            rows.append(" ".join(words) + f"\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return {
        "train": str(folder / "train.tsv"),
        "dev": str(folder / "test.tsv"),
        "text_columns": ["sentence"],
        "label_column": "label",
    }


def suite_file(tmp_path, study=None, **changes) -> str:
    """The test suite's file; ``study`` changes fields of its protocol, ``changes`` the suite's own."""
    data = {
        "name": "s",
        "tasks": ["demo_keyword", {"name": "colours", "task": keyword_files(tmp_path)}],
        "budgets": ["1%", "5%"],
        "study": {
            "backbone": TINY_BACKBONE,
            "space": "small",
            "trials": 1,
            "presets": ["lora"],
            "executor": "local",
            "rates": "off",
            "seed": 3,
            "fidelity": {
                "length_buckets": 0,
                "k": 320,
                "epochs": 5,
                "batch_size": 16,
                "max_length": 24,
                "evals_per_epoch": 2,
                "search_dev": 128,
            },
            "final": {"seeds": 2, "epochs": 1, "max_front": 1, "presets": "none", "confirm": 2, "confirm_seeds": 1},
        },
    }
    data["study"].update(study or {})
    data.update(changes)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
def test_a_suite_killed_mid_way_goes_on_and_tables_the_paired_delta(tmp_path, monkeypatch, capsys):
    suite = Suite.load(suite_file(tmp_path))
    assert [(t, b, e.study_name) for t, b, e in suite.experiments()] == [
        ("demo_keyword", "1%", "s_demo_keyword_1pct"),
        ("demo_keyword", "5%", "s_demo_keyword_5pct"),
        ("colours", "1%", "s_colours_1pct"),
        ("colours", "5%", "s_colours_5pct"),
    ]

    started, said = [], []

    def stop_at_the_third(line):
        if line.startswith("suite s: "):
            started.append(line.split(", study")[0].removeprefix("suite s: "))
            said.append(line)
        if line.startswith("suite s: colours at budget 1%"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, printer=stop_at_the_third)
    assert started == [
        "demo_keyword at budget 5%",
        "demo_keyword at budget 1%",
        "colours at budget 5%",
        "colours at budget 1%",
    ]  # each task's largest budget first
    assert [("min left in the suite (" in line) for line in said] == [False, True, True, True]  # once one ran
    first = {}
    for _, _, exp in suite.experiments()[:2] + suite.experiments()[3:]:
        study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
        first[exp.study_name] = (
            [(t.number, t.values) for t in study.trials],
            {k: v for k, v in study.user_attrs.items() if k.startswith(("final:", "confirm:"))},
        )
        assert any(k.startswith("final:") for k in first[exp.study_name][1])
    so_far = (tmp_path / "runs" / "s" / "suite.md").read_text()  # the table so far
    assert "| colours | 1% | not run yet | - | - |" in so_far and "| 1 of 2 |" in so_far

    calls = trained_runs(monkeypatch)
    assert main(["suite", "--experiment", suite_file(tmp_path), "--table-only"]) == 0 and calls == []
    assert "| colours | 1% | not run yet | - |" in (tmp_path / "runs" / "s" / "suite.md").read_text()
    capsys.readouterr()
    assert main(["suite", "--experiment", suite_file(tmp_path)]) == 0
    assert calls and "demo_keyword" not in {str(spec.task) for spec in calls}  # nothing trained twice
    for _, _, exp in suite.experiments()[:2] + suite.experiments()[3:]:
        study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
        assert first[exp.study_name] == (
            [(t.number, t.values) for t in study.trials],
            {k: v for k, v in study.user_attrs.items() if k.startswith(("final:", "confirm:"))},
        )

    data = json.loads((tmp_path / "runs" / "s" / "suite.json").read_text())
    assert [(c["task"], c["budget"]) for c in data["cells"]] == [(t, b) for t, b, _ in suite.experiments()]
    for c, (_, _, exp) in zip(data["cells"], suite.experiments()):
        study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
        assert c["budget_params"] == study.user_attrs["budget"]
        pick, base = c["pick"], c["baseline"]
        assert pick["deployable"] <= c["budget_params"] and base["deployable"] <= c["budget_params"]
        assert pick["test"] == study.user_attrs[f"final:{pick['number']}"]["scores"]
        assert base["test"] == study.user_attrs[f"final:{base['number']}"]["scores"]
        scores = pick_rule.confirmed_scores(study)  # the best baseline by its confirmed mean
        named = [n for n in scores if {"preset", "baseline"} & set(study.trials[n].user_attrs)]
        assert base["number"] == max(named, key=lambda n: statistics.fmean(scores[n]))
        diffs = [100 * (a - b) for a, b in zip(pick["test"], base["test"])]
        assert c["delta"]["mean"] == pytest.approx(statistics.fmean(diffs))
        said = pick_rule.verdict(study)
        assert said.beaten or pick["number"] == base["number"]  # a tie deploys the baseline itself
        found = study.user_attrs[f"final:{said.best}"]["scores"]  # the best confirmed mean: re-evaluated
        assert c["best_mean_delta"]["mean"] == pytest.approx(
            statistics.fmean(100 * (a - b) for a, b in zip(found, base["test"]))
        )
        runs = sessions(study.user_attrs)  # every run of it, the resumes that trained nothing too
        assert len(runs) == (1 if exp.study_name == "s_colours_1pct" else 2)
        assert c["wall_min"] == round(sum(r["wall_s"] for r in runs) / 60, 1)
    minutes = {
        t: round(sum(c["wall_min"] for c in data["cells"] if c["task"] == t), 1) for t in ("demo_keyword", "colours")
    }
    assert (
        f"Wall time per task, its studies summed: demo_keyword {minutes['demo_keyword']:g} min (2 of 2 studies); "
        f"colours {minutes['colours']:g} min (2 of 2 studies)."
    ) in (tmp_path / "runs" / "s" / "suite.md").read_text()
    for m in data["macro"]:
        deltas = [c["delta"]["mean"] for c in data["cells"] if c["budget"] == m["budget"]]
        assert m["mean"] == pytest.approx(statistics.fmean(deltas)) and m["lowest"] == min(deltas)
    out = capsys.readouterr().out
    assert "| budget | macro-average Δ pts over the tasks measured (± se) |" in out and "table: runs/s/suite.md" in out
    assert (tmp_path / "runs" / "s" / "suite.png").read_bytes()[:4] == b"\x89PNG"


def test_the_macro_average_is_over_the_tasks_measured_and_combines_standard_errors():
    cells = [
        {"task": t, "budget": "b", "delta": {"mean": m, "std": s, "n": 4}}
        for t, m, s in (("a", 2.0, 2.0), ("c", -1.0, 4.0))
    ]
    cells.append({"task": "a", "budget": "d", "delta": {"mean": 1.0, "std": 1.0, "n": 4}})
    cells.append({"task": "c", "budget": "d", "delta": None})
    b, d = macro(cells)
    assert (b["mean"], b["lowest"], b["measured"]) == (0.5, -1.0, 2)
    assert b["se"] == pytest.approx(((2.0**2 / 4 + 4.0**2 / 4) ** 0.5) / 2)
    assert (d["mean"], d["lowest"], d["measured"], d["tasks"]) == (1.0, 1.0, 1, 2)  # a suite still running
    nothing = macro([{"task": "a", "budget": "e", "delta": None}])[0]
    assert nothing["mean"] is None and nothing["measured"] == 0


def test_the_time_left_in_a_suite_is_judged_by_the_studies_run_at_each_budget():
    from petl_nas.suite.runner import time_left

    assert time_left([], ["0.5%", "0.01%"]) == ""  # nothing run yet: no guess
    done = [
        {"budget": "0.5%", "wall_min": 50.0},
        {"budget": "0.01%", "wall_min": 15.0},
        {"budget": "0.05%", "wall_min": None},
    ]  # not timed: not counted
    # a 0.5% study and a 0.01% one as those run; a 1% study (none run) as the mean of all: 32.5
    assert (
        time_left(done, ["0.5%", "0.01%", "1%"])
        == "about 98 min left in the suite (3 studies to run, judged by the 2 run so far)"
    )
    assert (
        time_left(done[:1], ["0.01%"])
        == "about 50 min left in the suite (1 study to run, judged by the one run so far)"
    )
    assert time_left([{"budget": "1%", "wall_min": 0.1}], ["1%"]).startswith("about 1 min left")  # never 0


def test_a_cell_not_run_yet_reads_as_not_measured():
    row = empty("x", "1%")
    text = markdown("s", [row])
    assert "| x | 1% | not run yet | - | - | - | - | - | - | - | - | - | - | - | - | no | - | 0 | - |" in text
    assert "| 1% | - | - | 0 of 1 | - | - | 0 of 1 |" in text
    assert "Wall time per task" not in text  # nothing recorded: nothing said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no empty legend warned about
        assert plot_png([row]).startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "change, said",
    [
        ({"tasks": []}, "tasks: expected a non-empty list"),
        ({"budgets": ["0.5 %"]}, "budgets: budget: '0.5 %' is not a count"),
        ({"budgets": ["1%", "1%"]}, "budgets: a budget is given twice"),
        ({"tasks": ["demo_keyword", "demo_keyword"]}, "'demo_keyword' is given twice"),
        ({"tasks": [{"task": {"train": "a.tsv"}}]}, "a file task needs a name:"),
        ({"study": {"budget": "1%"}}, "study: budget comes from the suite"),
        ({"study": {"trails": 3}}, "trails: unknown key"),
        ({"tasks": [{"name": "x", "task": "demo_keyword", "study": {"task": "sst2"}}]}, "x: study: task comes from"),
        ({"tasks": [{"name": "x", "task": "demo_keyword", "study": {"fidelity": {"kk": 1}}}]}, "kk: unknown key"),
        ({"name": "a/b"}, "name"),
        ({"budget": "1%"}, "budget: unknown key"),
        ({"supernet": "one"}, "supernet: expected one of per_budget, shared, got 'one'"),
        ({"supernet": "shared", "budgets": ["1%", "900"]}, "supernet: shared needs budgets of one kind"),
        ({"supernet": "shared"}, "supernet: shared applies to one-shot studies"),
        (
            {"supernet": "shared", "study": {"strategy": "oneshot", "oneshot": {"file": "x.json"}}},
            "demo_keyword at 5%: oneshot: file reads another study's proposals",
        ),
        (
            {"study": {"rates": {"file": "runs/other/rates.json"}}},
            "demo_keyword at 1%: rates: file 'runs/other/rates.json': no such file",
        ),
        (
            {"study": {"strategy": "oneshot", "oneshot": {"file": "nowhere/oneshot.json"}}},
            "demo_keyword at 1%: oneshot: file 'nowhere/oneshot.json': no such file",
        ),
    ],
)
def test_a_bad_suite_is_one_line_naming_the_problem(tmp_path, capsys, change, said):
    assert main(["suite", "--experiment", suite_file(tmp_path, study=change.pop("study", None), **change)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("petl-nas: error: ") and said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_task_changes_the_protocol_key_by_key(tmp_path):
    """CoLA at another K than the other tasks: its fidelity's k changes, the rest of it stays."""
    suite = Suite.load(
        suite_file(
            tmp_path,
            tasks=[
                "demo_keyword",
                {"name": "long", "task": "demo_keyword", "study": {"fidelity": {"k": None}, "trials": 2}},
            ],
        )
    )
    by_task = {task: exp for task, budget, exp in suite.experiments() if budget == "1%"}
    assert (by_task["demo_keyword"].fidelity.k, by_task["demo_keyword"].trials) == (320, 1)
    assert (by_task["long"].fidelity.k, by_task["long"].trials, by_task["long"].fidelity.epochs) == (None, 2, 5)


def test_a_task_measures_its_rates_once_at_its_largest_budget(tmp_path):
    """At 0.01% of MiniLM no family's preset fits, so nothing could be measured there: the largest
    budget's study measures them and runs first; the others read its rates.json."""
    suite = Suite.load(suite_file(tmp_path, study={"rates": "auto"}, budgets=["1%", "5%", "2%"]))
    files = {(t, b): e.rates.file for t, b, e in suite.experiments()}
    assert files[("demo_keyword", "5%")] is None and files[("colours", "5%")] is None
    assert files[("demo_keyword", "1%")] == files[("demo_keyword", "2%")] == "runs/s_demo_keyword_5pct/rates.json"
    assert files[("colours", "2%")] == "runs/s_colours_5pct/rates.json"
    assert [(t, b) for t, b, _ in suite.in_running_order()] == [
        ("demo_keyword", "5%"),
        ("demo_keyword", "1%"),
        ("demo_keyword", "2%"),
        ("colours", "5%"),
        ("colours", "1%"),
        ("colours", "2%"),
    ]
    assert Suite.load(suite_file(tmp_path, study={"rates": "auto"}, budgets=["1%", "900"])).calibrating() == "1%"
    assert all(e.rates.file is None for _, _, e in suite.__class__.load(suite_file(tmp_path)).experiments())  # off


def test_a_shared_supernet_is_trained_at_each_tasks_largest_budget_and_read_by_the_others(tmp_path):
    """``supernet: shared``: a one-shot task's largest budget proposes for its other budgets too,
    which read its oneshot.json and train no supernet (a knob search is the largest's alone);
    per_budget (the default) trains one per study."""
    shared = Suite.load(
        suite_file(
            tmp_path,
            study={"strategy": "oneshot", "oneshot": {"runs": 2}},
            budgets=["1%", "5%", "2%"],
            supernet="shared",
        )
    )
    by = {(t, b): e.oneshot for t, b, e in shared.experiments()}
    assert by[("colours", "5%")].budgets == ["1%", "2%"] and by[("colours", "5%")].file is None
    assert by[("colours", "5%")].runs == 2
    for budget in ("1%", "2%"):
        assert by[("colours", budget)].file == "runs/s_colours_5pct/oneshot.json"
        assert by[("colours", budget)].budgets is None and by[("colours", budget)].runs == 1
    assert by[("demo_keyword", "1%")].file == "runs/s_demo_keyword_5pct/oneshot.json"
    assert [(t, b) for t, b, _ in shared.in_running_order()][:1] == [("demo_keyword", "5%")]
    plain = Suite.load(suite_file(tmp_path, study={"strategy": "oneshot"}, budgets=["1%", "5%"]))
    assert all(e.oneshot.file is None and e.oneshot.budgets is None for _, _, e in plain.experiments())


def test_a_missing_suite_file_is_said():
    with pytest.raises(ConfigError, match="no such file"):
        Suite.load("nowhere.yaml")
