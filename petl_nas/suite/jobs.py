"""Run a suite's studies side by side (``petl-nas suite --jobs N``).

One after another, a suite leaves a machine idle wherever one study cannot fill it: on a GPU a
MiniLM trial keeps the card about 9% busy, and eight trainings started at once in eight processes
ran in the time of one (`../shared/research/gpu-h100.md`); on a CPU of many cores a study's
supernet, calibration and confirmation stages use a few. Here up to N studies run at once, each in
a spawned process of its own, each an ordinary search (`petl_nas.search.driver.run_search`), so
what a study records, and how a run killed mid-way goes on, is the same as one after another.

A study that reads a file another study of the suite writes (its task's largest budget measures
the rates its other budgets read, ``rates.json``, and under ``supernet: shared`` proposes for
them, ``oneshot.json``) starts once that file exists, not once that study has finished; studies
start in the suite's running order as far as that allows. Each study's lines are printed as it
prints them, behind ``[task budget]``. With the ``ray`` executor and no ``concurrent`` of its own,
each study trains at most its share of the cores at once (cores / N), so N studies do not ask
for N times the machine. A study that fails leaves the others to finish, starts nothing more, and
the suite ends with one line naming it. A stop (Ctrl-C, SIGTERM) is passed on to every running
study, which keeps what it finished as it does when run alone: the same command goes on.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError

POLL_S = 1.0              # how often finished studies and written files are looked for
STOP_WAIT_S = 600         # how long a stopped suite waits for its studies to keep what they finished


def reads(exp, studies) -> list[Path]:
    """The files ``exp`` reads that a study among ``studies`` (task, budget, experiment) writes."""
    written = {exp_.run_dir / name for _, _, exp_ in studies for name in ("rates.json", "oneshot.json")}
    return [Path(p) for p in (exp.rates.file, exp.oneshot.file) if p is not None and Path(p) in written]


def with_share_of_cores(exp, jobs: int, cores: int):
    """``exp`` training at most ``cores // jobs`` trials at once where it would take every core (the
    ``ray`` executor on a Ray of its own, no ``concurrent`` set)."""
    if jobs <= 1 or exp.executor != "ray" or exp.concurrent is not None or exp.ray_address:
        return exp
    return dataclasses.replace(exp, concurrent=max(1, cores // jobs))


def run_side_by_side(studies: list, jobs: int, printer: Callable[[str], None], suite_name: str,
                     finished: Callable[[str, str, object], None]) -> None:
    """Run ``studies`` (task, budget, experiment; in running order), at most ``jobs`` at once, calling
    ``finished(task, budget, exp)`` in this process as each ends well. Raises ConfigError naming the
    studies that failed, once the others have ended."""
    from ..training.threads import usable_cores

    cores = usable_cores()[0]
    context = multiprocessing.get_context("spawn")
    waiting = [(t, b, with_share_of_cores(e, jobs, cores)) for t, b, e in studies]
    running: dict[str, tuple[multiprocessing.process.BaseProcess, tuple]] = {}     # by study name
    failed: list[str] = []
    total = len(waiting)
    try:
        while waiting or running:
            for entry in list(waiting):
                if failed or len(running) >= jobs:
                    break
                task, budget, exp = entry
                missing = [p for p in reads(exp, studies) if not p.exists()]
                if missing and not _written_later(missing, studies, waiting, running):
                    waiting.remove(entry)
                    failed.append(f"{task} at {budget} (its input {missing[0]} was never written)")
                    continue
                if missing:
                    continue
                waiting.remove(entry)
                label = f"{task} {budget}"
                process = context.Process(target=study_process, args=(exp, label), name=f"petl-nas {label}")
                process.start()
                running[exp.study_name] = (process, entry)
                printer(f"suite {suite_name}: {task} at budget {budget}, study {exp.study_name!r} started "
                        f"({total - len(waiting)} of {total}; {len(running)} running side by side)")
            for name, (process, entry) in list(running.items()):
                if process.is_alive():
                    continue
                process.join()
                del running[name]
                task, budget, exp = entry
                if process.exitcode == 0:
                    printer(f"suite {suite_name}: {task} at budget {budget} finished")
                    finished(task, budget, exp)
                else:
                    failed.append(f"{task} at {budget} (exit status {process.exitcode})")
            if waiting and failed and not running:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop_all([process for process, _ in running.values()])
        raise
    if failed:
        unstarted = f"; not started: {', '.join(f'{t} at {b}' for t, b, _ in waiting)}" if waiting else ""
        raise ConfigError(f"suite {suite_name}: {len(failed)} of {total} studies failed: {'; '.join(failed)}"
                          f"{unstarted} (the lines above say why; what the studies finished is kept, and the "
                          f"same command goes on)")


def _written_later(missing: list[Path], studies, waiting, running) -> bool:
    """Will a study still waiting or running write every file of ``missing``?"""
    pending = list(waiting) + [entry for _, entry in running.values()]
    return all(any(p.parent == exp.run_dir for _, _, exp in pending) for p in missing)


def _stop_all(processes: list) -> None:
    """Pass a stop on to every running study and wait for each to keep what it finished."""
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()


def study_process(exp, label: str) -> None:
    """A spawned process's whole life: run one study, its lines behind ``[label]``; exit 0 when it
    finished, 2 with one line when it could not (as the CLI does), 128 + the signal when stopped.
    Ctrl-C reaches the suite's process, which passes it on as SIGTERM: ignored here, it would
    otherwise arrive twice (a terminal signals every process of its foreground group)."""
    from ..search.driver import run_search
    from ..search.interrupts import exit_status, stops_on_signals

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prefix = f"[{label}] "
    try:
        with stops_on_signals():
            run_search(exp, printer=lambda line: print(prefix + line, flush=True))
    except KeyboardInterrupt as stop:
        print(f"{prefix}petl-nas: interrupted; the study is kept", file=sys.stderr, flush=True)
        sys.exit(exit_status(stop))
    except (ConfigError, OSError) as e:
        said = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else e
        print(f"{prefix}petl-nas: error: {said}", file=sys.stderr, flush=True)
        sys.exit(2)


__all__ = ["reads", "run_side_by_side", "study_process", "with_share_of_cores"]
