"""The export record (`deploy/record.py`): a file an earlier version wrote reads, and writes back,
byte for byte; what a study did not store trains at the trainer's own defaults, never at numbers
typed again in export."""

from __future__ import annotations

import json

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from petl_nas.deploy.export import record
from petl_nas.deploy.record import RECORD_KEYS, ExportRecord, read_record, write_record
from petl_nas.study.experiment import Experiment, FinalEval
from petl_nas.training.loop import Recipe

# What `petl-nas export` wrote before the record was typed (a one-shot pick with its costs, a
# final length capped in steps, the trials' bf16 and length buckets), exported_at and pick included.
WRITTEN_BEFORE = """\
petl_nas_version: 0.1.0
backbone: all-MiniLM-L6-v2
task: sst2
data_dir: null
data_seed: 111
k: 1000
search_dev: 500
petl_config:
  modules:
  - form: lora
    position: attn
    size: 8
    targets:
    - q
    - v
    composition: scaled
    scale: 2.0
  pooling: mean
recipe:
  lr: 0.0012
  epochs: 10.0
  batch_size: 32
  max_length: 64
  warmup_ratio: 0.06
  weight_decay: 0.01
  max_grad_norm: 1.0
  evals_per_epoch: 1
  max_steps: 2000
  length_buckets: 8
  precision: bf16
seeds: 3
counts:
  deployable: 73728
  trainable: 74498
  pct_of_backbone: 0.3246
  backbone: 22713216
provenance:
  storage: sqlite:///runs/sst2/study.db
  study: sst2
  recipe: final
  trial: 0
  preset: null
  search_score: 0.87
  test_mean: 0.861
  test_std: 0.004
  test_n: 3
  source: oneshot
  oneshot: oneshot-0
  oneshot_budget: 80000
  costs:
    train_step_ms: 18.5
    peak_mem_mb: 310.0
    latency_ms: 4.25
  metric: accuracy
  space: unified
  space_hash: 5f0c2d1e
  exported_at: '2026-11-20T10:00:00+00:00'
  pick: best
"""


def test_a_record_written_before_reads_and_writes_back_byte_for_byte(tmp_path):
    (tmp_path / "old.yaml").write_text(WRITTEN_BEFORE)
    rec = read_record(tmp_path / "old.yaml")
    assert isinstance(rec, ExportRecord) and list(rec.to_dict()) == list(RECORD_KEYS)
    assert rec.config().modules[0].targets == ("q", "v") and rec.config().pooling == "mean"
    assert rec.training_recipe() == Recipe(
        lr=0.0012, epochs=10.0, max_length=64, max_steps=2000, length_buckets=8, precision="bf16"
    )
    assert write_record(rec, tmp_path / "again.yaml").read_text() == WRITTEN_BEFORE


def test_a_hand_written_record_leaves_out_what_it_does_not_need(tmp_path):
    """A mapping of some keys is a record too (`train_record` takes one); the rest reads as None."""
    rec = ExportRecord.of({"backbone": "b", "task": "demo_sentiment", "petl_config": {}, "recipe": {"lr": 1e-3}})
    assert (rec.data_seed, rec.seeds, rec.provenance) == (None, None, None)
    assert read_record(write_record(rec, tmp_path / "r.yaml")) == rec


def _study(attrs: dict) -> optuna.Study:
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    for key, value in {"backbone": json.dumps("b"), "task": "demo_sentiment", "metric": "accuracy", **attrs}.items():
        study.set_user_attr(key, value)
    study.add_trial(
        create_trial(
            params={"lr": 3e-3},
            distributions={"lr": FloatDistribution(1e-4, 1e-2)},
            values=[0.8, 100],
            user_attrs={"petl_config": {"modules": []}, "deployable": 100, "trainable": 100, "recipe": {"lr": 3e-3}},
        )
    )
    return study


def test_what_a_study_did_not_store_trains_at_the_trainers_defaults():
    """No fidelity or final stored: the record's recipe is `Recipe`'s, at `FinalEval`'s length, on
    the experiment's data seed with `FinalEval`'s seeds (a default changed there changes the record)."""
    study = _study({})
    rec = record(study, study.trials[0])
    assert rec.training_recipe() == Recipe(lr=3e-3, epochs=FinalEval().epochs)
    assert (rec.data_seed, rec.seeds) == (Experiment.data_seed, FinalEval().seeds)


def test_a_record_names_only_the_settings_the_study_changed():
    """How the trials ran (precision, compile, buckets, the frozen cache, CUDA graphs) is written where
    it is not `Recipe`'s default, so a study that left them alone exports the record it always did."""
    study = _study(
        {
            "fidelity": {
                "epochs": 2,
                "batch_size": 16,
                "max_length": 32,
                "precision": "auto",
                "compile": "off",
                "length_buckets": 0,
                "frozen_cache_mb": 0,
                "cuda_graphs": False,
            },
            "final": {"epochs": 4, "seeds": 2, "max_steps": None, "eval_rows": None},
        }
    )
    plain = record(study, study.trials[0]).recipe
    assert list(plain) == [
        "lr",
        "epochs",
        "batch_size",
        "max_length",
        "warmup_ratio",
        "weight_decay",
        "max_grad_norm",
        "evals_per_epoch",
    ]
    study.set_user_attr(
        "fidelity",
        {
            "epochs": 2,
            "batch_size": 16,
            "max_length": 32,
            "precision": "bf16",
            "compile": "default",
            "length_buckets": 4,
            "frozen_cache_mb": 64,
            "cuda_graphs": True,
            "max_steps": 9,
        },
    )
    changed = record(study, study.trials[0]).recipe
    assert {k: v for k, v in changed.items() if k not in plain} == {
        "length_buckets": 4,
        "frozen_cache_mb": 64,
        "precision": "bf16",
        "compile": "default",
        "cuda_graphs": True,
    }
    assert record(study, study.trials[0], recipe="search").recipe["max_steps"] == 9  # the search's length and cap
