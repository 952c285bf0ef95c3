"""Executors run trials: ``local`` (in this process, for debugging) or ``ray`` (Ray Tune).

Both draw proposals from the same `TrialSource` (the driver owns the Optuna study; workers never
touch the storage) and record outcomes through `Recorder`:
- a trial that trains to the end is COMPLETE with (score, deployable parameters);
- a trial a scheduler (ASHA) stops early is PRUNED, with its intermediate scores, never on the front;
- a trial whose loss goes NaN/inf is PRUNED with the reason; any other error is FAIL with the reason
  and its kind (``out of memory``, ``error: ValueError``, ``worker crashed``), and the worker frees
  the failed trial's memory (CUDA cache too) before the next one.
Each executor stops when the `TrialSource` says the study is full (all workers together). A
proposal whose exact trial spec was already trained (``Recorder.known``: calibration's runs at the
final length) is recorded from that result, marked ``reused``, and not trained again.
With ``gpus_per_trial: auto`` the Ray executor packs trials onto GPUs by their measured memory
(`petl_nas.search.packing`). A Ray the executor starts itself is private to the search (`private_ray`: on
127.0.0.1, in a session of its own); nothing Tune pickles holds the study or its storage URL.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Callable

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ..errors import ConfigError
from ..study.experiment import Experiment
from ..study.results import TrialResult
from ..study.storage import as_stored
from ..tasks import resolve_task
from ..tasks.significance import Z, did_not_learn
from ..training.costs import cost_values
from ..training.loop import NonFiniteLoss
from .interrupts import caused_by_interrupt, raise_if_stopped
from .packing import GpuPacking
from .study import Proposal, TrialSource
from .worker import TrialSpec, free_memory, run_trial

FAILED_SCORE = -2.0  # below every metric's range; only ever seen by the scheduler for a failed trial
OOM = "out of memory"
_OOM_WORDS = (OOM, "not enough memory", "can't allocate memory", "cannot allocate memory")


@dataclass
class Recorder:
    """Writes trial outcomes to the study (a complete trial's attributes from its `TrialResult`,
    here only) and tells the progress view."""

    source: TrialSource
    on_done: Callable[[Proposal, str, dict], None] = lambda p, state, info: None
    intermediate: dict[int, list[float]] = field(default_factory=dict)
    baseline: dict | None = None  # the task's trivial baseline on search-dev (significance.py)
    objectives: tuple = ("score", "params")  # the study's; costs after the first two (costs.py)
    known: list = field(default_factory=list)  # (trial spec as stored, TrialResult) already trained elsewhere

    def reuse(self, p: Proposal, spec: TrialSpec) -> bool:
        """Record ``p`` from a known result of the same spec (its number aside); False when none."""
        key = as_stored({**spec.to_dict(), "number": None, "final_twin": None})  # what trains, not what is scored
        for i, (known_spec, result) in enumerate(self.known):
            if {**known_spec, "number": None, "final_twin": None} == key:
                del self.known[i]
                self.complete(p, result)
                return True
        return False

    def result(self, p: Proposal, index: int, score: float) -> None:
        raise_if_stopped()  # a Ctrl-C Python dropped stops the search here
        self.add_intermediate(p, score)

    def add_intermediate(self, p: Proposal, score: float) -> None:
        """One more evaluation's score of ``p`` (no stop check: a trial's closing is written whole)."""
        scores = self.intermediate.setdefault(p.number, [])
        scores.append(score)
        # Multi-objective studies cannot store Trial.report values: keep them as a user attribute.
        p.trial.set_user_attr("intermediate_scores", list(scores))

    def complete(self, p: Proposal, result: TrialResult) -> None:
        score = float(result.score)
        if not math.isfinite(score):
            return self.failed(p, f"the trial's score is {score}", "non-finite score")
        flat = did_not_learn(score, result.score_se, self.baseline)
        info = {**result.to_dict(), "did_not_learn": flat}

        def write():
            self._attrs(p, result.attributes())
            p.trial.set_user_attr("did_not_learn", flat)
            if self.baseline is not None:  # infeasible when flat: never on the front, never dominates
                margin = score - self.baseline["score"] - Z * (result.score_se or 0.0)
                p.trial.set_constraint("learned", 0.0 if margin > 0 else float(-margin) + 1e-9)
            self.source.study.tell(p.trial, [score, float(p.deployable), *cost_values(self.objectives, info)])

        if self._finish(p, write):
            self.on_done(p, "complete", info)

    def pruned(self, p: Proposal, reason: str, last_score: float | None = None, node: str | None = None) -> None:
        """A trial stopped before its end: by the scheduler (its ``last_score``), or by a non-finite loss."""
        info = {k: v for k, v in (("last_score", last_score), ("node", node)) if v is not None}

        def write():
            self._attrs(p, info)
            p.trial.set_user_attr("pruned_reason", reason)
            self.source.study.tell(p.trial, state=TrialState.PRUNED)

        if self._finish(p, write):
            self.on_done(p, "pruned", {**info, "reason": reason})

    def failed(self, p: Proposal, reason: str, kind: str = "error", trace: str | None = None) -> None:
        """A failed trial: its one-line ``reason``, its ``kind`` and, for an error, where it was raised
        (``trace``: the traceback's innermost frames), in the study (the dashboard's attributes) and
        the trial's file."""

        def write():
            p.trial.set_user_attr("fail_reason", reason[-2000:])
            p.trial.set_user_attr("fail_kind", kind)
            if trace:
                p.trial.set_user_attr("fail_traceback", trace)
            self.source.study.tell(p.trial, state=TrialState.FAIL)

        if self._finish(p, write):
            self.on_done(p, "failed", {"reason": reason, "kind": kind, **({"traceback": trace} if trace else {})})

    def _finish(self, p: Proposal, write: Callable[[], None]) -> bool:
        """Write an outcome; False when another worker had already failed the trial as lost (its
        heartbeat lapsed, e.g. the database was out of reach): the result is dropped, not fatal.
        The trial stays this worker's until its outcome is written: a stop (Ctrl-C, SIGTERM) that
        lands in the middle of the write leaves it to the interrupt handler, which fails it as
        interrupted, instead of RUNNING until its heartbeat lapses."""
        try:
            write()
        except (ValueError, UpdateFinishedTrialError):
            now = next(t for t in self.source.study.get_trials(deepcopy=False) if t.number == p.number)
            if not now.state.is_finished():
                raise
            self.source.release(p)
            self.on_done(
                p,
                "dropped",
                {"reason": f"already {now.state.name} (failed as lost by another worker); this result is dropped"},
            )
            return False
        self.source.release(p)
        return True

    def _attrs(self, p: Proposal, attributes: dict) -> None:
        for key, value in attributes.items():
            p.trial.set_user_attr(key, value)


def _reason(e: BaseException) -> str:
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    return last if len(last) < 500 else last[:497] + "..."


def _trace(e: BaseException, limit: int = 4000) -> str:
    """The traceback of ``e``, cut to its last ``limit`` characters: the innermost frames, where it
    was raised."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _kind(e: BaseException) -> str:
    """A failure's kind, for counting: out of memory (CPU or GPU), or the exception's type."""
    import torch

    if isinstance(e, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))) or any(
        w in str(e).lower() for w in _OOM_WORDS
    ):
        return OOM
    return f"error: {type(e).__name__}"


def attempt(spec: TrialSpec, report=None) -> tuple[str, TrialResult | dict]:
    """Run one trial and never raise: ``("complete", TrialResult)``, ``("nan", {reason})`` for a
    non-finite loss, or ``("failed", {reason, kind})`` for any other error."""
    try:
        return "complete", run_trial(spec, report=report)
    except NonFiniteLoss as e:
        outcome = "nan", {"reason": f"non-finite loss: {e}"}
    except Exception as e:  # noqa: BLE001 - recorded, search goes on
        if caused_by_interrupt(e):  # raised on the way out of a Ctrl-C: the interrupt's
            raise
        outcome = "failed", {"reason": _reason(e), "kind": _kind(e), "traceback": _trace(e)}
    free_memory()  # out of the except block: no traceback pins the failed trial's tensors now
    return outcome


def next_to_train(source: TrialSource, make_spec, recorder: Recorder) -> tuple[Proposal, TrialSpec] | None:
    """The next proposal that needs training, with its spec (None: the study is full); those whose
    result is already known are recorded from it on the way."""
    raise_if_stopped()
    while (p := source.next()) is not None:
        spec = make_spec(p)
        if not recorder.reuse(p, spec):
            return p, spec
    return None


def run_local(
    source: TrialSource, n_trials: int, make_spec: Callable[[Proposal], TrialSpec], recorder: Recorder, **_
) -> None:
    """Run up to ``n_trials`` one after another in this process (no early stopping)."""
    for _ in range(n_trials):
        drawn = next_to_train(source, make_spec, recorder)
        if drawn is None:  # the study is full
            return
        p, spec = drawn
        metric = resolve_task(spec.task).main_metric
        outcome, info = attempt(spec, report=lambda i, m, last: recorder.result(p, i, m[metric]))
        if outcome == "complete":
            recorder.complete(p, info)
        elif outcome == "nan":
            recorder.pruned(p, info["reason"])
        else:
            recorder.failed(p, info["reason"], info["kind"], info.get("traceback"))


# ---- Ray Tune ---------------------------------------------------------------------------------
def ray_trainable(config: dict) -> None:
    """The Tune function trainable: one trial; reports the score after every evaluation."""
    import ray
    from ray import tune

    spec = TrialSpec(**config["spec"])
    metric = resolve_task(spec.task).main_metric
    best = [float("-inf")]

    def report(index: int, metrics: dict, last: bool) -> None:
        if last:  # the closing report carries it: no scheduler's rung falls on a trained trial
            return
        score = metrics[metric]
        best[0] = max(best[0], score)
        tune.report({"score": score, "best_score": best[0], "final": False})

    outcome, info = attempt(spec, report)
    node = f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"
    if outcome != "complete":
        tune.report(
            {
                "score": FAILED_SCORE,
                "final": False,
                "failed": info["reason"],
                "kind": info.get("kind"),
                "traceback": info.get("traceback"),
                "nan": outcome == "nan",
                "node": node,
            }
        )
        return
    # One more report carries the whole result; `final` tells it from a scheduler's stop.
    granted = ray.get_runtime_context().get_assigned_resources()  # what Ray gave this trial
    shared = {"gpu_share": round(granted.get("GPU", 0.0), 4)} if "gpu" in config else {}  # gpus_per_trial: auto
    tune.report({**info.to_report(), "final": True, "node": node, **shared})


def _asha(n_evals: int, first_rung: int):
    """ASHA stopping trials at rungs from ``first_rung`` evaluations, halving at each; FIFO where a
    trial evaluates once. A trial reports evaluations 1 .. n-1, then its closing report (time n)
    carries the last evaluation with the whole result: a rung at n, or max_t, can only stop what
    has ended."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if n_evals <= 1:
        return FIFOScheduler()
    return ASHAScheduler(
        metric="score", mode="max", max_t=n_evals, grace_period=min(first_rung, n_evals), reduction_factor=2
    )


def _fifo(n_evals: int, first_rung: int):
    """Every trial trains to its end."""
    from ray.tune.schedulers import FIFOScheduler

    return FIFOScheduler()


# Ray Tune's schedulers by name: (evaluations per trial, ASHA's first rung) -> scheduler. The
# experiment's ``scheduler`` accepts exactly these names (tests/search/test_search.py).
SCHEDULERS = {"asha": _asha, "fifo": _fifo}


def _make_searcher(
    source: TrialSource,
    n_trials: int,
    make_spec,
    recorder: Recorder,
    packing: GpuPacking | None = None,
    printer: Callable[[str], None] = print,
):
    from ray.tune.search import Searcher

    class StudySearcher(Searcher):
        """A Tune searcher backed by the Optuna study (the study is the state: nothing to checkpoint)."""

        def __init__(self):
            super().__init__(metric="score", mode="max")
            self.live: dict[str, Proposal] = {}
            self.shares: dict[str, float] = {}  # the GPU share each live trial was given
            self.remaining = n_trials

        def suggest(self, trial_id: str):
            if self.remaining <= 0:
                return Searcher.FINISHED
            if packing is not None and packing.must_wait(len(self.live)):
                return None  # asked again once the first trial is measured
            drawn = next_to_train(source, make_spec, recorder)
            if drawn is None:  # the study is full
                self.remaining = 0
                return Searcher.FINISHED
            p, spec = drawn
            self.remaining -= 1
            self.live[trial_id] = p
            if packing is None:
                return {"spec": spec.to_dict()}
            self.shares[trial_id] = packing.fraction
            return {"spec": spec.to_dict(), "gpu": packing.fraction}

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            p = self.live.get(trial_id)
            if p is not None and not result.get("final") and "failed" not in result:
                recorder.result(p, result.get("training_iteration", 0), result["score"])

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            p, share_of_trial = self.live.pop(trial_id, None), self.shares.pop(trial_id, None)
            if p is None:
                return
            if packing is not None and result and (result.get("final") or result.get("kind") == OOM):
                line = packing.observe(result) if result.get("final") else packing.out_of_memory(share_of_trial)
                if line:
                    printer(line)
            _record_outcome(recorder, p, result if not error else None)

        def save(self, checkpoint_path: str) -> None:
            pass

        def restore(self, checkpoint_path: str) -> None:
            pass

        def __reduce__(self):
            # Tune pickles the searcher into runs/NAME/ray/tune/tuner.pkl; this class's closure holds
            # the study, its storage and the experiment, so the storage URL's password with them.
            # A search goes on from its study, never from Tune's files: nothing of it is written.
            return _searcher_not_restorable, ()

    return StudySearcher()


def _record_outcome(recorder: Recorder, p: Proposal, result: dict | None) -> None:
    """Record how Ray's trial of ``p`` ended from its closing ``result`` (None: its worker died or
    raised outside the trainer): failed, pruned (a non-finite loss, or stopped by the scheduler),
    or complete."""
    if not result:
        recorder.failed(p, "the trial's worker died or raised outside the trainer (see the Ray logs)", "worker crashed")
    elif "failed" in result:
        if result.get("nan"):
            recorder.pruned(p, result["failed"], node=result.get("node"))
        else:
            recorder.failed(p, result["failed"], result.get("kind") or "error", result.get("traceback"))
    elif result.get("final"):
        if result.get("last_score") is not None:  # its last evaluation, reported here only
            _add_unseen(recorder, p, result.get("training_iteration", 0), result["last_score"])
        recorder.complete(p, TrialResult.from_report(result))
    else:
        evaluations = result.get("training_iteration", 0)
        _add_unseen(recorder, p, evaluations, result["score"])
        recorder.pruned(
            p, f"stopped early by the scheduler after {evaluations} evaluations", last_score=result.get("score")
        )


def _add_unseen(recorder: Recorder, p: Proposal, evaluations: int, score: float) -> None:
    """The score of evaluation ``evaluations``, unless recorded: Ray shows the searcher no result its
    scheduler stopped a trial at, nor (here) the result that closes a trial."""
    if len(recorder.intermediate.get(p.number, ())) < evaluations:
        recorder.add_intermediate(p, score)


def _searcher_not_restorable():
    raise RuntimeError(
        "petl-nas's Ray Tune searcher is not saved with Tune's files: a search goes on from "
        "its study; run the same `petl-nas search` command again"
    )


def _gpu_resources(cpus_per_trial: float):
    """Resources of a trial whose GPU share travels in its config (``gpus_per_trial: auto``)."""
    from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

    return lambda config: resource_dict_to_pg_factory({"cpu": cpus_per_trial, "gpu": config.get("gpu", 0.0)})


def check_ray_address(address: str | None) -> None:
    """ConfigError unless ``address`` is empty, ``auto``, or a host:port where something answers."""
    if address in (None, "", "auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"ray_address {address!r}: expected HOST:PORT (printed by `ray start --head`), ray://HOST:PORT or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ConfigError(
            f"ray_address {address!r}: nothing answers there ({e.strerror or e}); start the "
            f"head with `ray start --head` or check the address"
        ) from None
    _check_not_connected_elsewhere(address)


def _check_not_connected_elsewhere(address: str | None) -> None:
    """ConfigError when this process is already connected to another Ray than ``address`` (an
    earlier search in the same Python session): its trials would silently run there instead."""
    ray = sys.modules.get("ray")
    if address in (None, "", "auto", "local") or ray is None or not ray.is_initialized():
        return
    current = ray.get_runtime_context().gcs_address
    if current != address.split("://", 1)[-1]:
        raise ConfigError(
            f"ray_address {address!r}: this process is already connected to the Ray at {current} "
            f"(an earlier search); call ray.shutdown() first, or search in a new process"
        )


def _slots(resources: dict, cpus_per_trial: float, gpus_per_trial: float) -> int:
    """Trials the cluster fits at once. Tune keeps only this many trials pending for a custom
    searcher (one, unless told), so without it a cluster fills one trial start at a time."""
    slots = _how_many(resources.get("CPU", 1), cpus_per_trial) if cpus_per_trial else 1
    if gpus_per_trial:
        slots = min(slots, _how_many(resources.get("GPU", 0), gpus_per_trial))
    return max(1, slots)


def _how_many(total: float, each: float) -> int:
    """How many of ``each`` fit in ``total``, in Ray's units of 1/10,000 (in floats, 1 // 0.2 is 4)."""
    return round(total * 10_000) // max(1, round(each * 10_000))


def _trial_name(trial) -> str:
    return f"trial_{trial.config['spec']['number']}"


def init_ray(address: str | None = None):
    """The ``ray`` module, connected: to ``address``, else to a Ray of this process's own (never a
    cluster some other `ray start` left on this machine), private to it (`private_ray`); quiet,
    without usage stats. Authentication is Ray's own (its default, or the user's RAY_AUTH_MODE)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: Tune prints nothing
    # Ctrl-C is petl-nas's to handle (running trials failed for a retry, the study kept, one line);
    # Tune's own handler would swallow it, end fit() without results and suggest a Tuner.restore.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    import ray

    _check_not_connected_elsewhere(address)
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            with private_ray() if address == "local" else contextlib.nullcontext():
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        finally:
            if callable(sigterm) and threading.current_thread() is threading.main_thread():
                # Ray's start-up installs a SIGTERM handler that exits at once (its native one prints a
                # stack), running trials left RUNNING; a search's stops it as Ctrl-C does
                # (`interrupts.stops_on_signals`). Put back even if the start-up failed.
                signal.signal(signal.SIGTERM, sigterm)
    return ray


@contextlib.contextmanager
def private_ray():
    """Within it, a Ray that ``ray.init`` starts listens on 127.0.0.1 only, and on Linux its processes
    run in a session of their own.

    Loopback: Ray binds gcs_server, the raylet, every worker's gRPC server and its agents to all
    interfaces unless the node's address is 127.0.0.1, which it picks only where multi-node clusters
    are off (``ray_constants.ENABLE_RAY_CLUSTER``: its default on macOS and Windows, read once at
    import from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``). Ray 2.60 has no other setting for it, and
    `ray.init(_node_ip_address="127.0.0.1")` is turned into the machine's address. It is off for the
    start-up only (the processes Ray starts are handed the node's address), so a later connection
    of this process to a cluster (``--ray-address``) is as Ray makes it.

    Session: Ray starts gcs_server, the raylet and its helpers in the driver's process group, so a
    signal to the group (``timeout``, a batch scheduler) killed them under the running search, whose
    stop then waited 60 s on the dead GCS and exited with its trials RUNNING. In a session of their own
    only petl-nas hears it, stops as from a SIGTERM of its own, and ``ray.shutdown`` ends them; they
    still die with it (Ray's kernel fate-sharing, ``PR_SET_PDEATHSIG``; elsewhere Ray's reaper needs
    them in its group). Ray starts its workers in groups of their own already.

    Both are Ray's private names (no public setting exists); tests/search/test_safe_ray.py reads the
    sockets and signals a real search's group, so a Ray that renames them fails there.
    """
    from ray._private import ray_constants, services

    popen, cluster = services.ConsolePopen, ray_constants.ENABLE_RAY_CLUSTER
    # Token authentication is Ray's default for a new local cluster; Ray says so in a warning line
    # that would open every search's output. Ray still turns it on (a RAY_AUTH_MODE the user set
    # wins: `disabled` turns it off on purpose); only the line is left out.
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)

    class InOwnSession(popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    ray_constants.ENABLE_RAY_CLUSTER = False
    if sys.platform.startswith("linux"):
        services.ConsolePopen = InOwnSession
    try:
        yield
    finally:
        services.ConsolePopen, ray_constants.ENABLE_RAY_CLUSTER = popen, cluster
        notice.setLevel(level)


def run_ray(
    source: TrialSource,
    n_trials: int,
    make_spec,
    recorder: Recorder,
    *,
    n_evals: int,
    run_dir: str,
    cpus_per_trial: float = Experiment.cpus_per_trial,
    gpus_per_trial: float | str = Experiment.gpus_per_trial,
    concurrent: int | None = None,
    scheduler: str = Experiment.scheduler,
    address: str | None = None,
    first_rung: int = 1,
    reserved_mb: float = 0.0,
    packing: GpuPacking | None = None,
    printer: Callable[[str], None] = print,
) -> GpuPacking | None:
    """Run ``n_trials`` through Ray Tune (local Ray, or the cluster at ``address``). ASHA's first
    rung is at evaluation ``first_rung`` (where `fidelity: auto` saw the presets learn).
    ``gpus_per_trial: auto``: no GPU where the cluster has none, else shares sized by `GpuPacking`,
    with ``reserved_mb`` per trial beyond the first trial's measured peak. Returns that packing:
    handed back as ``packing`` by the next call of the same search, it goes on from what it learned
    (no second measuring trial; an out-of-memory halving kept)."""
    from ray import tune

    ray = init_ray(address)
    resources, learned, packing = ray.cluster_resources(), packing, None
    if gpus_per_trial == "auto":  # shares travel in each trial's config; only CPUs bound the slots
        gpus_per_trial, n_gpus = 0.0, int(resources.get("GPU", 0))
        if n_gpus and learned is not None and learned.measured:
            packing = learned  # never more per GPU than this cluster's CPUs drive now
            packing.most = min(packing.most, max(1, _slots(resources, cpus_per_trial, 0.0) // n_gpus))
            packing.per_gpu = min(packing.per_gpu, packing.most)
            printer(f"gpus_per_trial auto: {packing.per_gpu} trial(s) per GPU, as learned earlier in this search")
        elif n_gpus:
            packing = GpuPacking(most=max(1, _slots(resources, cpus_per_trial, 0.0) // n_gpus), reserved_mb=reserved_mb)
            printer(
                f"gpus_per_trial auto: {n_gpus} GPU(s); the first trial runs alone on one to measure "
                f"its memory, then up to {packing.most} trials share each GPU"
            )
    concurrent = concurrent or _slots(resources, cpus_per_trial, gpus_per_trial)
    sched = SCHEDULERS[scheduler](n_evals, first_rung)
    trainable = tune.with_resources(
        ray_trainable, _gpu_resources(cpus_per_trial) if packing else {"cpu": cpus_per_trial, "gpu": gpus_per_trial}
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=_make_searcher(source, n_trials, make_spec, recorder, packing, printer),
            scheduler=sched,
            num_samples=n_trials,
            reuse_actors=True,
            max_concurrent_trials=concurrent,
            trial_name_creator=_trial_name,
            trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(name="tune", storage_path=os.path.abspath(os.path.join(run_dir, "ray")), verbose=0),
    )
    tuner.fit()
    return packing


EXECUTORS = {"local": run_local, "ray": run_ray}

__all__ = [
    "run_local",
    "run_ray",
    "init_ray",
    "private_ray",
    "ray_trainable",
    "attempt",
    "check_ray_address",
    "Recorder",
    "EXECUTORS",
    "SCHEDULERS",
]
