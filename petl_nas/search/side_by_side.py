"""Train a stage's independent runs side by side on the free CPU cores, as Ray trains the trials.

Confirmation's extra seeds are many short runs of one small model. torch's threads do not speed
such a run up in proportion: on 2 cores a 10-epoch SST-2 run of all-MiniLM-L6-v2 (bf16) took
about 1.7 min in one process at 2 threads, and 1.2-1.5 min at 1 thread with another run beside it
(the trials of the same study), so one after another the stage took about twice as long as it
needed (bench/results/confirm_side_by_side.md).

`slots` says how many runs go side by side: on a CPU, the cores `threads.choose` finds free
(``OMP_NUM_THREADS`` set in the environment caps them), divided by the threads each run gets (the
search's ``cpus_per_trial``); one on a GPU (runs there are packed by the search, not here) and one
with the ``local`` executor, which trains everything in this process (debugging, and the tests'
scripted runs). `run_all` then trains them in a pool of spawned processes, each with its threads
set before torch loads and its backbone and data cached across its runs (`worker.prepare`), and
hands each result back as it ends, with its index; with one slot it trains them here, one after
another. A stop (Ctrl-C, SIGTERM) ends the pool's processes at once; results handed back before
it are kept by the caller.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
from typing import TYPE_CHECKING, Callable, Iterator

from .progress import Stage
from .results import TrialResult

if TYPE_CHECKING:                                    # torch loads in a pool process only as it trains
    from .worker import TrialSpec

POLL_S = 1.0       # how often the pool's results are looked for


@dataclasses.dataclass(frozen=True)
class Slots:
    """``runs`` side by side, ``threads`` each, and why, in words a user can act on."""

    runs: int
    threads: int
    reason: str


def slots(n_runs: int, executor: str = "ray", cpus_per_run: float = 1.0, gpu: bool | None = None) -> Slots:
    """How many of ``n_runs`` runs to train at once here (see the module docstring)."""
    from ..training.threads import choose

    if gpu is None:
        import torch
        gpu = torch.cuda.is_available()
    choice = choose()
    if executor == "local":
        return Slots(1, choice.threads, choice.reason)                # everything in this process
    if gpu:
        return Slots(1, choice.threads, "on the GPU, one after another")
    each = max(1, math.floor(cpus_per_run))
    runs = max(1, min(n_runs, choice.threads // each))
    if runs == 1:
        return Slots(1, choice.threads, choice.reason)
    return Slots(runs, each, choice.reason)


def describe(s: Slots) -> str:
    """``2 side by side with 1 CPU thread each (...)`` or ``in this process with 2 CPU thread(s) (...)``."""
    if s.runs > 1:
        return f"{s.runs} side by side with {s.threads} CPU thread(s) each ({s.reason})"
    return f"in this process with {s.threads} CPU thread(s) ({s.reason})"


def run_all(specs: list[TrialSpec], labels: list[str], s: Slots, stage: Stage,
            run_here: Callable[[TrialSpec], TrialResult]) -> Iterator[tuple[int, TrialResult]]:
    """Train every spec; yield (its index, its result) as each ends. ``run_here`` trains one in this
    process (one slot); ``labels`` name each run in the progress lines."""
    if s.runs <= 1 or len(specs) <= 1:
        for i, spec in enumerate(specs):
            with stage.run(labels[i]):
                result = run_here(spec)
            yield i, result
        return
    yield from _pooled(specs, labels, s, stage)


def _pooled(specs, labels, s: Slots, stage: Stage) -> Iterator[tuple[int, TrialResult]]:
    context = multiprocessing.get_context("spawn")     # no forked copy of this process's torch or threads
    pool = context.Pool(s.runs, initializer=_set_threads, initargs=(s.threads,))
    began = time.perf_counter()
    try:
        pending = {i: pool.apply_async(_train, (spec,)) for i, spec in enumerate(specs)}
        beat = began
        while pending:
            done = [i for i, r in pending.items() if r.ready()]
            for i in done:
                result = TrialResult.from_dict(pending.pop(i).get())   # a run's error is raised here
                stage.done += 1
                stage.spent_s = time.perf_counter() - began      # the stage's wall time: its estimate is wall time
                yield i, result
            if pending and time.perf_counter() - beat >= stage.every_s:
                beat = time.perf_counter()
                running = " and ".join(labels[i] for i in sorted(pending)[: s.runs])
                stage.printer(f"  {running}: {(beat - began) / 60:.1f} min into this stage"
                              + (f"; {stage.left()}" if stage.done else ""))
            if pending and not done:
                time.sleep(POLL_S)
        pool.close()
    finally:
        pool.terminate()                                # at a stop: its runs end with this process's
        pool.join()


def _set_threads(threads: int) -> None:
    """In each pool process, before torch loads: its threads (``threads.choose`` reads the variable)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _train(spec: TrialSpec) -> dict:
    from .worker import run_trial

    return run_trial(spec).to_dict()
