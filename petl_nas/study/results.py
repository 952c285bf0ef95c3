"""What a worker returns for one trained trial (`TrialResult`), and which of it a study keeps.

`worker.run_trial` builds it; it crosses Ray as `to_dict` (plain values: Ray pickles the report)
and comes back through `from_dict`; `executors.Recorder` stores `attributes()` as the trial's
Optuna user attributes, and `study.records.StoredTrial` reads them back under the same names. The
calibration record keeps whole results (`to_dict` without the history) so that a trial of the same
spec is recorded from one instead of being trained again.

Example:
    >>> r = TrialResult(score=0.8, score_se=0.02, metric="accuracy", latency_ms=3.5)
    >>> TrialResult.from_dict(r.to_dict()) == r
    True
    >>> r.attributes()["latency_ms"]
    3.5
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

# Where-present fields: left out of `to_dict` (and so of the trial's attributes) when None, as a
# worker on a CPU reports no GPU memory, a run without frozen-layer reuse no `frozen`, a local
# trial no Ray node.
_WHEN_PRESENT = (
    "gpu_reserved_mb",
    "gpu_total_mb",
    "frozen",
    "graphs",
    "node",
    "gpu_share",
    "reused",
    "threads",
    "rows",
    "test_run",
)
# Not stored on the trial: the score is its first objective value, the history is in the trial's
# file, the metric and the card's size are the study's.
_NOT_STORED = ("score", "history", "metric", "gpu_total_mb")
# Dict-valued: Ray Tune flattens a reported result's nested dicts ("metrics/accuracy") before its
# searcher sees them, so across Tune these travel as JSON text (`to_report`, `from_report`).
_NESTED = ("metrics", "frozen", "graphs", "test_run")


@dataclass(frozen=True)
class TrialResult:
    """One trained trial, as plain values.

    Attributes:
        score: the search score: the last evaluation's main metric, or the best one
            (``fidelity.score``).
        score_se: its standard error (None for a metric without one).
        pooling: the pooling the trial's head used (what ``auto`` chose on the backbone).
        last_score, best_score: the main metric at the last evaluation and at the best one.
        metrics: every metric at the scored evaluation; history: every evaluation's metrics.
        steps, train_s, setup_s, wall_s: optimiser steps; training, set-up and whole-trial seconds.
        peak_mem_mb, train_step_ms, latency_ms: the costs `training.costs` measures.
        metric: the task's main metric; epochs, k: the recipe's length and training rows.
        gpu_reserved_mb, gpu_total_mb: what the worker's process held on its GPU, and the card's size
            (`search.packing`); None on a CPU.
        frozen, graphs: what frozen-layer reuse and CUDA graphs did, where they applied.
        node, gpu_share: where Ray ran it and the GPU share it was granted (the executor adds them).
        reused: set when the result is an earlier run's of the same spec (``calibration``).
        threads: the CPU threads the run trained with (`training.threads`).
        rows: the scored evaluation's per-row predictions on search-dev
            (`petl_nas.tasks.significance.encode_rows`), for confirmation's bootstrap over rows;
            None on the test split and for generation.
        test_run: where the run trained exactly as a final run would (`search.specs.final_twin`),
            that final run's recipe, K and the test split's metrics after the last step, for the
            final re-evaluation to read instead of training it again; nothing else reads it.
    """

    score: float
    score_se: float | None = None
    pooling: str | None = None
    last_score: float | None = None
    best_score: float | None = None
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    steps: int | None = None
    train_s: float | None = None
    setup_s: float | None = None
    peak_mem_mb: float | None = None
    train_step_ms: float | None = None
    latency_ms: float | None = None
    metric: str | None = None
    wall_s: float | None = None
    epochs: float | None = None
    k: int | None = None
    gpu_reserved_mb: float | None = None
    gpu_total_mb: float | None = None
    frozen: dict | None = None
    graphs: dict | None = None
    node: str | None = None
    gpu_share: float | None = None
    reused: str | None = None
    threads: int | None = None
    rows: str | None = None
    test_run: dict | None = None

    def to_dict(self) -> dict:
        """Plain values, in the order and with the keys a worker has always reported."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None or k not in _WHEN_PRESENT}

    @classmethod
    def from_dict(cls, data: dict) -> TrialResult:
        """The result in ``data``; keys it does not know (Ray's own, such as ``training_iteration``)
        are left out, and a result stored without its history (calibration's) gets an empty one."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_report(self) -> dict:
        """`to_dict` without the history, for a Ray Tune report: the dict-valued fields as JSON text,
        which Tune passes through as they are (a nested dict it would flatten, and `from_dict` then
        lose: every Ray trial stored empty metrics and no final run)."""
        return {
            k: json.dumps(v) if k in _NESTED and v is not None else v
            for k, v in self.to_dict().items()
            if k != "history"
        }

    @classmethod
    def from_report(cls, data: dict) -> TrialResult:
        """The result `to_report` sent through Tune (Tune's own keys left out, as `from_dict` does)."""
        return cls.from_dict({k: json.loads(v) if k in _NESTED and isinstance(v, str) else v for k, v in data.items()})

    def attributes(self) -> dict:
        """The trial's user attributes that this result sets (`study.records.StoredTrial` reads them)."""
        return {k: v for k, v in self.to_dict().items() if k not in _NOT_STORED}


STORED = tuple(f.name for f in dataclasses.fields(TrialResult) if f.name not in _NOT_STORED)
"""The user attributes a complete trial's result sets, by name."""

__all__ = ["TrialResult", "STORED"]
