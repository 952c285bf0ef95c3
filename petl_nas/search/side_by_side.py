"""Train a stage's independent runs side by side on the free CPU cores, as Ray trains the trials.

Confirmation's extra seeds are many short runs of one small model. torch's threads do not speed
such a run up in proportion: on 2 cores a 10-epoch SST-2 run of all-MiniLM-L6-v2 (bf16) took
about 1.7 min in one process at 2 threads, and 1.2-1.5 min at 1 thread with another run beside it
(the trials of the same study), so one after another the stage took about twice as long as it
needed (bench/results/confirm_side_by_side.md).

`slots` says how many runs go side by side (`for_stage` also sets this process's threads where it
trains them itself): on a CPU, the cores `threads.choose` finds free
(``OMP_NUM_THREADS`` set in the environment caps them), divided by the threads each run gets (the
search's ``cpus_per_trial``); one on a GPU (runs there are packed by the search, not here) and one
with the ``local`` executor, which trains everything in this process (debugging, and the tests'
scripted runs). `run_all` then trains them in a pool of spawned processes, each with its threads
set before torch loads and its backbone and data cached across its runs (`worker.prepare`), and
hands each result back as it ends, with its index; with one slot it trains them here, one after
another. A stop (Ctrl-C, SIGTERM) ends the pool's processes at once; results handed back before
it are kept by the caller. A pool process that dies (killed for memory, or unable to start, as
under ``python -`` where a spawned process cannot import the main script) never hangs the stage:
the runs it left train in this process, one after another, with a line that says so.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
from typing import TYPE_CHECKING, Callable, Iterator

from ..study.results import TrialResult
from .progress import Stage

if TYPE_CHECKING:  # torch loads in a pool process only as it trains
    from .worker import TrialSpec

POLL_S = 1.0  # how often the pool's results are looked for


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
        return Slots(1, choice.threads, choice.reason)  # everything in this process
    if gpu:
        return Slots(1, choice.threads, "on the GPU, one after another")
    each = max(1, math.floor(cpus_per_run))
    runs = max(1, min(n_runs, choice.threads // each))
    if runs == 1:
        return Slots(1, choice.threads, choice.reason)
    return Slots(runs, each, choice.reason)


def for_stage(n_runs: int, executor: str = "ray", cpus_per_run: float = 1.0) -> Slots:
    """`slots` for a stage's ``n_runs`` runs, with this process's torch threads chosen
    (`threads.use_threads`) where it trains them itself, one after another."""
    where = slots(n_runs, executor, cpus_per_run)
    if n_runs and where.runs == 1:
        from ..training.threads import use_threads

        use_threads()
    return where


def describe(s: Slots) -> str:
    """``2 side by side with 1 CPU thread each (...)`` or ``in this process with 2 CPU thread(s) (...)``."""
    if s.runs > 1:
        return f"{s.runs} side by side with {s.threads} CPU thread(s) each ({s.reason})"
    return f"in this process with {s.threads} CPU thread(s) ({s.reason})"


def run_all(
    specs: list[TrialSpec], labels: list[str], s: Slots, stage: Stage, run_here: Callable[[TrialSpec], TrialResult]
) -> Iterator[tuple[int, TrialResult]]:
    """Train every spec; yield (its index, its result) as each ends. ``run_here`` trains one in this
    process (one slot); ``labels`` name each run in the progress lines."""
    if s.runs <= 1 or len(specs) <= 1:
        for i, spec in enumerate(specs):
            with stage.run(labels[i]):
                result = run_here(spec)
            yield i, result
        return
    yield from _pooled(specs, labels, s, stage, run_here)


def _pooled(specs, labels, s: Slots, stage: Stage, run_here) -> Iterator[tuple[int, TrialResult]]:
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("spawn")  # no forked copy of this process's torch or threads
    before = _children()
    pool = ProcessPoolExecutor(s.runs, mp_context=context, initializer=_set_threads, initargs=(s.threads,))
    began = beat = time.perf_counter()
    pending = {pool.submit(_train, spec): i for i, spec in enumerate(specs)}
    left: list[int] = []
    try:
        while pending:
            done, _ = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                try:
                    result = TrialResult.from_dict(future.result())  # a run's own error is raised here
                except BrokenProcessPool:  # a process died (killed, or could not start)
                    left.append(i)
                    continue
                stage.done += 1
                stage.spent_s = time.perf_counter() - began  # the stage's wall time: its estimate is wall time
                yield i, result
            if pending and time.perf_counter() - beat >= stage.every_s:
                beat = time.perf_counter()
                running = " and ".join(labels[i] for i in sorted(pending.values())[: s.runs])
                stage.printer(
                    f"  {running}: {(beat - began) / 60:.1f} min into this stage"
                    + (f"; {stage.left()}" if stage.done else "")
                )
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for child in _children() - before:  # at a stop: the pool's runs end with this process's
            _end(child)
    if left:  # what the broken pool did not train: here
        stage.printer(
            f"  a process of the side-by-side pool ended without its result: the {len(left)} "
            f"run(s) it left train in this process, one after another"
        )
        for i in sorted(left):
            with stage.run(labels[i]):
                result = run_here(specs[i])
            yield i, result


def _children() -> set:
    import psutil

    return {c.pid for c in psutil.Process().children() if "spawn_main" in " ".join(_cmdline(c))}


def _cmdline(process) -> list:
    try:
        return process.cmdline()
    except Exception:  # ended meanwhile, or not ours to read
        return []


def _end(pid: int) -> None:
    import psutil

    try:
        psutil.Process(pid).kill()
    except psutil.Error:
        pass


def _set_threads(threads: int) -> None:
    """In each pool process, before torch loads: its threads (``threads.choose`` reads the variable)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _train(spec: TrialSpec) -> dict:
    from .worker import run_trial

    return run_trial(spec).to_dict()
