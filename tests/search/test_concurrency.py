"""Several workers on one study: four `petl-nas search` processes on one SQLite file and on one
PostgreSQL study, and a two-node Ray cluster on PostgreSQL. The study ends with exactly the trials
asked for, each preset trained once, every trial trained by exactly one worker, and no worker
crashes ("database is locked" included).

PostgreSQL tests read the server's URL from PETL_NAS_TEST_POSTGRES and skip without it; each uses
a study name of its own and deletes it afterwards. The four workers are processes forked from a
forkserver that has imported petl-nas once (four interpreters importing torch at once would cost
more than the search), each running the CLI's ``main`` in a folder of its own.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import TINY_BACKBONE
from optuna.trial import TrialState

from petl_nas.search.study import is_trained
from petl_nas.study.experiment import Experiment

PG = os.environ.get("PETL_NAS_TEST_POSTGRES")
PRESETS = ["bitfit", "pfeiffer"]


def experiment(storage: str, study: str, trials: int = 10, **changes) -> dict:
    return {
        "name": "together",
        "study": study,
        "backbone": TINY_BACKBONE,
        "task": "demo_sentiment",
        "budget": None,
        "space": "small",
        "trials": trials,
        "presets": PRESETS,
        "executor": "local",
        "storage": storage,
        "fidelity": {"k": 96, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
        "final": {"seeds": 0, "baselines": False},
        "heartbeat_interval": 2,
        "grace_period": 10,
        **changes,
    }


def _worker(argv: list[str], folder: str) -> None:
    """One worker: the CLI in its own folder, its output in folder/log.txt."""
    os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    os.chdir(folder)
    fd = os.open("log.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from petl_nas.app.cli import main

    sys.exit(main(argv))


def run_workers(tmp_path: Path, exp: dict, n: int = 4) -> list[set[int]]:
    """Run ``n`` workers on ``exp`` at once; returns the trial numbers each one trained."""
    (tmp_path / "exp.yaml").write_text(json.dumps(exp))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["petl_nas.app.cli", "petl_nas.search.driver"])
    folders = [tmp_path / f"worker{i}" for i in range(n)]
    procs = []
    for folder in folders:
        folder.mkdir()
        procs.append(
            ctx.Process(target=_worker, args=(["search", "--experiment", str(tmp_path / "exp.yaml")], str(folder)))
        )
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=400)
    logs = [(f / "log.txt").read_text() for f in folders]
    for p, log in zip(procs, logs):
        assert p.exitcode == 0, log[-3000:]
        assert "locked" not in log and "Traceback" not in log, log[-3000:]
    return [
        {
            int(j.stem)
            for j in (f / "runs" / "together" / "trials").glob("*.json")
            if json.loads(j.read_text())["state"] in ("complete", "pruned", "failed")
        }
        for f in folders
    ]


def check_filled(storage, study_name: str, by_worker: list[set[int]], trials: int) -> None:
    study = optuna.load_study(study_name=study_name, storage=storage)
    everything = study.get_trials(deepcopy=False)
    trained = [t for t in everything if is_trained(t)]
    assert len(trained) == trials and all(t.state == TrialState.COMPLETE for t in trained)
    assert not [t for t in everything if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    names = [t.user_attrs.get("preset") for t in everything if t.user_attrs.get("preset")]
    assert sorted(names) == sorted(PRESETS)  # each preset claimed once
    assert sum(len(w) for w in by_worker) == trials  # every trial by one worker ...
    assert set().union(*by_worker) == {t.number for t in trained}  # ... and none by two
    assert sum(1 for w in by_worker if w) >= 2  # they really worked together


@pytest.mark.slow
def test_four_workers_fill_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path}/study.db"
    by_worker = run_workers(tmp_path, experiment(url, "together"))
    check_filled(url, "together", by_worker, trials=10)
    (tmp_path / "again").mkdir()  # run again: the study is full, nobody trains more
    assert run_workers(tmp_path / "again", experiment(url, "together"), n=2) == [set(), set()]
    check_filled(url, "together", by_worker, trials=10)


@pytest.fixture
def pg_study():
    if not PG:
        pytest.skip("PETL_NAS_TEST_POSTGRES is not set")
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        optuna.delete_study(study_name=name, storage=PG)
    except KeyError:
        pass


@pytest.mark.slow
def test_four_workers_fill_one_postgresql_study(tmp_path, pg_study):
    by_worker = run_workers(tmp_path, experiment(PG, pg_study))
    check_filled(PG, pg_study, by_worker, trials=10)


@pytest.mark.slow
def test_a_two_node_ray_cluster_fills_a_postgresql_study(tmp_path, monkeypatch, pg_study):
    """The driver (and the study's writes) on the head node; every trial on the other node.

    Placement is made deterministic by resources, not timing: the head has no CPU, so Ray can place
    a trial (1 CPU) only on the worker node, whose 2 CPUs run two trials at a time. Results travel
    from the worker node's actors back to the driver, which writes them to PostgreSQL.
    """
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.chdir(tmp_path)
    ray.shutdown()  # an earlier search of this process may have left its own Ray
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        head_id, worker_id = cluster.head_node.node_id[:8], worker.node_id[:8]
        exp = Experiment.from_dict(
            experiment(
                PG,
                pg_study,
                trials=6,
                executor="ray",
                ray_address=cluster.address,
                scheduler="fifo",
                fidelity={"k": 96, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
            ),
            "cluster.yaml",
        )
        summary = run_search(exp, printer=lambda line: None)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert summary.counts["complete"] == 6
    study = optuna.load_study(study_name=pg_study, storage=PG)
    trained = [t for t in study.trials if is_trained(t)]
    assert len(trained) == 6 and sorted(t.user_attrs.get("preset") or "" for t in trained)[-2:] == sorted(PRESETS)
    nodes = {t.user_attrs["node"].rsplit("/", 1)[1] for t in trained}
    assert head_id != worker_id and nodes == {worker_id}  # all on the node with the CPUs


@pytest.mark.slow
def test_two_workers_share_a_knob_search_each_run_trained_once(tmp_path):
    """Two workers on a study with ``oneshot.runs: 3``: every supernet run is claimed by one worker
    (none trains a run the other is training), a worker left without a run waits for the other's,
    and the chosen run's proposals are enqueued once."""
    import re

    url = f"sqlite:///{tmp_path}/study.db"
    exp = experiment(
        url,
        "together",
        trials=1,
        budget="5%",
        task="demo_keyword",
        presets="none",
        strategy="oneshot",
        oneshot={"rungs": 2, "lr": 3e-3, "epochs": 1, "runs": 3, "search": {"lr": [1e-3, 1e-2]}},
    )
    run_workers(tmp_path, exp, n=2)
    logs = [(tmp_path / f"worker{i}" / "log.txt").read_text() for i in range(2)]
    trained = [int(n) for log in logs for n in re.findall(r"one-shot knobs: run (\d+) \(", log)]
    assert sorted(trained) == [0, 1, 2]  # each run by exactly one worker
    # the second worker joins the first's search: no run was lost, so no attempt is a second one
    assert sum("joining the knob search another worker" in log for log in logs) == 1
    assert not any("left no result" in log for log in logs)
    knobs = optuna.load_study(study_name="together:oneshot-knobs", storage=url).trials
    assert [t.state for t in knobs] == [TrialState.COMPLETE] * 3
    study = optuna.load_study(study_name="together", storage=url)
    record = study.user_attrs["oneshot"]
    assert len(record["knob_search"]["runs"]) == 3 and record["attempts"] == 1  # chosen once all three ended
    proposals = [t for t in study.trials if t.user_attrs.get("oneshot")]
    assert len(proposals) == len(record["proposed"]) and all(t.state == TrialState.COMPLETE for t in proposals)


def test_a_postgresql_password_is_never_printed_or_written(tmp_path, monkeypatch, capsys, pg_study):
    """search's lines, export's record (and so train's metrics.json) and export's errors show the
    URL with its password hidden."""
    import yaml

    from petl_nas.app.cli import main
    from petl_nas.study.storage import redact

    monkeypatch.chdir(tmp_path)
    secret = PG.split("//", 1)[1].split("@", 1)[0]  # user:password
    (tmp_path / "e.yaml").write_text(json.dumps(experiment(PG, pg_study, trials=1, presets=["bitfit"])))
    assert main(["search", "--experiment", "e.yaml"]) == 0
    assert main(["export", "--storage", PG, "--study", pg_study, "--preset", "bitfit", "-o", "best.yaml"]) == 0
    assert main(["export", "--storage", PG, "--study", "no-such-study", "-o", "x.yaml"]) == 2
    out = capsys.readouterr()
    assert secret not in out.out + out.err and redact(PG) in out.out
    record = (tmp_path / "best.yaml").read_text()
    assert secret not in record and yaml.safe_load(record)["provenance"]["storage"] == redact(PG)


def test_a_search_for_another_ray_than_the_one_this_process_holds_is_refused(tmp_path, monkeypatch):
    """A second search in one Python session, for a cluster, while the first's own Ray is still
    connected: one line before any study exists, never trials silently run on the first Ray."""
    ray = pytest.importorskip("ray")
    import socket

    from petl_nas.errors import ConfigError
    from petl_nas.search.driver import run_search
    from petl_nas.search.executors import init_ray

    monkeypatch.chdir(tmp_path)
    listening = socket.create_server(("127.0.0.1", 0))  # something answers at the cluster's address
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    init_ray()
    try:
        exp = Experiment.from_dict(
            experiment(f"sqlite:///{tmp_path}/s.db", "other", trials=1, executor="ray", ray_address=address), "e.yaml"
        )
        with pytest.raises(
            ConfigError,
            match=rf"ray_address '{address}': this process is already connected to "
            rf"the Ray at .*call ray.shutdown\(\) first",
        ):
            run_search(exp, printer=lambda line: None)
    finally:
        ray.shutdown()
        listening.close()
    assert not (tmp_path / "s.db").exists() or not optuna.get_all_study_names(f"sqlite:///{tmp_path}/s.db")
