"""Reading a study as a search wrote it: finding it in its storage by name (`load_study`), and each
trial's user attributes as one typed view (`StoredTrial`): how it was proposed, what it trains, its
counts, costs and outcome, and what the study stored about it afterwards (its final re-evaluation,
its confirmation); the study's trials counted by state and by failure (`state_counts`,
`failure_counts`). The search, warm start, retiming, export and the dashboards read trials through
here, never an attribute by its name.

Studies written by older versions lack some attributes: each field then takes the value the readers
always gave it (None, False, no scores), so an old study reads as it did.

Example:
    >>> study = load_study("sqlite:///runs/smoke/study.db")              # doctest: +SKIP
    >>> StoredTrial.of(study.best_trials[0]).config().modules              # doctest: +SKIP
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..core.config import PetlConfig
from ..errors import ConfigError
from ..training.costs import COSTS
from .storage import LOST, check_existing, redact, with_installed_driver

KNOB_STUDY_SUFFIX = ":oneshot-knobs"  # a search's supernet runs (`oneshot.knobs`), a study beside it
FINAL = "final:"  # study attribute final:<trial number>: its re-evaluation on test
CONFIRMED = "confirm:"  # study attribute confirm:<trial number>: its scores over seeds
CONFIRMED_ROWS = "confirm_rows:"  # ... confirm_rows:<trial number>: each seed's per-row predictions
CONFIRMED_TEST = "confirm_test:"  # ... confirm_test:<trial number>: the test runs of its confirmation's seeds
SEARCH_DEV_LABELS = "search_dev_labels"  # the study's search-dev labels, as `encode_rows` writes them
ONESHOT = "oneshot"  # trial attribute: the supernet run that proposed it
ONESHOT_ANCHOR = "oneshot_anchor"  # trial attribute: the baseline a one-shot proposal builds on
RATES_SETTING = "rates"  # study attribute: {calibrated, spread}: how its trials' rates are set
RATE_CALIBRATION = "rate_calibration"  # study attribute: each family's measured rate (search/rates.py)
LR_FROM_SAMPLER = "lr_from_sampler"  # trial attribute: a configuration given whole whose rate the sampler draws
FINISHED = "finished"  # study attribute: False while a run goes on, True once one ended well
SESSION = "session:"  # study attribute session:<start> <host>:<pid>: a run's seconds
INTERRUPTED = "interrupted (trained again on resume)"  # failure kinds: stopped by Ctrl-C, ...
INVALID = "invalid configuration"  # ... or drawn and refused before training


@dataclass(frozen=True)
class StoredTrial:
    """A trial's user attributes, typed (``StoredTrial.of(trial, study.user_attrs)``).

    Attributes:
        number, state, values, params: the Optuna trial's own.
        preset, sweep, oneshot, warm_start: what proposed it (``sweep`` is stored as ``baseline``:
            the LoRA rank sweep point's name); ``oneshot_budget`` the rung it was read off at;
            ``oneshot_anchor`` the baseline a one-shot proposal builds on (`derive.anchored`);
            ``lr_from_sampler``: a configuration given whole whose learning rate the sampler draws.
        petl_config: its PetlConfig as drawn (``to_dict``); pooling: what ``auto`` chose on the study's
            backbone, once trained; config_text: how the tables describe it; lr: its recipe's; lr_scale: in a
            calibrated study, the multiplier of the measured rates it trains at (`petl_nas.search.rates`).
        deployable, trainable, pct_of_backbone: its counts (set when drawn).
        score_se, last_score, best_score, did_not_learn: how it scored (`results.TrialResult`).
        train_s, peak_mem_mb, train_step_ms, latency_ms: what it measured.
        rejected, fail_kind, fail_reason, pruned_reason: why it did not complete.
        final: the study's re-evaluation of it on the test split (``mean``, ``std``, ``scores``, ...);
            confirmed: its search score, then one per extra seed (``final.confirm``);
            confirmed_rows: each of those runs' per-row predictions, encoded. Read from the
            study's attributes when they are given to `of`.
        rows: its own run's per-row predictions on search-dev (`results.TrialResult.rows`).
        test_runs: the test scores of its runs that trained as final runs do (its own and its
            confirmation's, `results.TrialResult.test_run`), which the final re-evaluation reads.
    """

    number: int
    state: TrialState = TrialState.RUNNING
    values: tuple | None = None
    params: dict = field(default_factory=dict)
    preset: str | None = None
    sweep: str | None = None
    oneshot: str | None = None
    oneshot_budget: int | None = None
    oneshot_anchor: str | None = None
    warm_start: str | None = None
    lr_from_sampler: bool = False
    petl_config: dict | None = None
    pooling: str | None = None
    config_text: str | None = None
    lr: float | None = None
    lr_scale: float | None = None
    deployable: int | None = None
    trainable: int | None = None
    pct_of_backbone: float | None = None
    score_se: float | None = None
    last_score: float | None = None
    best_score: float | None = None
    did_not_learn: bool = False
    train_s: float | None = None
    peak_mem_mb: float | None = None
    train_step_ms: float | None = None
    latency_ms: float | None = None
    rejected: str | None = None
    fail_kind: str | None = None
    fail_reason: str | None = None
    pruned_reason: str | None = None
    final: dict | None = None
    confirmed: list | None = None
    confirmed_rows: list | None = None
    rows: str | None = None
    test_runs: tuple = ()

    @classmethod
    def of(cls, trial, study_attrs: dict | None = None) -> StoredTrial:
        """The view of ``trial`` (a FrozenTrial, or a live Trial while it is drawn); with the
        study's ``user_attrs``, its final and confirmed scores too."""
        u, attrs = trial.user_attrs, study_attrs or {}
        values, number = getattr(trial, "values", None), getattr(trial, "number", -1)
        return cls(
            number=number,
            state=getattr(trial, "state", TrialState.RUNNING),
            values=tuple(values) if values is not None else None,
            params=dict(getattr(trial, "params", {})),
            preset=u.get("preset"),
            sweep=u.get("baseline"),
            oneshot=u.get(ONESHOT),
            oneshot_budget=u.get("oneshot_budget"),
            oneshot_anchor=u.get(ONESHOT_ANCHOR),
            warm_start=u.get("warm_start"),
            lr_from_sampler=bool(u.get(LR_FROM_SAMPLER)),
            petl_config=u.get("petl_config"),
            pooling=u.get("pooling"),
            config_text=u.get("config_text"),
            lr=(u.get("recipe") or {}).get("lr"),
            lr_scale=(u.get("recipe") or {}).get("lr_scale"),
            deployable=u.get("deployable"),
            trainable=u.get("trainable"),
            pct_of_backbone=u.get("pct_of_backbone"),
            score_se=u.get("score_se"),
            last_score=u.get("last_score"),
            best_score=u.get("best_score"),
            did_not_learn=bool(u.get("did_not_learn")),
            train_s=u.get("train_s"),
            peak_mem_mb=u.get("peak_mem_mb"),
            train_step_ms=u.get("train_step_ms"),
            latency_ms=u.get("latency_ms"),
            rejected=u.get("rejected"),
            fail_kind=u.get("fail_kind"),
            fail_reason=u.get("fail_reason"),
            pruned_reason=u.get("pruned_reason"),
            final=attrs.get(FINAL + str(number)),
            confirmed=attrs.get(CONFIRMED + str(number)),
            confirmed_rows=attrs.get(CONFIRMED_ROWS + str(number)),
            rows=u.get("rows"),
            test_runs=tuple(r for r in [u.get("test_run"), *(attrs.get(CONFIRMED_TEST + str(number)) or [])] if r),
        )

    def test_run(self, recipe: dict, k: int | None) -> dict | None:
        """The test metrics of this trial's run that trained as the final run of ``recipe`` and ``k``."""
        return next((r["metrics"] for r in self.test_runs if r.get("recipe") == recipe and r.get("k") == k), None)

    @property
    def given_whole(self) -> bool:
        """Queued with its configuration and learning rate (an off-space preset, a one-shot proposal,
        the retry of a drawn trial): nothing left to sample."""
        return self.petl_config is not None and self.lr is not None

    def config_dict(self) -> dict:
        """Its PetlConfig as a dict, with the pooling ``auto`` chose on the study's backbone written
        out (what export records and retiming rebuilds)."""
        config = dict(self.petl_config)
        if config.get("pooling", "auto") == "auto" and self.pooling not in (None, "native"):
            config["pooling"] = self.pooling
        return config

    def config(self, resolved: bool = True) -> PetlConfig:
        """Its PetlConfig: with the pooling ``auto`` chose (`config_dict`), or as drawn."""
        return PetlConfig.from_dict(self.config_dict() if resolved else self.petl_config)

    def cost(self, objective: str) -> float | None:
        """What it measured of a cost objective (``latency``, ``memory``, ``step_time``), None if nothing."""
        return getattr(self, COSTS[objective][1])

    def measured_costs(self) -> dict:
        """``{attribute: value}`` of the costs it measured (`training.costs.COSTS`), in their order."""
        return {attr: getattr(self, attr) for _, attr in COSTS.values() if getattr(self, attr) is not None}

    @property
    def failure(self) -> str | None:
        """Why it failed, in a few words (None when it did not): ``out of memory``, ``non-finite
        loss``, ``error: ValueError``, ``lost: ...``, ``invalid configuration``..."""
        if self.state == TrialState.FAIL:
            if self.fail_kind is not None:
                return self.fail_kind
            if not self.fail_reason:
                return LOST  # failed by a heartbeat check: the only FAIL without a reason
            return INVALID if self.fail_reason.startswith("invalid") else "error"
        if self.state == TrialState.PRUNED and str(self.pruned_reason or "").startswith("non-finite"):
            return "non-finite loss"
        return None


def stored_trials(study: optuna.Study, states=None) -> list[StoredTrial]:
    """Every trial of ``study`` (of ``states``, if given) as a `StoredTrial`, its study attributes read once."""
    attrs = study.user_attrs
    return [StoredTrial.of(t, attrs) for t in study.get_trials(deepcopy=False, states=states)]


def stored_trial(study: optuna.Study, trial) -> StoredTrial:
    """``trial`` as a `StoredTrial`, with what ``study`` stored about it since (its final and
    confirmed scores)."""
    return StoredTrial.of(trial, study.user_attrs)


def load_study(storage_url: str, study_name: str | None = None, naming: str = "--study {}") -> optuna.Study:
    """The study at ``storage_url``; the name may be left out when the storage holds exactly one
    search (a search's study of supernet runs, ``<name>:oneshot-knobs``, does not count). ``naming``:
    how the caller's user names a study, for the errors (``--study NAME``, or ``URL#NAME``)."""
    check_existing(storage_url)
    try:
        storage = optuna.storages.RDBStorage(with_installed_driver(storage_url))
        names = [s.study_name for s in storage.get_all_studies()]
    except Exception as e:  # noqa: BLE001 - any driver error
        raise ConfigError(f"storage {redact(storage_url)!r} cannot be opened: {str(e).splitlines()[0]}") from None
    if study_name is None:
        searches = [n for n in names if not n.endswith(KNOB_STUDY_SUFFIX)]
        if len(searches) != 1:
            raise ConfigError(
                f"storage {redact(storage_url)!r} holds {len(searches)} studies "
                f"({', '.join(searches) or 'none'}); name one with {naming.format('NAME')}"
            )
        study_name = searches[0]
    if study_name not in names:
        raise ConfigError(
            f"study {study_name!r} is not in {redact(storage_url)} (studies: {', '.join(names) or 'none'})"
        )
    if study_name.endswith(KNOB_STUDY_SUFFIX):  # one value per supernet run: no front, no configurations
        search = study_name[: -len(KNOB_STUDY_SUFFIX)]
        raise ConfigError(
            f"study {study_name!r} holds the supernet runs of {search!r}'s knob search, not its "
            f"trials; use {naming.format(search)}"
        )
    return optuna.load_study(study_name=study_name, storage=storage)


def record_session(study: optuna.Study, started: float) -> None:
    """Record the run of the search that began at ``started`` (``time.time()``) and ends now: its
    seconds under its own key (several workers of one study write theirs side by side). A study
    resumed three times has four (`sessions`); its wall time is their sum (`study_wall_s`). A run
    killed outright (SIGKILL, power) records nothing; Ctrl-C and errors do."""
    when = datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds")
    study.set_user_attr(f"{SESSION}{when} {socket.gethostname()}:{os.getpid()}", round(time.time() - started, 1))


def mark_finished(study: optuna.Study, done: bool) -> None:
    """Record that a run of the search starts (``done`` False) or ended well, finals included
    (True): what `run_state` reads."""
    study.set_user_attr(FINISHED, done)


def run_state(study: optuna.Study) -> str:
    """``finished`` once a run ended well and no trial runs or waits; else ``running`` (a run killed
    before it ended reads so too, until the same command goes on). A study from before
    `mark_finished` is finished once a run of it was recorded (`sessions`)."""
    if any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in study.get_trials(deepcopy=False)):
        return "running"
    done = study.user_attrs.get(FINISHED)
    return "finished" if (done if done is not None else sessions(study.user_attrs)) else "running"


def sessions(study_attrs: dict) -> list[dict]:
    """The study's recorded runs of the search, earliest first: {started, where, wall_s}."""
    out = []
    for key, seconds in study_attrs.items():
        if key.startswith(SESSION):
            started, _, where = key[len(SESSION) :].partition(" ")
            out.append({"started": started, "where": where, "wall_s": seconds})
    return sorted(out, key=lambda s: s["started"])


def study_wall_s(study_attrs: dict) -> float | None:
    """The study's wall time over its recorded runs (calibration, supernet, trials, confirmation
    and finals alike; several workers at once add up); None for a study written before runs were
    recorded."""
    runs = sessions(study_attrs)
    return sum(s["wall_s"] for s in runs) if runs else None


def trial_config(trial: FrozenTrial) -> dict:
    """The trial's PetlConfig as a dict, with the pooling ``auto`` chose on the study's backbone
    written out (`StoredTrial.config_dict`)."""
    return StoredTrial.of(trial).config_dict()


def failure_kind(t: FrozenTrial) -> str | None:
    """Why a trial failed, in a few words (None when it did not): `StoredTrial.failure`."""
    return StoredTrial.of(t).failure if t.state in (TrialState.FAIL, TrialState.PRUNED) else None


def failure_counts(study: optuna.Study) -> dict[str, int]:
    """Failed (and NaN-pruned) trials by kind, most frequent first."""
    kinds = Counter(k for t in study.get_trials(deepcopy=False) if (k := failure_kind(t)))
    return dict(kinds.most_common())


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state; over budget (``rejected``) and stopped by Ctrl-C (``interrupted``, trained
    again on resume) apart from the pruned and failed ones."""
    counts = {"complete": 0, "running": 0, "pruned": 0, "failed": 0, "interrupted": 0, "rejected": 0, "waiting": 0}
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.PRUNED and StoredTrial.of(t).rejected:
            counts["rejected"] += 1
        elif failure_kind(t) == INTERRUPTED:
            counts["interrupted"] += 1
        else:
            key = {
                TrialState.COMPLETE: "complete",
                TrialState.RUNNING: "running",
                TrialState.PRUNED: "pruned",
                TrialState.FAIL: "failed",
                TrialState.WAITING: "waiting",
            }[t.state]
            counts[key] += 1
    return counts


__all__ = [
    "StoredTrial",
    "stored_trials",
    "stored_trial",
    "load_study",
    "state_counts",
    "failure_kind",
    "failure_counts",
    "trial_config",
    "record_session",
    "sessions",
    "study_wall_s",
    "mark_finished",
    "run_state",
    "FINISHED",
    "KNOB_STUDY_SUFFIX",
    "FINAL",
    "CONFIRMED",
    "CONFIRMED_ROWS",
    "SEARCH_DEV_LABELS",
    "ONESHOT_ANCHOR",
    "ONESHOT",
    "LR_FROM_SAMPLER",
    "SESSION",
    "INTERRUPTED",
    "INVALID",
]
