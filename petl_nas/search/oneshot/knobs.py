"""The supernet's knobs searched by Optuna across a handful of runs (``oneshot.runs`` > 1).

A supernet run has a few continuous knobs no configuration carries: its learning rate, the
gates' learning rate, the penalty's strength (how fast the count's multiplier rises) and the
gates' temperature (`experiment.OneShot.KNOBS`). `search` trains ``runs`` supernets, each as
`propose.py` trains one (a Ray Tune trial with the Ray executor), with the knobs an Optuna TPE
sampler draws from ``oneshot.search`` (at random until two runs have ended); the first run takes
the fixed values, so the search starts from the default it is meant to improve on. A run is
scored by the hypervolume of its proposals' *inherited* search-dev scores (each scored with the
supernet's own weights, `inherit.py`: one evaluation per proposal, no training), in the study's
coordinates: score above the trivial baseline times decades of deployable parameters up to the
budget (`fronts.hypervolume`). The best run's proposals enter the study; the others are recorded.

The runs are trials of an Optuna study of their own, ``<study>:oneshot-knobs`` in the same
storage, so the dashboard shows them and a killed search resumes: finished runs are kept, and a
run whose worker died (its heartbeat lapsed, as a trial's does) is run again with its knobs, from
the training state it saved after its last whole epoch. Several workers of one study share the
runs, each claimed by one of them under the study's lock. A run whose loss stops being finite
(knobs that diverge) is recorded as failed and the search goes on; if none succeeds, that is one
error. Any other error stops the search.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import time
import warnings
from typing import Callable

import optuna
from optuna.distributions import FloatDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from ...errors import ConfigError
from ...study.fronts import hypervolume
from ...study.records import INTERRUPTED
from ...study.records import KNOB_STUDY_SUFFIX as SUFFIX
from ...study.storage import Heartbeat, close_storage, delete_beside, fail_interrupted, fail_stale, open_storage
from ...training.loop import NonFiniteLoss
from ..interrupts import interruptible
from .run import forget_state


def knob_study(storage, study_name: str, seed: int) -> optuna.Study:
    """The study of a search's supernet runs (created on first use)."""
    return optuna.create_study(
        study_name=study_name + SUFFIX,
        storage=storage,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=2),
        load_if_exists=True,
    )


def forget_runs(study: optuna.Study) -> None:
    """Delete the supernet runs an earlier study of ``study``'s name left (one since deleted or
    replaced). The worker that starts a study's first attempt calls this under the study's lock,
    before it records that start. Every other worker joins after that, so none can have created
    runs yet. Any later, the deletion would take their running runs with it."""
    delete_beside(study, study.study_name + SUFFIX)


def distributions(ranges: dict[str, tuple[float, float]], scales: dict[str, str]) -> dict:
    """Optuna distributions of the searched knobs (log scale where ``scales`` says so)."""
    return {k: FloatDistribution(lo, hi, log=scales[k] == "log") for k, (lo, hi) in ranges.items()}


def inherited_hypervolume(proposed: list[dict], reference: tuple[float, float]) -> float:
    """Hypervolume of a run's ladder proposals by their inherited scores (``supernet_score``); the
    anchored ones are not scored so (their baseline's modules are not the supernet's), and are the
    same baselines in every run."""
    return hypervolume([(p["supernet_score"], p["deployable"]) for p in _scored(proposed)], reference)


def _scored(proposed: list[dict]) -> list[dict]:
    """The proposals scored with the supernet's own weights (the ladder's; not the anchored ones)."""
    return [p for p in proposed if "supernet_score" in p]


def search(
    storage_url: str,
    study_name: str,
    oneshot,
    spec,
    run,
    state_dir: str,
    reference: tuple[float, float],
    seed: int,
    printer=print,
    lock=None,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
) -> tuple[int, dict, list[dict]]:
    """Run ``oneshot.runs`` supernets of ``spec`` (a `SupernetSpec`) with searched knobs through
    ``run(spec) -> result``; returns the chosen run's number, its result, and every run's record.

    Runs stored under its name are this study's (`forget_runs` removed another study's first).
    Several workers share the runs: ``lock`` (the study's `ClaimLock`) is held while one claims a
    run, a run beats every ``heartbeat_interval`` seconds while it trains, and one silent for
    ``grace_period`` seconds lost its worker: it is failed and enqueued again with its knobs (once
    or twice at most), going on from its saved state. A worker with nothing left to claim waits for
    the runs others are training."""
    storage = open_storage(storage_url, heartbeat_interval, grace_period, retries=2)
    try:
        return _search(
            storage,
            study_name,
            oneshot,
            _Runs(spec, run, state_dir, reference, printer),
            seed,
            lock or contextlib.nullcontext,
            heartbeat_interval,
            grace_period,
        )
    finally:
        close_storage(storage)


@dataclasses.dataclass(frozen=True)
class _Runs:
    """What every run of one knob search shares: the supernet it varies, how one trains, where its
    state is saved, the reference point that scores it, and where its lines go."""

    spec: object  # a `SupernetSpec`
    run: Callable[[object], dict]
    state_dir: str
    reference: tuple[float, float]
    printer: Callable[[str], None]


def _search(storage, study_name: str, oneshot, shared: _Runs, seed: int, lock, interval, grace):
    ranges = oneshot.knob_ranges()
    dists = distributions(ranges, oneshot.KNOBS)
    fixed = oneshot.knobs()
    heartbeat = Heartbeat(storage, interval)
    with lock():
        ks = knob_study(storage, study_name, seed)
        if not ks.trials and all(lo <= fixed[k] <= hi for k, (lo, hi) in ranges.items()):
            ks.enqueue_trial({k: fixed[k] for k in ranges})  # the first run: the fixed knobs
    try:
        while True:
            with lock():
                trial, running = _claim(ks, dists, oneshot.runs, heartbeat)
            if trial is None:
                if running == 0:
                    break
                time.sleep(interval or 5)  # the last runs train elsewhere
                continue

            def stopped(masked: str | None, trial=trial) -> None:  # Ctrl-C: failed and queued again now, so
                fail_interrupted(
                    ks,
                    lambda: [trial._trial_id],  # noqa: SLF001 - the resumed search goes
                    lock,
                    {"fail_kind": INTERRUPTED},
                    grace,
                    masked,
                )  # on in this run

            try:
                interruptible(lambda: _one_run(ks, trial, fixed, ranges, shared), stopped)
            finally:
                heartbeat.discard(trial._trial_id)  # noqa: SLF001 - as study.TrialSource does
    finally:
        heartbeat.stop()
    done = [t for t in ks.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not done:
        errors = [t.user_attrs["error"] for t in ks.get_trials(deepcopy=False) if "error" in t.user_attrs]
        raise ConfigError(
            f"oneshot: every supernet run of the knob search diverged ({errors[-1] if errors else '?'}): "
            f"lower oneshot.search's lr or gate_lr range"
        )
    best = max(done, key=lambda t: (t.value, -t.number))
    runs = [t.user_attrs["run"] for t in sorted(done, key=lambda t: t.number)]
    return best.number, copy.deepcopy(best.user_attrs["result"]), runs


def _claim(ks, dists, runs: int, heartbeat):
    """A run for this worker (None when enough have ended or are training) and how many others
    train now; runs whose worker stopped beating are failed and enqueued again first."""
    fail_stale(ks)
    trials = ks.get_trials(deepcopy=False)
    running = sum(t.state == TrialState.RUNNING for t in trials)
    if _finished(trials) + running >= runs:
        return None, running
    with warnings.catch_warnings():  # "heartbeat is supposed to be used with optimize":
        warnings.simplefilter("ignore")  # we beat for these ourselves (`Heartbeat`)
        trial = ks.ask(dists)
    heartbeat.add(trial._trial_id)  # noqa: SLF001 - as study.TrialSource does
    return trial, running


def _one_run(ks, trial, fixed: dict, ranges: dict, shared: _Runs) -> None:
    """Train one supernet with ``trial``'s knobs and tell the knob study how its proposals scored."""
    printer = shared.printer
    again = RetryHeartbeatStaleTrialCallback.retried_trial_number(ks.trials[trial.number])
    if again is not None:
        printer(
            f"one-shot knobs: run {again} left no result (its worker stopped); run {trial.number} trains "
            f"its knobs again, from its last saved epoch, if any"
        )
    knobs = {**fixed, **trial.params}
    run_spec = dataclasses.replace(
        shared.spec,
        lr=knobs["lr"],
        gate_lr=knobs["gate_lr"],
        init_open=knobs["init_open"],
        penalty_step=knobs["penalty_step"],
        temperature=knobs["temperature"],
        rate_proposals=True,
        checkpoint=os.path.join(shared.state_dir, f"knobs-{_digest(trial.params)}.pt"),
    )
    start = time.perf_counter()
    try:
        result = shared.run(run_spec)
    except RuntimeError as e:
        if not diverged(e):
            raise
        trial.set_user_attr("error", _short(e))
        ks.tell(trial, state=TrialState.FAIL)
        printer(f"one-shot knobs: run {trial.number} failed ({_short(e)}); going on")
        return
    value = inherited_hypervolume(result["proposed"], shared.reference)
    record = {
        "number": trial.number,
        "knobs": knobs,
        "hypervolume": round(value, 6),
        "score": result["score"],
        "expected_count": round(result["expected_count"]),
        "cost_s": round(time.perf_counter() - start, 1),
        "resumed_from": result["resumed_from"],
        "proposals": [[p["deployable"], p["supernet_score"]] for p in _scored(result["proposed"])],
    }
    try:
        trial.set_user_attr("run", record)
        trial.set_user_attr("result", result)
        ks.tell(trial, value)
    except (ValueError, UpdateFinishedTrialError):  # another worker failed it as lost (its heartbeat lapsed)
        if not ks.trials[trial.number].state.is_finished():
            raise
        printer(
            f"one-shot knobs: run {trial.number} was failed as lost while it trained (no heartbeat within "
            f"the grace period); its result is dropped, and the run is trained again from its saved state"
        )
        return
    forget_state(run_spec)
    printer(
        f"one-shot knobs: run {trial.number} ({_knob_text(knobs, ranges)}): {len(result['proposed'])} "
        f"proposals, inherited hypervolume {value:.4f}, supernet search-dev {result['score']:.4f}, "
        f"{record['cost_s']:.0f}s"
    )


def diverged(error: BaseException | None) -> bool:
    """Whether a run failed because its loss stopped being finite (here or in a Ray worker)."""
    while error is not None:
        if isinstance(error, NonFiniteLoss) or "NonFiniteLoss" in type(error).__name__:
            return True
        error = error.__cause__
    return False


def _finished(trials) -> int:
    """Runs that ended: complete, or failed and not enqueued again (a run whose worker died is)."""
    retried = {RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials}
    return sum(
        t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and t.number not in retried) for t in trials
    )


def _digest(params: dict) -> str:
    """A short name for a set of knob values (the file of that run's saved training state)."""
    text = json.dumps({k: float(v) for k, v in sorted(params.items())})
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _knob_text(knobs: dict, ranges: dict) -> str:
    return ", ".join(f"{k} {knobs[k]:.3g}" for k in ranges)


def _short(error) -> str:
    return str(error).splitlines()[0][:160] if error is not None else "no run"


__all__ = ["SUFFIX", "distributions", "inherited_hypervolume", "knob_study", "search"]
