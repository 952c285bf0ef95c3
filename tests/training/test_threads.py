"""CPU threads chosen, not inherited (`training.threads`): the free cores after what other processes
keep busy, at least one; ``OMP_NUM_THREADS`` wins; a cgroup quota lowers the cores; the load is
measured on the real machine (a competing process counts, this process's own work does not); every
training run and the doctor use the choice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import TINY_BACKBONE

from petl_nas import PetlConfig, apply_petl
from petl_nas.app.cli import main
from petl_nas.core.config import ModuleSpec
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.tasks.encoding import encode
from petl_nas.training import threads
from petl_nas.training.loading import TrainData, load_backbone
from petl_nas.training.loop import Recipe, train


@pytest.mark.parametrize(
    "cores, busy, want",
    [
        (2, 0.0, 2),
        (2, 0.3, 2),
        (2, 0.5, 1),
        (2, 1.0, 1),
        (2, 1.9, 1),
        (2, 6.0, 1),
        (8, 2.2, 6),
        (8, 0.0, 8),
        (1, 0.0, 1),
    ],
)
def test_the_free_cores_at_least_one(cores, busy, want):
    choice = threads.choose(cores=cores, busy=busy, env={})
    assert choice.threads == want
    assert f"{cores} usable core" in choice.reason and f"{busy:.1f} kept busy" in choice.reason


def test_the_environment_wins_and_an_unknown_load_takes_every_core():
    assert threads.choose(cores=2, busy=2.0, env={"OMP_NUM_THREADS": "3"}).threads == 3
    assert threads.choose(cores=2, busy=2.0, env={"OMP_NUM_THREADS": "x"}).threads == 1  # not a count: ignored
    unknown = threads.choose(cores=4, busy=None, env={})
    assert unknown.threads == 4 and "not known" in unknown.reason


@pytest.mark.parametrize(
    "files, want",
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_a_cgroup_quota_is_read_in_both_versions(tmp_path, files, want):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads._quota_cores(tmp_path) == want


def test_a_quota_below_the_affinity_lowers_the_cores(monkeypatch):
    monkeypatch.setattr(threads, "_affinity", lambda: set(range(16)))
    monkeypatch.setattr(threads, "_quota_cores", lambda root=threads.CGROUP: 2.5)
    assert threads.usable_cores() == (3, True)
    monkeypatch.setattr(threads, "_quota_cores", lambda root=threads.CGROUP: None)
    assert threads.usable_cores() == (16, False)


SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def _spin_elsewhere() -> int:
    """A spinning process outside this one's tree: started by a child that exits at once, so that
    it is handed to init. Its pid."""
    starter = (
        f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {SPIN.format(seconds=30)!r}], "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)"
    )
    return int(subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True).stdout)


# A child that starts a spinning grandchild and reaps it unseen (SIGCHLD ignored, as Ray's raylet
# does with its workers): the grandchild's CPU time leaves the process table with it.
TREE = """
import pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
touch = "import pathlib, sys\\npathlib.Path(sys.argv[1]).touch()\\n"
subprocess.Popen([sys.executable, "-c", touch + {spin!r}, sys.argv[1]])
time.sleep(30)
"""


def _tree(started, seconds: float):
    child = subprocess.Popen(
        [sys.executable, "-c", TREE.format(spin=SPIN.format(seconds=seconds)), str(started)], start_new_session=True
    )
    deadline = time.time() + 30
    while not started.exists() and time.time() < deadline:
        time.sleep(0.02)
    return child


def _kill_tree(child) -> None:
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions and process groups")
def test_a_competing_process_counts_and_this_ones_own_work_does_not():
    spinner = _spin_elsewhere()
    try:
        time.sleep(0.5)
        assert threads.busy_elsewhere(1.0) >= 0.7  # one core spun by another process
    finally:
        os.kill(spinner, signal.SIGKILL)
    time.sleep(0.3)
    quiet = threads.busy_elsewhere(1.0)  # whatever else this machine runs now
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    own = threading.Thread(target=spin)
    own.start()
    try:
        mine = threads.busy_elsewhere(1.0)  # this process spins a core: not "elsewhere"
    finally:
        stop.set()
        own.join()
    assert mine < quiet + 0.5


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions and process groups")
def test_the_processes_this_one_started_are_its_own_not_elsewhere(tmp_path):
    quiet = threads.busy_elsewhere(1.0)
    child = _tree(tmp_path / "started", 30)  # a grandchild spins a core
    try:
        time.sleep(0.3)
        assert threads.busy_elsewhere(1.0) < quiet + 0.5  # a search's own Ray is not another job
    finally:
        _kill_tree(child)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions and process groups")
def test_a_window_in_which_a_process_of_ours_ends_is_sampled_again(tmp_path, monkeypatch):
    child = _tree(tmp_path / "started", 0.5)  # it spins 0.5 s into a 1.5 s window, then ends
    try:
        busy, lost = threads._sample_busy(1.5)  # its CPU time went with it: not to be trusted
        assert lost
    finally:
        _kill_tree(child)
    windows = iter([(1.0, True), (0.0, False), (1.0, False)])
    monkeypatch.setattr(threads, "_sample_busy", lambda window: next(windows))
    assert threads.busy_elsewhere(0.1) == 0.0  # the next window, where nothing ended


def test_every_training_run_applies_the_choice(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_kept", None)
    monkeypatch.setattr(threads, "usable_cores", lambda: (2, False))
    monkeypatch.setattr(threads, "busy_elsewhere", lambda window=threads.SAMPLE_S: 1.2)
    task = resolve_task("demo_keyword")
    splits = load_splits(task, k=32, data_seed=1, search_dev_size=16)
    base, tok = load_backbone(TINY_BACKBONE, task, splits)
    encoded = encode(splits, tok, max_length=16)
    model = apply_petl(base, PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=2),)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = train(
            model, TrainData(encoded.train, encoded.search_dev), task, Recipe(lr=1e-3, epochs=1, batch_size=16)
        )
        assert result.threads == 1 and torch.get_num_threads() == 1
        monkeypatch.setattr(threads, "busy_elsewhere", lambda window=threads.SAMPLE_S: 0.0)
        assert threads.use_threads().threads == 1  # kept for a minute: no new sample
        monkeypatch.setattr(threads, "_kept", None)
        assert threads.use_threads().threads == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_doctor_says_what_it_chose_and_why(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda window=threads.SAMPLE_S: 0.0)
    main(["doctor"])
    line = next(x for x in capsys.readouterr().out.splitlines() if " cpu threads " in x)
    cores = threads.usable_cores()[0]
    assert f" {cores} for a process that trains or predicts now ({cores} usable core" in line
