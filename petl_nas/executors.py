"""Executors run trials: ``local`` (in this process, for debugging) or ``ray`` (Ray Tune).

Both draw proposals from the same `TrialSource` (the driver owns the Optuna study; workers never
touch the storage) and record outcomes through `Recorder`:
- a trial that trains to the end is COMPLETE with (score, deployable parameters);
- a trial a scheduler (ASHA) stops early is PRUNED, with its intermediate scores, never on the front;
- a trial whose loss goes NaN/inf is PRUNED with the reason; any other error is FAIL with the reason.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import Callable

from optuna.trial import TrialState

from .study import Proposal, TrialSource
from .tasks import resolve_task
from .train import NonFiniteLoss
from .worker import TrialSpec, run_trial

FAILED_SCORE = -2.0   # below every metric's range; only ever seen by the scheduler for a failed trial


@dataclass
class Recorder:
    """Writes trial outcomes to the study and tells the progress view."""

    source: TrialSource
    on_done: Callable[[Proposal, str, dict], None] = lambda p, state, info: None
    intermediate: dict[int, list[float]] = field(default_factory=dict)

    def result(self, p: Proposal, index: int, score: float) -> None:
        scores = self.intermediate.setdefault(p.number, [])
        scores.append(score)
        # Multi-objective studies cannot store Trial.report values: keep them as a user attribute.
        p.trial.set_user_attr("intermediate_scores", list(scores))

    def complete(self, p: Proposal, info: dict) -> None:
        self._attrs(p, info)
        self.source.study.tell(p.trial, [float(info["score"]), float(p.deployable)])
        self.on_done(p, "complete", info)

    def pruned(self, p: Proposal, info: dict, reason: str) -> None:
        self._attrs(p, info)
        p.trial.set_user_attr("pruned_reason", reason)
        self.source.study.tell(p.trial, state=TrialState.PRUNED)
        self.on_done(p, "pruned", info)

    def failed(self, p: Proposal, reason: str) -> None:
        p.trial.set_user_attr("fail_reason", reason[-2000:])
        self.source.study.tell(p.trial, state=TrialState.FAIL)
        self.on_done(p, "failed", {"reason": reason})

    def _attrs(self, p: Proposal, info: dict) -> None:
        for key in ("metrics", "train_s", "setup_s", "peak_mem_mb", "steps", "last_score"):
            if key in info:
                p.trial.set_user_attr(key, info[key])


def _reason(e: BaseException) -> str:
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    return last if len(last) < 500 else last[:497] + "..."


def run_local(source: TrialSource, n_trials: int, make_spec: Callable[[Proposal], TrialSpec],
              recorder: Recorder, **_) -> None:
    """Run ``n_trials`` one after another in this process (no early stopping)."""
    for _ in range(n_trials):
        p = source.next()
        spec = make_spec(p)
        try:
            metric = resolve_task(spec.task).main_metric
            info = run_trial(spec, report=lambda i, m, last: recorder.result(p, i, m[metric]))
        except NonFiniteLoss as e:
            recorder.pruned(p, {}, f"non-finite loss: {e}")
        except Exception as e:                                  # noqa: BLE001 - recorded, search goes on
            recorder.failed(p, _reason(e))
        else:
            recorder.complete(p, info)


# ---- Ray Tune ---------------------------------------------------------------------------------
def ray_trainable(config: dict) -> None:
    """The Tune function trainable: one trial; reports the score after every evaluation."""
    from ray import tune

    spec = TrialSpec(**config["spec"])
    metric = resolve_task(spec.task).main_metric
    best = [float("-inf")]

    def report(index: int, metrics: dict, last: bool) -> None:
        score = metrics[metric]
        best[0] = max(best[0], score)
        tune.report({"score": score, "best_score": best[0], "final": False})

    try:
        info = run_trial(spec, report=report)
    except NonFiniteLoss as e:
        tune.report({"score": FAILED_SCORE, "final": False, "failed": f"non-finite loss: {e}", "nan": True})
        return
    except Exception as e:                                      # noqa: BLE001 - reported, search goes on
        tune.report({"score": FAILED_SCORE, "final": False, "failed": _reason(e)})
        return
    # One more report carries the whole result; `final` tells it from a scheduler's stop.
    tune.report({**{k: v for k, v in info.items() if k != "history"}, "score": info["score"], "final": True})


def _make_searcher(source: TrialSource, n_trials: int, make_spec, recorder: Recorder):
    from ray.tune.search import Searcher

    class StudySearcher(Searcher):
        """A Tune searcher backed by the Optuna study (the study is the state: nothing to checkpoint)."""

        def __init__(self):
            super().__init__(metric="score", mode="max")
            self.live: dict[str, Proposal] = {}
            self.remaining = n_trials

        def suggest(self, trial_id: str):
            if self.remaining <= 0:
                return Searcher.FINISHED
            p = source.next()
            self.remaining -= 1
            self.live[trial_id] = p
            return {"spec": make_spec(p).to_dict()}

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            p = self.live.get(trial_id)
            if p is not None and not result.get("final") and "failed" not in result:
                recorder.result(p, result.get("training_iteration", 0), result["score"])

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            p = self.live.pop(trial_id, None)
            if p is None:
                return
            if error or not result:
                recorder.failed(p, "the trial's worker raised outside the trainer (see the Ray logs)")
            elif "failed" in result:
                if result.get("nan"):
                    recorder.pruned(p, {}, result["failed"])
                else:
                    recorder.failed(p, result["failed"])
            elif result.get("final"):
                recorder.complete(p, result)
            else:
                info = {"last_score": result.get("score")}
                recorder.pruned(p, info, f"stopped early by the scheduler after "
                                         f"{result.get('training_iteration')} evaluations")

        def save(self, checkpoint_path: str) -> None:
            pass

        def restore(self, checkpoint_path: str) -> None:
            pass

    return StudySearcher()


def _trial_name(trial) -> str:
    return f"trial_{trial.config['spec']['number']}"


def run_ray(source: TrialSource, n_trials: int, make_spec, recorder: Recorder, *, n_evals: int,
            run_dir: str, cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0,
            concurrent: int | None = None, scheduler: str = "asha", address: str | None = None) -> None:
    """Run ``n_trials`` through Ray Tune (local Ray, or the cluster at ``address``)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")       # with verbose=0: Tune prints nothing
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    if scheduler == "asha" and n_evals > 1:
        # max_t counts the trainable's closing report too (evaluations + 1), so that a trial that
        # trains to the end is never stopped before it says so.
        sched = ASHAScheduler(metric="score", mode="max", max_t=n_evals + 1, grace_period=1,
                              reduction_factor=2)
    else:
        sched = FIFOScheduler()
    trainable = tune.with_resources(ray_trainable, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=_make_searcher(source, n_trials, make_spec, recorder),
                                    scheduler=sched, num_samples=n_trials, reuse_actors=True,
                                    max_concurrent_trials=concurrent, trial_name_creator=_trial_name,
                                    trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name="tune", storage_path=os.path.abspath(os.path.join(run_dir, "ray")),
                                  verbose=0),
    )
    tuner.fit()


EXECUTORS = {"local": run_local, "ray": run_ray}

__all__ = ["run_local", "run_ray", "ray_trainable", "Recorder", "EXECUTORS"]
