"""A full disk: `petl-nas train` refuses before training when its output folder's disk cannot hold
the runs, and a write that fails anyway names the file and leaves nothing half-written.

The disk is real: a small tmpfs mounted for the test (root only; skipped where mounting is not
allowed)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid

import pytest
import yaml
from conftest import TINY_BACKBONE

from petl_nas.app.cli import main

RECORD = {
    "backbone": TINY_BACKBONE,
    "task": "demo_sentiment",
    "data_seed": 111,
    "k": 120,
    "petl_config": {"modules": [{"form": "lora", "size": 2, "scale": 2.0}]},
    "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 32, "max_length": 24},
    "seeds": 2,
}


@contextlib.contextmanager
def _tmpfs(tmp_path, size: str):
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)  # --lazy: a connection may linger


@pytest.fixture
def small_disk(tmp_path):
    """A 48 KiB tmpfs with 8 KiB left free."""
    with _tmpfs(tmp_path, "48k") as mount:
        (mount / "filler").write_bytes(b"\0" * 40 * 1024)
        yield mount


def _fill(disk) -> None:
    with open(disk / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
                f.flush()


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_train_refuses_before_training_when_the_disk_cannot_hold_the_runs(tmp_path, small_disk, capsys, monkeypatch):
    (tmp_path / "rec.yaml").write_text(yaml.safe_dump(RECORD))
    monkeypatch.setattr("petl_nas.deploy.runs.train", lambda *a, **k: pytest.fail("trained before the check"))
    rc = main(["train", "--config", str(tmp_path / "rec.yaml"), "--out", str(small_disk / "o"), "--no-progress"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and err[-1].startswith(
        f"petl-nas: error: output folder '{small_disk / 'o'}': 8 KiB free on its disk, and 2 runs need about "
    ), err
    assert err[-1].endswith("KiB; free some space or choose another --out")
    assert _files(small_disk) == ["filler"]  # the folder made for it is gone too


def test_a_write_that_fills_the_disk_names_its_file_and_leaves_no_half_file(tmp_path, small_disk, capsys, monkeypatch):
    """With the room check out of the way the disk fills while the first run is saved: one line
    naming the file, exit 2, and no empty or temporary file left under the output folder."""
    (tmp_path / "rec.yaml").write_text(yaml.safe_dump(RECORD))
    monkeypatch.setattr("petl_nas.deploy.runs._check_room", lambda *a: None)
    rc = main(["train", "--config", str(tmp_path / "rec.yaml"), "--out", str(small_disk / "o"), "--no-progress"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2, err
    assert err[-1].startswith(f"petl-nas: error: {small_disk / 'o' / 'seed_0'}/"), err
    assert err[-1].endswith(": No space left on device"), err
    left = [p for p in (small_disk / "o").rglob("*") if p.is_file()]
    assert not [p for p in left if p.stat().st_size == 0 or p.name.endswith(".tmp")], _files(small_disk)


@pytest.mark.slow
def test_a_search_whose_disk_fills_says_so_in_one_line_and_resumes_losing_nothing(tmp_path, monkeypatch, capsys):
    """The disk fills after the first trial trained: one line naming the study's file and the fix
    (Optuna alone says "e.g. exceeding max length"), exit 2; once space is freed the same command
    goes on and trains each trial once."""
    import optuna

    from petl_nas.search import executors

    with _tmpfs(tmp_path, "2m") as disk:
        exp = {
            "name": "full",
            "backbone": TINY_BACKBONE,
            "task": "demo_sentiment",
            "budget": "5%",
            "space": "small",
            "trials": 2,
            "presets": "none",
            "executor": "local",
            "storage": f"sqlite:///{disk}/study.db",
            "fidelity": {"k": 80, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
            "final": {"seeds": 0, "baselines": False},
            "heartbeat_interval": 1,
            "grace_period": 2,
        }
        (tmp_path / "e.yaml").write_text(json.dumps(exp))
        monkeypatch.chdir(tmp_path)
        real, trained = executors.run_trial, []

        def then_fill(spec, report=None):
            out = real(spec, report=report)
            trained.append(spec.number)
            _fill(disk)
            return out

        monkeypatch.setattr(executors, "run_trial", then_fill)
        rc = main(["search", "--experiment", "e.yaml"])
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and not any("Traceback" in line for line in err), err
        assert err[-1] == (
            f"petl-nas: error: {disk}/study.db: the disk is full (database or disk is full); free some "
            f"space, then run the same command again to go on (nothing finished is lost)"
        ), err
        (disk / "filler").unlink()
        monkeypatch.setattr(
            executors, "run_trial", lambda spec, report=None: trained.append(spec.number) or real(spec, report=report)
        )
        assert main(["search", "--experiment", "e.yaml"]) == 0
        study = optuna.load_study(study_name="full", storage=exp["storage"])
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
        assert len(complete) == 2 and len(failed) == 1 and len(trained) == 3, study.trials  # the lost one again
        assert failed[0].number == trained[0]
        # the lost one trained again: first or after a new draw, as its heartbeat had expired or not
        assert failed[0].params in [t.params for t in complete]
