"""``rates.json``: checked by the one validation dialect before a study is made (a rate or scale
out of its range is one line naming the file and key), the printed rate is the rate trained, and
the file is the study's own record: written again when it is lost or edited."""

from __future__ import annotations

import json

import optuna
import pytest

from petl_nas.errors import ConfigError
from petl_nas.search import rates
from petl_nas.search.rates_file import check_record
from petl_nas.study.experiment import Experiment

BACKBONE = {"tiny": {}}
RECORD = {
    "rates": {"lora": 1.5e-3, "adapter": 9e-4},
    "scales": {"lora": 2.0, "adapter": 1.0},
    "factor": 3.0,
    "runs": 2,
    "trials": 4,
    "cost_s": 60.0,
    "planned": 8,
    "backbone": json.dumps(BACKBONE),
    "task": "demo_sentiment",
    "families": {
        "lora": {"prior": 5e-4, "probe": "lora", "rate": 1.5e-3, "tried": [[1.5e-3, 0.8]]},
        "adapter": {"prior": 1e-4, "probe": "pfeiffer", "rate": 9e-4, "tried": [[9e-4, 0.8]]},
    },
}


@pytest.mark.parametrize(
    "change, said",
    [
        ({"rates": {"lora": 1e9}}, "r.json: rates.lora: expected a number above 0 and at most 1, got 1000000000.0"),
        ({"rates": {"lora": -1e-3}}, "r.json: rates.lora: expected a number above 0 and at most 1, got -0.001"),
        ({"rates": {"lora": float("nan")}}, "r.json: rates.lora: expected a number above 0 and at most 1, got nan"),
        ({"rates": {"lora": "fast"}}, "r.json: rates.lora: expected a number above 0 and at most 1, got 'fast'"),
        ({"scales": {"lora": 1e6}}, "r.json: scales.lora: expected a number above 0 and at most 1000, got 1000000.0"),
        ({"scales": {"lora": 0}}, "r.json: scales.lora: expected a number above 0 and at most 1000, got 0"),
        ({"scales": [2.0]}, "r.json: scales: expected a mapping of family to scale"),
        ({"rates": {}}, "not a rates file (no rates of families in it)"),
    ],
)
def test_a_rate_or_scale_out_of_its_range_is_one_line_naming_the_file_and_key(tmp_path, change, said):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**RECORD, **change}))
    with pytest.raises(ConfigError) as raised:
        rates.read_file(str(path), Experiment(backbone=BACKBONE, task="demo_sentiment"))
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_sound_record_passes():
    check_record(RECORD, "r.json")


def test_the_printed_rate_is_the_rate_trained():
    """A record whose families say another rate than its rates (a hand-edited file) prints the rate
    each family trains at: ``rates``."""
    edited = {**RECORD, "rates": {**RECORD["rates"], "lora": 0.5}}
    assert rates.lines(edited)[2].split()[:3] == ["lora", "5.0e-01", "measured"]


def _study_with_record(record: dict):
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(rates.SETTING, {"calibrated": True, "spread": 2.0})
    study.set_user_attr(rates.ATTR, record)
    return study


def test_a_lost_or_edited_rates_file_is_written_again_from_the_studys_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = Experiment(name="s", backbone=BACKBONE, task="demo_sentiment")
    study = _study_with_record(RECORD)
    path = exp.run_dir / "rates.json"
    said = []
    assert rates.resolve(study, exp, None, None, None, said.append) == RECORD
    assert said[0] == f"rates: {path} was missing; written again from its record"
    assert json.loads(path.read_text()) == RECORD
    said.clear()
    rates.resolve(study, exp, None, None, None, said.append)
    assert not any(line.startswith(f"rates: {path}") for line in said)  # it holds the record: quiet
    path.write_text(json.dumps({**RECORD, "rates": {"lora": 1e-2, "adapter": 9e-4}}))
    said.clear()
    rates.resolve(study, exp, None, None, None, said.append)
    assert said[0] == f"rates: {path} differed from the study; written again from its record"
    assert json.loads(path.read_text()) == RECORD


def test_a_record_read_from_another_studys_file_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = Experiment(name="s", backbone=BACKBONE, task="demo_sentiment")
    rates.resolve(
        _study_with_record({**RECORD, "source": "runs/other/rates.json"}), exp, None, None, None, lambda line: None
    )
    assert not (tmp_path / "runs").exists()


def test_the_first_worker_to_store_its_record_is_the_one_every_worker_trains_at(tmp_path, monkeypatch):
    """Two workers calibrating at once: the second finds the first's record stored and keeps it, and
    the file it writes is that record, not its own measurement."""
    monkeypatch.chdir(tmp_path)
    exp = Experiment(name="s", backbone=BACKBONE, task="demo_sentiment")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(rates.SETTING, {"calibrated": True, "spread": 2.0})
    other = {**RECORD, "rates": {"lora": 3e-3, "adapter": 9e-4}}

    def calibrate(*args):  # while this worker measured, another stored its record
        study.set_user_attr(rates.ATTR, other)
        return RECORD

    monkeypatch.setattr(rates, "calibrate", calibrate)
    monkeypatch.setattr(rates, "space_families", lambda space: ["lora", "adapter"])
    monkeypatch.setattr(rates, "allowance", lambda runs, share: 4)
    assert rates.resolve(study, exp, None, None, None, lambda line: None) == other
    assert json.loads((exp.run_dir / "rates.json").read_text()) == other
