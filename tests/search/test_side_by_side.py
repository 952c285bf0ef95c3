"""Confirmation's and the finals' runs side by side (`petl_nas.search.side_by_side`): a pool of spawned processes
trains each run exactly as this process would at the same thread count, hands every result back
under its own run, and confirms and re-evaluates a study to the same stored scores and rows as one
after another."""

from __future__ import annotations

import dataclasses
import shutil

import optuna
import pytest
import torch
from test_search import experiment
from test_warm_worker import PROBE, _spec

from petl_nas.search import confirm, finals, side_by_side
from petl_nas.search.driver import run_search
from petl_nas.search.progress import Stage
from petl_nas.search.specs import final_recipe, trial_recipe, trial_spec
from petl_nas.search.worker import run_trial
from petl_nas.study.experiment import FinalEval
from petl_nas.study.records import StoredTrial
from petl_nas.tasks import resolve_task


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_slots_follow_the_executor_the_device_and_the_free_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # two free cores, as threads.choose reads it
    assert side_by_side.slots(6, "ray", gpu=False).runs == 2
    assert side_by_side.slots(6, "ray", gpu=False).threads == 1
    assert side_by_side.slots(1, "ray", gpu=False).runs == 1  # one run: nothing to put beside it
    assert side_by_side.slots(6, "ray", cpus_per_run=2, gpu=False).runs == 1
    assert side_by_side.slots(6, "local", gpu=False).runs == 1  # local: everything in this process
    assert side_by_side.slots(6, "ray", gpu=True).runs == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert side_by_side.slots(6, "ray", gpu=False).runs == 1
    assert side_by_side.describe(side_by_side.Slots(2, 1, "2 usable cores")).startswith("2 side by side with 1")


def test_a_stage_trained_in_this_process_sets_its_threads_from_the_free_cores(monkeypatch):
    """The final re-evaluation and confirmation train here with one slot: with torch's default of one
    thread per core inherited on a shared machine they ran 17x slower (issue 52), so the stage sets
    the choice; a stage with nothing to train leaves the threads alone."""
    from petl_nas.training import threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one free core, as threads.choose reads it
    monkeypatch.setattr(threads, "_kept", None)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert side_by_side.for_stage(0, "local").runs == 1 and torch.get_num_threads() == 3
        assert side_by_side.for_stage(4, "local").runs == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_runs_side_by_side_score_as_in_this_process_each_under_its_own_index(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    specs = [_spec(PROBE, seed=seed) for seed in (3, 4, 5)]
    here = [run_trial(spec) for spec in specs]
    assert here[0].history != here[1].history  # the seeds can be told apart
    lines = []
    got = dict(
        side_by_side.run_all(
            specs, ["a", "b", "c"], side_by_side.Slots(2, 1, "test"), Stage(lines.append, len(specs)), run_trial
        )
    )
    assert sorted(got) == [0, 1, 2]
    for i, result in got.items():
        assert (result.score, result.history, result.steps) == (here[i].score, here[i].history, here[i].steps)
        assert result.rows == here[i].rows


@pytest.mark.slow
def test_a_study_confirmed_side_by_side_stores_what_one_after_another_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread per run either way: same sums
    exp = experiment(tmp_path, trials=3, presets=["lora"])
    run_search(exp, printer=lambda *a: None)
    shutil.copy(tmp_path / "study.db", tmp_path / "pooled.db")
    final = FinalEval(seeds=0, confirm=2, confirm_seeds=2, baselines=False)
    recipe = trial_recipe(exp)

    def confirmed(storage: str, executor: str, threads: str) -> dict:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        torch.set_num_threads(1)
        run = dataclasses.replace(exp, storage=storage, executor=executor, final=final)
        study = optuna.load_study(study_name=exp.study_name, storage=storage)
        lines = []
        confirm.confirm(study, run, recipe, printer=lines.append)
        study = optuna.load_study(study_name=exp.study_name, storage=storage)
        return lines, {k: v for k, v in study.user_attrs.items() if k.startswith("confirm")}

    _, alone = confirmed(exp.storage_url, "local", "1")
    lines, pooled = confirmed(f"sqlite:///{tmp_path}/pooled.db", "ray", "2")
    assert lines[0].startswith("confirming ") and "2 side by side with 1 CPU thread(s) each" in lines[0]
    assert len([k for k in alone if k.startswith("confirm:")]) >= 2
    assert pooled == alone


@pytest.mark.slow
def test_finals_re_evaluated_side_by_side_store_what_one_after_another_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    exp = experiment(tmp_path, trials=3, presets=["lora", "bitfit"])
    run_search(exp, printer=lambda *a: None)
    shutil.copy(tmp_path / "study.db", tmp_path / "pooled.db")
    final = FinalEval(seeds=2, epochs=1, max_front=2, presets="all", confirm=0, baselines=False)

    def reevaluated(storage: str, executor: str, threads: str) -> tuple[list, dict]:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        torch.set_num_threads(1)
        run = dataclasses.replace(exp, storage=storage, executor=executor, final=final)
        study = optuna.load_study(study_name=exp.study_name, storage=storage)
        lines = []
        finals.reevaluate_front(study, run, resolve_task(exp.task), trial_recipe(exp), lines.append)
        study = optuna.load_study(study_name=exp.study_name, storage=storage)
        return lines, {k: v for k, v in study.user_attrs.items() if k.startswith("final:")}

    _, alone = reevaluated(exp.storage_url, "local", "1")
    lines, pooled = reevaluated(f"sqlite:///{tmp_path}/pooled.db", "ray", "2")
    assert lines[0].startswith("final: ") and "2 side by side with 1 CPU thread(s) each" in lines[0]
    assert len(alone) >= 2 and all(len(v["scores"]) == 2 for v in alone.values())
    assert len({tuple(v["scores"]) for v in alone.values()}) == len(alone)  # each trial its own runs
    assert pooled == alone
    first = max(alone, key=lambda key: alone[key]["mean"])  # the one that learned most: its seed 1, alone
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    t = StoredTrial.of(study.trials[int(first.split(":")[1])], study.user_attrs)
    run = dataclasses.replace(exp, final=final)
    spec = trial_spec(run, t.petl_config, final_recipe(run, trial_recipe(exp), t.lr, 1), number=t.number, final=True)
    assert alone[first]["scores"][1] == run_trial(spec).history[-1][resolve_task(exp.task).main_metric]


@pytest.mark.slow
def test_a_pool_whose_processes_cannot_start_trains_the_runs_here_and_does_not_hang(monkeypatch):
    """As under ``python -``: a spawned process cannot import the main script and dies at start."""
    import sys

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", "/nonexistent/petl-nas-main.py", raising=False)
    specs = [_spec(PROBE, seed=seed) for seed in (3, 4)]
    here = []
    lines = []
    got = dict(
        side_by_side.run_all(
            specs,
            ["a", "b"],
            side_by_side.Slots(2, 1, "test"),
            Stage(lines.append, len(specs)),
            lambda spec: here.append(spec) or run_trial(spec),
        )
    )
    assert sorted(got) == [0, 1] and len(here) == 2
    assert got[0].history != got[1].history and [s.recipe["seed"] for s in here] == [3, 4]
    assert any("ended without its result" in line for line in lines)
