"""The study's settings and study-wide records, typed: `StudyHeader.of(study)` reads what a search
stored in the study's user attributes when it made the study (its space, backbone, task, budget,
fidelity, final recipe, objectives, trivial baseline...) and what it recorded about the study as a
whole since (the calibrated trial length, the rates mode and measured rates, the supernet run, the
warm start, whether a run finished, its recorded runs). Every module outside `petl_nas.study` reads them here, never an
attribute by its name.

A study written by an older version lacks some attributes: each field then takes the value its
readers always gave it (None, an empty mapping, data seed 111, objectives ``score, params``), so an
old study reads as it did.

Example:
    >>> header = StudyHeader.of(study)                                   # doctest: +SKIP
    >>> header.metric, header.budget, header.fidelity.get("k")           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import sessions

# The attribute a field is stored under, where it is not the field's own name.
KEYS = {"rates_mode": "rates"}


@dataclass(frozen=True)
class StudyHeader:
    """A study's settings and study-wide records (see the module docstring).

    Attributes:
        space, space_name, space_hash, space_version: the space file it was made with, its name,
            the hash a resumed study must match, and its format version.
        backbone: the backbone as stored (JSON text; `backbone_spec` decodes it); backbone_params
            its parameter count.
        task, task_spec, task_files: the task's name, as the experiment gave it (a name or a file
            task's mapping; `task_ref` is the one to resolve) and its files' fingerprints.
        metric: the score it ranks by; budget: its deployable-parameter budget (None: none).
        fidelity, final: the trials' and the final re-evaluation's settings, as stored.
        data_dir, data_seed, sampler, petl_nas_version: where its data came from, the seed that
            drew its rows, its sampler and the version that made it.
        objectives: what it minimises and maximises (``score``, ``params``, then costs).
        baseline: the trivial baseline on search-dev; input_shift: search-dev against test.
        search_dev_labels: search-dev's labels, encoded (confirmation's bootstrap reads them).
        fidelity_calibration: what ``fidelity: auto`` chose and what that cost.
        rates_mode: ``{calibrated, spread}``: how its trials' rates are set (stored as ``rates``);
            rate_calibration: each family's measured rate.
        oneshot, oneshot_started, oneshot_first_run: its supernet run, the claim on it, and a first
            run that did not learn.
        warm_start: the earlier study it was warm-started from.
        finished: False while a run goes on, True once one ended well (None before it was stored).
        sessions: its recorded runs of the search, earliest first (`records.sessions`).
    """

    space: str | None = None
    space_name: str | None = None
    space_hash: str | None = None
    space_version: Any = None
    backbone: str | None = None
    backbone_params: int | None = None
    task: str | None = None
    task_spec: Any = None
    task_files: dict | None = None
    metric: str | None = None
    budget: int | None = None
    fidelity: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)
    data_dir: str | None = None
    data_seed: int = 111
    sampler: str | None = None
    petl_nas_version: str | None = None
    objectives: tuple = ("score", "params")
    baseline: dict | None = None
    input_shift: dict | None = None
    search_dev_labels: str | None = None
    fidelity_calibration: dict | None = None
    rates_mode: dict | None = None
    rate_calibration: dict | None = None
    oneshot: dict | None = None
    oneshot_started: dict | None = None
    oneshot_first_run: dict | None = None
    warm_start: dict | None = None
    finished: bool | None = None
    sessions: tuple = ()

    @classmethod
    def of(cls, study) -> StudyHeader:
        """The header of ``study`` (an Optuna study, or anything with its ``user_attrs``, such as a
        study summary), read from its storage now."""
        return cls.from_attrs(study.user_attrs)

    @classmethod
    def from_attrs(cls, attrs: Mapping) -> StudyHeader:
        """The header a study with user attributes ``attrs`` has (also the attributes a search is
        about to store, before the study exists)."""
        values = {"sessions": tuple(sessions(attrs))}
        for f in dataclasses.fields(cls):
            if f.name in values:
                continue
            value = attrs.get(KEYS.get(f.name, f.name))
            if value is not None:
                values[f.name] = tuple(value) if f.name == "objectives" else value
        return cls(**values)

    @property
    def backbone_spec(self) -> Any:
        """The backbone as the experiment named it (a hub name, a path or a tiny spec); None when
        the study did not store it."""
        return json.loads(self.backbone) if self.backbone is not None else None

    @property
    def task_ref(self) -> Any:
        """The task to resolve: a file task's mapping where the study stored one, else its name."""
        return self.task_spec or self.task

    @property
    def wall_s(self) -> float | None:
        """Its wall time over its recorded runs (several workers at once add up); None for a study
        written before runs were recorded (`records.study_wall_s`)."""
        return sum(s["wall_s"] for s in self.sessions) if self.sessions else None

    @property
    def cost_objectives(self) -> tuple:
        """Its objectives after score and parameters: the costs it measures."""
        return self.objectives[2:]


__all__ = ["StudyHeader"]
