"""Fault injection: a search survives its driver being killed, trials that fail, and interrupted writes.

- `petl-nas search` is killed with SIGKILL mid-trial; the same command run again keeps every
  COMPLETE trial, fails the trial the dead driver left RUNNING (its heartbeat lapsed), trains it
  again once, and ends with exactly the trials asked for.
- Trials that raise, whose loss goes NaN, or that allocate past a real memory cap (RLIMIT_AS) are
  recorded with their kind and reason; the trials after them (same process) complete.
- A process killed while it writes an export record or PETL weights leaves the old file intact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY_BACKBONE
from optuna.trial import TrialState

from petl_nas.search.study import LOST, failure_kind, is_trained
from petl_nas.study.storage import close_storage, open_storage

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def petl_nas() -> list[str]:
    script = Path(sys.executable).parent / "petl-nas"
    return [str(script)] if script.exists() else [sys.executable, "-m", "petl_nas.app.cli"]


def write_experiment(folder: Path, **changes) -> Path:
    exp = {
        "name": "reliable",
        "backbone": TINY_BACKBONE,
        "task": "demo_sentiment",
        "budget": None,
        "space": "small",
        "trials": 5,
        "presets": ["bitfit"],
        "executor": "local",
        "storage": "sqlite:///study.db",
        "fidelity": {"k": 320, "epochs": 2, "batch_size": 16, "max_length": 24, "search_dev": 64},
        "final": {"seeds": 0, "baselines": False},
        "heartbeat_interval": 1,
        "grace_period": 3,
        "stale_retries": 1,
        **changes,
    }
    path = folder / "exp.yaml"
    path.write_text(json.dumps(exp))
    return path


def trials_of(storage, name: str = "reliable"):
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


@pytest.mark.slow
def test_a_killed_driver_resumes_keeping_every_complete_trial(tmp_path):
    write_experiment(tmp_path)
    url = f"sqlite:///{tmp_path}/study.db"
    cmd = petl_nas() + ["search", "--experiment", "exp.yaml"]
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    victim, storage = None, None
    while victim is None:  # kill it while an accepted trial trains, after 2 complete
        assert driver.poll() is None and time.time() < deadline, driver.stdout.read().decode()[-3000:]
        time.sleep(0.1)
        if storage is None and (tmp_path / "study.db").exists():
            storage = open_storage(url)  # as a dashboard would: read beside the writer
        try:
            trials = trials_of(storage)
        except (KeyError, ValueError):  # no storage or no study yet
            continue
        running = [t for t in trials if t.state == TrialState.RUNNING and "petl_config" in t.user_attrs]
        if sum(t.state == TrialState.COMPLETE for t in trials) >= 2 and running:
            os.kill(driver.pid, signal.SIGKILL)
            victim = running[0].number
    driver.wait()
    close_storage(storage)
    assert driver.returncode == -signal.SIGKILL
    before = {t.number: (t.values, t.params) for t in trials_of(url) if t.state == TrialState.COMPLETE}
    assert len(before) >= 2
    assert next(t for t in trials_of(url) if t.number == victim).state == TrialState.RUNNING

    again = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = trials_of(url)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 5 == sum(is_trained(t) for t in trials)  # exactly what was asked
    assert all({t.number: (t.values, t.params) for t in complete}[n] == v for n, v in before.items())
    lost = next(t for t in trials if t.number == victim)
    assert lost.state == TrialState.FAIL and failure_kind(lost) == LOST
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == victim]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE  # retried once, same point
    assert retry[0].params == lost.params and retry[0].user_attrs.get("preset") == lost.user_attrs.get("preset")
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert [t.user_attrs.get("preset") for t in trials if is_trained(t)].count("bitfit") == 1
    assert f"{LOST} 1" in again.stdout  # the summary's count


FAULTY_SEARCH = r"""
import dataclasses, json, resource, sys
import torch
from petl_nas.search import executors
from petl_nas.study.experiment import Experiment
from petl_nas.search.driver import run_search

real = executors.run_trial
plan = {1: "raise", 2: "nan", 3: "oom"}          # by call; the calls after them train normally
calls = []

def faulty(spec, report=None, **kw):
    calls.append(spec.number)
    fault = plan.get(len(calls))
    if fault == "nan":                           # a real divergence: the loss is NaN at the 2nd step
        spec = dataclasses.replace(spec, recipe={**spec.recipe, "lr": 1e30})

    def hooked(i, metrics, last):                # inside training, after the first evaluation
        if fault == "raise":
            raise ValueError("row 17 of the user's data has no text")
        if fault == "oom":                       # 8 GiB against a cap of 1.5 GiB more than in use
            torch.empty(8 * 2**30, dtype=torch.uint8)
        report(i, metrics, last)

    return real(spec, report=hooked, **kw)

executors.run_trial = faulty
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**29, resource.getrlimit(resource.RLIMIT_AS)[1]))
summary = run_search(Experiment.load(sys.argv[1]), printer=lambda line: None)
print(json.dumps({"failures": summary.failures, "counts": summary.counts, "calls": calls}))
"""


@pytest.mark.slow
def test_failing_trials_are_recorded_by_kind_and_the_search_goes_on(tmp_path):
    exp = write_experiment(
        tmp_path,
        trials=6,
        presets="none",
        fidelity={"k": 96, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
    )
    run = subprocess.run(
        [sys.executable, "-c", FAULTY_SEARCH, str(exp)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["failures"] == {"error: ValueError": 1, "non-finite loss": 1, "out of memory": 1}
    assert out["counts"]["complete"] == 3 and len(out["calls"]) == 6
    by_number = {t.number: t for t in trials_of(f"sqlite:///{tmp_path}/study.db")}
    raised, nan, oom, *after = [by_number[n] for n in out["calls"]]
    assert raised.state == TrialState.FAIL and "row 17 of the user's data" in raised.user_attrs["fail_reason"]
    # where it was raised, for the dashboard and the trial's file: the traceback's innermost frames
    trace = raised.user_attrs["fail_traceback"]
    assert ", in hooked\n" in trace and trace.endswith("ValueError: row 17 of the user's data has no text")
    written = json.loads(next(tmp_path.rglob(f"trials/{raised.number}.json")).read_text())
    assert written["state"] == "failed" and written["traceback"] == trace
    assert nan.state == TrialState.PRUNED and nan.user_attrs["pruned_reason"].startswith("non-finite loss")
    assert nan.values is None  # never a point on the front
    assert oom.state == TrialState.FAIL and "can't allocate memory" in oom.user_attrs["fail_reason"]
    assert [t.state for t in after] == [TrialState.COMPLETE] * 3  # not poisoned by the OOM
    assert all(t.user_attrs["metrics"] for t in after)


# ---- interrupted writes ---------------------------------------------------------------------
def _killed_while_writing(write_target, patch_module, patch_name, *args) -> None:
    """Fork; in the child, make ``patch_module.patch_name`` write half its bytes and then SIGKILL the
    process, and call ``write_target(*args)``. Returns once the child is dead."""
    pid = os.fork()
    if pid == 0:  # the child never returns
        real = getattr(patch_module, patch_name)

        def half_then_die(*a, **kw):
            real(*a, **kw)
            path = next(Path(x) for x in (*a, *kw.values()) if isinstance(x, (str, Path)) and Path(x).exists())
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)

        setattr(patch_module, patch_name, half_then_die)
        try:
            write_target(*args)
        finally:
            os._exit(3)  # only if the kill did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_an_export_killed_mid_write_leaves_the_old_record(tmp_path):
    import yaml

    from petl_nas.deploy import export

    path = tmp_path / "best.yaml"
    old = {"petl_config": {"modules": [{"form": "lora", "position": "attn", "size": 4}]}, "note": "old"}
    export.write_record(old, path)
    new = {**old, "note": "new " * 5000}
    _killed_while_writing(export.write_record, Path, "write_text", new, path)
    assert yaml.safe_load(path.read_text()) == old
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["best.yaml"]


def test_weights_killed_mid_save_leave_the_old_weights(tmp_path):
    import torch

    from petl_nas.core import inject
    from petl_nas.core.config import PetlConfig
    from petl_nas.core.tiny import tiny_backbone

    config = PetlConfig.from_dict({"modules": [{"form": "lora", "position": "attn", "size": 4}]})
    model = inject.apply_petl(tiny_backbone(vocab_size=50), config)
    inject.save_petl(model, tmp_path / "run")
    saved = {k: v.clone() for k, v in inject.petl_state_dict(model).items()}
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(1.0)  # "training" changed every PETL weight
    _killed_while_writing(inject.save_petl, inject, "save_file", model, tmp_path / "run")
    reloaded = inject.load_petl(tiny_backbone(vocab_size=50), tmp_path / "run")
    assert all(torch.equal(inject.petl_state_dict(reloaded)[k], v) for k, v in saved.items())


@pytest.mark.parametrize("fail_at", ["before", "after"])
def test_atomic_write_keeps_the_old_file_when_the_writer_raises(tmp_path, fail_at):
    from petl_nas.fileio import atomic_write

    path = tmp_path / "report.html"
    path.write_text("old report")

    def writer(tmp):
        if fail_at == "after":
            Path(tmp).write_text("half a new rep")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, writer)
    assert path.read_text() == "old report" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
@pytest.mark.slow
def test_stale_running_trials_fail_and_a_trial_without_any_beat_gets_its_grace(tmp_path):
    """fail_stale on its own: a trial whose beats stopped is FAIL at once (and enqueued again when
    retries are on); one that never beat first gets a beat, so it fails only after the grace period."""
    from petl_nas.study.storage import fail_stale

    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(
        study_name="hb", storage=open_storage(url, heartbeat_interval=1, grace_period=2, retries=1)
    )
    beaten = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study._storage.record_heartbeat(beaten._trial_id)
    never = study.ask()  # RUNNING, no heartbeat at all
    time.sleep(3)
    fail_stale(study)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[beaten.number] == TrialState.FAIL and states[never.number] == TrialState.RUNNING
    lost = study.get_trials()[beaten.number].user_attrs  # said, for the dashboard and the summary
    assert lost["fail_kind"] == LOST and "no heartbeat within the grace period" in lost["fail_reason"]
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.params == beaten.params and "fail_kind" not in retry.user_attrs  # retried once, afresh
    time.sleep(3)
    fail_stale(study)
    assert study.get_trials()[never.number].state == TrialState.FAIL
