"""The study's typed header: every setting a search stores on a new study is a field of it, and a
study in an old attribute layout (written before the newer settings existed) reads as its readers
always read it."""

from __future__ import annotations

import dataclasses
import json

import optuna
from conftest import TINY_BACKBONE

from petl_nas.study.header import KEYS, StudyHeader

# Study attributes that are records of one trial or of one worker, not settings of the study.
PER_TRIAL_OR_WORKER = ("final:", "confirm:", "confirm_rows:", "confirm_test:", "session:", "claim:")


def test_every_setting_a_new_study_stores_is_a_field_of_its_header(small_study):
    _, study, _ = small_study
    attrs = study.user_attrs
    keys = {KEYS.get(f.name, f.name) for f in dataclasses.fields(StudyHeader)}
    settings = {k for k in attrs if not k.startswith(PER_TRIAL_OR_WORKER)}
    assert settings - keys == set(), "stored on the study but not in its header"
    header = StudyHeader.of(study)
    for f in dataclasses.fields(StudyHeader):
        key = KEYS.get(f.name, f.name)
        if key in attrs:
            stored = attrs[key]
            assert getattr(header, f.name) == (tuple(stored) if f.name == "objectives" else stored), f.name
    assert header.backbone_spec == TINY_BACKBONE and header.task_ref == "demo_sentiment"
    assert header.metric == "accuracy" and header.budget > 0 and header.fidelity["k"] == 160
    assert header.finished is True and header.cost_objectives == ()


def old_layout_study() -> optuna.Study:
    """A study as an early version stored it: no data seed, objectives, task spec, file fingerprints,
    rates mode, calibration, one-shot run or finished flag, and a fidelity without its later keys."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for key, value in {
        "task": "sst2",
        "metric": "accuracy",
        "backbone": json.dumps("prajjwal1/bert-tiny"),
        "budget": 1000,
        "backbone_params": 4_000_000,
        "fidelity": {"k": 500, "epochs": 3},
        "space_name": "unified",
        "baseline": {"what": "majority class", "score": 0.51, "metric": "accuracy"},
    }.items():
        study.set_user_attr(key, value)
    return study


def test_an_old_layout_study_reads_as_its_readers_always_read_it():
    header = StudyHeader.of(old_layout_study())
    assert header.task == "sst2" and header.task_ref == "sst2"  # no task spec: the name resolves
    assert header.backbone_spec == "prajjwal1/bert-tiny" and header.backbone_params == 4_000_000
    assert header.fidelity == {"k": 500, "epochs": 3} and header.final == {}
    assert header.data_seed == 111  # what export and retiming read for a study without one
    assert header.objectives == ("score", "params") and header.cost_objectives == ()
    assert header.rates_mode is None and header.rate_calibration is None  # one rate per trial
    assert header.fidelity_calibration is None and header.oneshot is None and header.warm_start is None
    assert header.finished is None  # `run_state` then reads its recorded runs
    assert header.space_hash is None and header.space_version is None and header.task_files is None


def test_an_empty_study_has_every_default():
    assert StudyHeader.of(optuna.create_study()) == StudyHeader()


def test_a_stored_false_or_empty_value_is_kept_not_replaced_by_a_default():
    header = StudyHeader.from_attrs({"finished": False, "fidelity": {}, "objectives": ["score", "params", "latency"]})
    assert header.finished is False and header.fidelity == {} and header.cost_objectives == ("latency",)
