"""A study's calibrations are measured once: workers started at once on one study (separate
processes, as two `suite` runs or a study's workers are) claim the measurement under the study's
lock; one measures, the others wait and read its record, and ``rates.json`` equals the study's
record. A claim whose worker died is taken over."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import optuna

from petl_nas.search import claims, rates
from petl_nas.study.storage import ClaimLock, close_storage, open_storage

RECORD = {
    "rates": {"lora": 1.5e-3},
    "scales": {"lora": 2.0},
    "factor": 1.0,
    "runs": 1,
    "trials": 1,
    "cost_s": 1.0,
    "planned": 2,
    "backbone": "{}",
    "task": "demo_sentiment",
    "families": {"lora": {"prior": 5e-4, "probe": "lora", "rate": 1.5e-3, "tried": [[1.5e-3, 0.8]]}},
}


def _worker(folder: str, out) -> None:
    """One worker of study ``s``: resolve its rates, measuring (slowly) if it gets the claim."""
    from petl_nas.study.experiment import Experiment

    os.chdir(folder)
    storage = open_storage(f"sqlite:///{folder}/study.db")
    study = optuna.load_study(study_name="s", storage=storage)
    said = []

    def calibrate(*args):
        with open(f"{folder}/measured.log", "a") as log:  # each measurement, counted
            log.write(f"{os.getpid()}\n")
        time.sleep(3)
        return {**RECORD, "rates": {"lora": 1e-3 + os.getpid() * 1e-9}}

    rates.calibrate = calibrate
    rates.space_families = lambda space: ["lora"]
    exp = Experiment(name="s", backbone={}, task="demo_sentiment", heartbeat_interval=1, grace_period=30)
    record = rates.resolve(study, exp, None, None, None, said.append, lock=ClaimLock(storage, "s"))
    out.put((os.getpid(), record["rates"]["lora"], said))
    close_storage(storage)


def _study(folder) -> None:
    storage = open_storage(f"sqlite:///{folder}/study.db")
    study = optuna.create_study(study_name="s", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr(rates.SETTING, {"calibrated": True, "spread": 2.0})
    close_storage(storage)


def test_two_workers_started_at_once_measure_the_rates_once(tmp_path):
    _study(tmp_path)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_worker, args=(str(tmp_path), out)) for _ in range(2)]
    for w in workers:
        w.start()
    answers = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
    measured = (tmp_path / "measured.log").read_text().split()
    assert len(measured) == 1  # one measurement, not two
    assert answers[0][1] == answers[1][1]  # both train at one rate
    waiter = next(said for pid, _, said in answers if str(pid) not in measured)
    assert any("rates auto: another worker" in line and "waiting for its record" in line for line in waiter)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/study.db")
    record = study.user_attrs[rates.ATTR]
    assert json.loads((tmp_path / "runs" / "s" / "rates.json").read_text()) == record  # the file is the record
    assert record["rates"]["lora"] == answers[0][1]


def test_a_claim_whose_worker_died_is_taken_over():
    study = optuna.create_study(directions=["maximize", "minimize"])
    dead = {"at": "earlier", "host": "elsewhere", "pid": 1, "beat": time.time() - 100}
    study.set_user_attr(claims.PREFIX + "x", dead)
    said = []
    record, measured = claims.once(study, None, "x", lambda: {"v": 1}, said.append, "x", 1, 30)
    assert (record, measured, said) == ({"v": 1}, True, [])
    assert study.user_attrs["x"] == {"v": 1}


def test_a_failed_measurement_releases_its_claim():
    study = optuna.create_study(directions=["maximize", "minimize"])

    def fails():
        raise RuntimeError("out of memory")

    try:
        claims.once(study, None, "x", fails, print, "x", 1, 30)
    except RuntimeError:
        pass
    assert study.user_attrs[claims.PREFIX + "x"] is None and "x" not in study.user_attrs
