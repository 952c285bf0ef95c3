"""The calibration runs, which are not trials, reach the Optuna dashboard as the study's note: a
table per calibration, every run's score in its cell, served by the real optuna-dashboard."""

from __future__ import annotations

import io
import json
import sys

import optuna
import pytest

from petl_nas.search import study_note
from petl_nas.study.header import StudyHeader

LENGTH = {
    "presets": ["lora", "bitfit"],
    "epochs": 2,
    "stable": True,
    "rule": "final",
    "skipped": [],
    "cost_s": 90.0,
    "final_learned": True,
    "first_learned_epochs": 2,
    "steps": [
        {
            "epochs": 1,
            "scores": {"lora": {"score": 0.61, "learned": False}, "bitfit": {"score": 0.55, "learned": False}},
        },
        {"epochs": 2, "scores": {"lora": {"score": 0.8, "learned": True}, "bitfit": {"score": 0.7, "learned": True}}},
        {"epochs": 4, "scores": {"lora": {"score": 0.81, "learned": True}, "bitfit": {"score": 0.71, "learned": True}}},
    ],
}
RATES = {
    "families": {
        "lora": {
            "prior": 5e-4,
            "probe": "lora",
            "rate": 1.5e-3,
            "edge": False,
            "tried": [[1.5e-3, 0.83], [5e-4, 0.82], [4.5e-3, float("-inf")]],
        },
        "adapter": {"prior": 1e-4, "rate": 3e-4, "why": "not measured: the share is spent"},
    },
    "factor": 3.0,
    "runs": 3,
    "trials": 24,
    "cost_s": 300.0,
}


def test_the_note_tables_every_calibration_run():
    text = study_note.markdown(StudyHeader.from_attrs({"fidelity_calibration": LENGTH, "rate_calibration": RATES}))
    lines = text.splitlines()
    assert lines[0] == study_note.HEADING
    assert "| epochs | lora | bitfit |" in lines
    assert lines[lines.index("| epochs | lora | bitfit |") + 2 :][:3] == [
        "| 1 | 0.6100 (did not learn) | 0.5500 (did not learn) |",
        "| 2 (chosen) | 0.8000 | 0.7000 |",
        "| 4 | 0.8100 | 0.7100 |",
    ]
    assert any(line.startswith("fidelity auto: 2 epochs per trial (the presets cleared") for line in lines)
    assert "| lora | 1.5e-03 | lora | 5.0e-04: 0.8200, 1.5e-03: 0.8300, 4.5e-03: diverged |" in lines
    assert (
        "| adapter | 3.0e-04 | – | not measured: the share is spent: its paper rate 1.0e-04 x 3.00, the factor "
        "measured on the others |"
    ) in lines
    assert lines[-1] == "rates: calibration took 3 runs (12% of 24 trials) and 5.0 min"
    assert (
        study_note.markdown(StudyHeader.from_attrs({"rate_calibration": RATES})).count("###") == 1
    )  # what was calibrated only
    assert study_note.markdown(StudyHeader.from_attrs({})) is None


def test_nothing_is_written_without_calibration_or_without_optuna_dashboard(monkeypatch):
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    assert not study_note.write(study)  # nothing calibrated
    study.set_user_attr("fidelity_calibration", LENGTH)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # the dashboard extra not installed
    assert not study_note.write(study)
    assert storage.get_study_system_attrs(storage.get_study_id_from_name("s")) == {}  # no note stored


def _served_note(storage_url: str) -> str:
    """The study's note as the real optuna-dashboard serves it (its WSGI app, in this process)."""
    from optuna_dashboard import wsgi

    app, status = wsgi(optuna.storages.get_storage(storage_url)), []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/api/studies/1",
        "QUERY_STRING": "",
        "SERVER_NAME": "local",
        "SERVER_PORT": "80",
        "HTTP_HOST": "local",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
    }
    body = b"".join(app(environ, lambda s, headers, exc=None: status.append(s)))
    assert status == ["200 OK"]
    return json.loads(body)["note"]["body"]


@pytest.mark.slow
def test_a_calibrated_search_shows_its_calibration_runs_on_the_dashboard(tmp_path, monkeypatch):
    pytest.importorskip("optuna_dashboard")
    from test_calibrate import experiment, scripted

    from petl_nas.search import calibrate
    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    rank = {"lora": 0.1, "parallel_adapter": 0.05, "bitfit": 0.0}
    scripted(monkeypatch, {(n, e): 0.7 + r + 0.001 * e for n, r in rank.items() for e in (1, 2, 4, 8)}, [])
    monkeypatch.setattr(calibrate, "pays", lambda *a: True)
    exp = experiment(tmp_path, trials=1)
    run_search(exp, printer=lambda line: None)
    note = _served_note(exp.storage_url).splitlines()
    assert note[0] == study_note.HEADING
    assert "| 1 (chosen) | 0.8010 | 0.7010 | 0.7510 |" in note and "| 8 | 0.8080 | 0.7080 | 0.7580 |" in note
