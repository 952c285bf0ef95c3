"""petl-nas suite --jobs N: studies side by side, each in a process of its own; a study that reads
another's rates starts once they are written; a failed study is named and the others kept; a stop
is passed on, and the same command goes on without training anything twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from test_suite import in_tmp, suite_file  # noqa: F401  (in_tmp: every test in its own folder)

from petl_nas.app.cli import main
from petl_nas.study.experiment import Experiment
from petl_nas.study.records import RATE_CALIBRATION
from petl_nas.suite.config import Suite, files_read
from petl_nas.suite.jobs import ready, with_share_of_cores


def stored(exp) -> tuple:
    """What a study holds: its trials' numbers, values and states, and its confirmation and finals."""
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    return (
        [(t.number, t.values, t.state.name) for t in study.trials],
        {k: v for k, v in study.user_attrs.items() if k.startswith(("final:", "confirm:"))},
    )


def test_a_study_waits_for_the_files_another_study_of_the_suite_writes(tmp_path):
    suite = Suite.load(suite_file(tmp_path, study={"rates": "auto"}))
    studies = suite.in_running_order()
    by = {(t, b): e for t, b, e in studies}
    assert files_read(by["colours", "5%"], studies) == []  # it measures the rates
    assert [str(p) for p in files_read(by["colours", "1%"], studies)] == ["runs/s_colours_5pct/rates.json"]
    plain = Suite.load(suite_file(tmp_path)).in_running_order()  # rates off: nothing to wait for
    assert all(files_read(e, plain) == [] for _, _, e in plain)


def test_a_file_is_ready_once_its_study_holds_what_it_wrote_not_when_left_from_before(tmp_path):
    writer = Experiment.from_dict({"name": "w"})
    path = writer.run_dir / "rates.json"
    assert not ready(path, writer)  # not written
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    assert not ready(path, writer)  # left from before: no study
    study = optuna.create_study(study_name="w", storage=writer.storage_url)
    assert not ready(path, writer)  # a study made again, not measured yet
    study.set_user_attr(RATE_CALIBRATION, {"rates": {"lora": 1e-3}})
    assert ready(path, writer)


def test_each_study_side_by_side_trains_at_most_its_share_of_the_cores():
    ray = Experiment.from_dict({"executor": "ray"})
    assert with_share_of_cores(ray, jobs=3, cores=16).concurrent == 5
    assert with_share_of_cores(ray, jobs=4, cores=2).concurrent == 1
    assert with_share_of_cores(ray, jobs=1, cores=16) is ray  # alone: as it was
    for own in ({"executor": "local"}, {"executor": "ray", "concurrent": 6}, {"executor": "ray", "ray_address": "h:1"}):
        exp = Experiment.from_dict(own)
        assert with_share_of_cores(exp, jobs=3, cores=16) is exp


@pytest.mark.parametrize("jobs", ["0", "two"])
def test_jobs_below_one_is_one_line(jobs, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["suite", "--experiment", "suite.yaml", "--jobs", jobs])
    assert stop.value.code == 2 and "--jobs: expected a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_studies_side_by_side_record_what_they_record_one_after_another(tmp_path, capfd):
    """Two tasks' studies at once (rates measured by each task's 5% study and read by its 1%), then
    the same suite one after another in another folder: every study holds the same trials, scores,
    confirmations and finals, and the table the same cells."""
    here = tmp_path / "side"
    here.mkdir()
    os.chdir(here)
    assert main(["suite", "--experiment", suite_file(here, study={"rates": "auto"}), "--jobs", "3"]) == 0
    out = capfd.readouterr().out
    started = [
        line.split(", study")[0] for line in out.splitlines() if line.startswith("suite s: ") and "started" in line
    ]
    assert sorted(started) == sorted(
        f"suite s: {t} at budget {b}" for t in ("demo_keyword", "colours") for b in ("1%", "5%")
    )
    assert started[:2] == ["suite s: demo_keyword at budget 5%", "suite s: colours at budget 5%"]  # 1%: after rates
    assert "[colours 1%] rates: from " in out and "[demo_keyword 5%] rates auto: measuring" in out
    side = {e.study_name: stored(e) for _, _, e in Suite.load(suite_file(here, study={"rates": "auto"})).experiments()}
    cells = json.loads((here / "runs" / "s" / "suite.json").read_text())["cells"]

    there = tmp_path / "after"
    there.mkdir()
    os.chdir(there)
    assert main(["suite", "--experiment", suite_file(there, study={"rates": "auto"})]) == 0
    suite = Suite.load(suite_file(there, study={"rates": "auto"}))
    assert {e.study_name: stored(e) for _, _, e in suite.experiments()} == side
    after = json.loads((there / "runs" / "s" / "suite.json").read_text())["cells"]
    keep = ("task", "budget", "pick", "baseline", "delta")
    assert [{k: c[k] for k in keep} for c in after] == [{k: c[k] for k in keep} for c in cells]


@pytest.mark.slow
def test_a_failed_study_is_named_and_the_others_finish(tmp_path, capfd):
    """A study that fails once it runs (its inputs pass the suite's check: here its storage already
    holds a study of that name made with another space, which only opening it finds)."""
    path = suite_file(tmp_path, budgets=["5%"])  # demo_keyword, then colours
    for label, _, exp in Suite.load(path).experiments():
        if label == "colours":
            os.makedirs(exp.run_dir, exist_ok=True)
            optuna.create_study(study_name=exp.study_name, storage=exp.storage_url).set_user_attr("space_hash", "0")
    assert main(["suite", "--experiment", path, "--jobs", "2"]) == 2
    err = capfd.readouterr().err
    assert "[colours 5%] petl-nas: error: " in err and "was made with another space" in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "petl-nas: error: suite s: 1 of 2 studies failed: colours at 5% (exit status 2) (the lines above say why"
        )
    )
    cells = json.loads((tmp_path / "runs" / "s" / "suite.json").read_text())["cells"]
    assert [c["task"] for c in cells if c.get("pick")] == ["demo_keyword"]  # the other one finished


@pytest.mark.slow
def test_a_stopped_suite_of_studies_side_by_side_goes_on_and_trains_nothing_twice(tmp_path):
    path = suite_file(tmp_path, study={"trials": 3})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "petl_nas.app.cli", "suite", "--experiment", path, "--jobs", "2"]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    suite = Suite.load(path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # stop once a study has a trial finished
        if any(_complete(e) for _, _, e in suite.experiments()):
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGTERM)  # to the whole group, as `timeout` and a terminal do
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err
    assert "petl-nas: interrupted; the suite's studies are kept" in err
    # each study that was running its search (it had printed a line) said once that it stopped; one
    # started a moment before the stop may still have been loading Python, with nothing to keep
    searching = {line[1 : line.index("] ")] for line in out.splitlines() if line.startswith("[")}
    ended = {
        line.removeprefix("suite s: ").removesuffix(" finished").replace(" at budget ", " ")
        for line in out.splitlines()
        if line.endswith(" finished")
    }
    stopped = [line for line in err.splitlines() if line.endswith("] petl-nas: interrupted; the study is kept")]
    assert sorted(line[1 : line.index("] ")] for line in stopped) == sorted(searching - ended) and stopped
    kept = {
        e.study_name: [(t.number, tuple(t.values)) for t in _trials(e) if t.state.name == "COMPLETE"]
        for _, _, e in suite.experiments()
    }
    assert sum(map(len, kept.values())) >= 1

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr
    for _, _, e in suite.experiments():
        done = [t for t in _trials(e) if t.state.name == "COMPLETE"]
        assert set(kept[e.study_name]) <= {(t.number, tuple(t.values)) for t in done}  # nothing lost
        before = {
            (t.user_attrs["config_text"], json.dumps(t.user_attrs["recipe"]))
            for t in done
            if (t.number, tuple(t.values)) in set(kept[e.study_name])
        }
        after = [
            (t.user_attrs["config_text"], json.dumps(t.user_attrs["recipe"]))
            for t in done
            if (t.number, tuple(t.values)) not in set(kept[e.study_name])
        ]
        assert not before & set(after)  # nothing finished trained again


def _trials(exp):
    """The study's trials; none where it is not made yet (or being made)."""
    if not (exp.run_dir / "study.db").exists():
        return []
    try:
        return optuna.load_study(study_name=exp.study_name, storage=exp.storage_url).trials
    except Exception:  # noqa: BLE001 (its tables being made)
        return []


def _complete(exp) -> bool:
    return any(t.state.name == "COMPLETE" for t in _trials(exp))


def test_the_executor_given_on_the_command_line_runs_every_study(tmp_path, monkeypatch):
    from petl_nas.search import driver

    ran = []
    monkeypatch.setattr(driver, "run_search", lambda exp, printer=None: ran.append((exp.study_name, exp.executor)))
    tasks = ["demo_keyword", {"name": "own", "task": "demo_keyword", "study": {"executor": "ray", "trials": 2}}]
    assert (
        main(
            [
                "suite",
                "--experiment",
                suite_file(tmp_path, study={"executor": "ray"}, tasks=tasks),
                "--executor",
                "local",
            ]
        )
        == 0
    )
    assert sorted(ran) == [
        ("s_demo_keyword_1pct", "local"),
        ("s_demo_keyword_5pct", "local"),
        ("s_own_1pct", "local"),
        ("s_own_5pct", "local"),
    ]
