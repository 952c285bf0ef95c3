"""Run a suite's studies side by side (``petl-nas suite --jobs N``).

One after another, a suite leaves a machine idle wherever one study cannot fill it: on a GPU a
MiniLM trial keeps the card about 9% busy, and eight trainings started at once in eight processes
ran in the time of one (`../shared/research/gpu-h100.md`); on a CPU of many cores a study's
supernet, calibration and confirmation stages use a few. Here up to N studies run at once, each in
a spawned process of its own, each an ordinary search (`petl_nas.search.driver.run_search`), so
what a study records, and how a run killed mid-way goes on, is the same as one after another.

A study that reads a file another study of the suite writes (its task's largest budget measures
the rates its other budgets read, ``rates.json``, and under ``supernet: shared`` proposes for
them, ``oneshot.json``) starts once that study has written the file and stored what it holds, not
once that study has finished (a file left from an earlier run does not count); studies start in
the suite's running order as far as that allows. Each study's own lines are printed behind
``[task budget]``. The cores are shared out: each study's torch threads, and with the ``ray``
executor (no ``concurrent`` of its own) its trials at once, are at most cores / N, so N studies
do not each take the whole machine. On a GPU, side by side needs the ``local`` executor: each
study's own Ray would pack the whole card. A study that fails leaves the others to finish,
nothing more starts, and the suite ends with one line naming it. A stop (Ctrl-C, SIGTERM, also
one sent to the whole process group) reaches each running study once, from this process; each
keeps what it finished, as when run alone, and the same command goes on.
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

from ..errors import ConfigError, error_line
from ..study.experiment import Rates
from ..study.header import StudyHeader
from ..study.records import load_study
from ..study.storage import close_storage
from .config import files_read, files_written, in_suite_terms

POLL_S = 1.0  # how often finished studies and written files are looked for
STOP_WAIT_S = 120  # for the stopped studies to keep what they finished (seconds at most, as a rule)
PR_SET_PDEATHSIG = 1  # Linux prctl: a signal for this process when its parent ends


def with_share_of_cores(exp, jobs: int, cores: int):
    """``exp`` training at most ``cores // jobs`` trials at once where it would take every core (the
    ``ray`` executor on a Ray of its own, no ``concurrent`` set)."""
    if jobs <= 1 or exp.executor != "ray" or exp.concurrent is not None or exp.ray_address:
        return exp
    return dataclasses.replace(exp, concurrent=max(1, cores // jobs))


def ready(path: Path, writer) -> bool:
    """Has the study ``writer`` written ``path`` and stored what it holds (a file left from an
    earlier run of a study made again does not count)?"""
    if not path.exists():
        return False
    try:
        study = load_study(writer.storage_url, writer.study_name)
    except ConfigError:  # not made yet
        return False
    try:
        header = StudyHeader.of(study)
        return (header.rate_calibration if path.name == Rates.FILE else header.oneshot) is not None
    finally:
        close_storage(study)


def run_side_by_side(
    studies: list,
    jobs: int,
    printer: Callable[[str], None],
    suite_name: str,
    finished: Callable[[str, str, object], None],
) -> None:
    """Run ``studies`` (task, budget, experiment; in running order), at most ``jobs`` at once, calling
    ``finished(task, budget, exp)`` in this process as each ends well. Raises ConfigError naming the
    studies that failed, once the others have ended."""
    from ..training.threads import usable_cores

    jobs = min(jobs, len(studies))
    _refuse_ray_on_a_gpu(studies, jobs)
    cores = usable_cores()[0]
    threads = max(1, cores // jobs)
    context = multiprocessing.get_context("spawn")
    writers = files_written(studies)
    waiting = [(t, b, with_share_of_cores(e, jobs, cores)) for t, b, e in studies]
    inputs = {e.study_name: files_read(e, studies) for _, _, e in studies}
    written: set[Path] = set()  # inputs found ready: a study's storage is not opened again for them
    running: dict[str, tuple[multiprocessing.process.BaseProcess, tuple]] = {}  # by study name
    failed: list[str] = []
    total = len(waiting)
    try:
        while waiting or running:
            for entry in list(waiting):
                if failed or len(running) >= jobs:
                    break
                task, budget, exp = entry
                written.update(p for p in inputs[exp.study_name] if p not in written and ready(p, writers[p]))
                missing = [p for p in inputs[exp.study_name] if p not in written]
                if missing:
                    pending = {e.study_name for _, _, e in waiting} | set(running)
                    if writers[missing[0]].study_name not in pending:  # it ended without writing it
                        waiting.remove(entry)
                        failed.append(
                            f"{task} at {budget} (study {writers[missing[0]].study_name!r} ended "
                            f"without writing {missing[0]})"
                        )
                    continue
                waiting.remove(entry)
                label = f"{task} {budget}"
                process = context.Process(target=study_process, args=(exp, label, threads), name=f"petl-nas {label}")
                process.start()
                running[exp.study_name] = (process, entry)
                printer(
                    f"suite {suite_name}: {task} at budget {budget}, study {exp.study_name!r} started "
                    f"({total - len(waiting)} of {total}; {len(running)} running side by side)"
                )
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
                    failed.append(f"{task} at {budget} ({_how_it_ended(process.exitcode)})")
            if waiting and failed and not running:
                break
            time.sleep(POLL_S)
    except BaseException:  # a stop, or an error here: the studies keep what they finished
        _stop_all(multiprocessing.active_children())
        raise
    if failed:
        unstarted = f"; not started: {', '.join(f'{t} at {b}' for t, b, _ in waiting)}" if waiting else ""
        raise ConfigError(
            f"suite {suite_name}: {len(failed)} of {total} studies failed: {'; '.join(failed)}"
            f"{unstarted} (the lines above say why; what the studies finished is kept, and the "
            f"same command goes on)"
        )


def _refuse_ray_on_a_gpu(studies, jobs: int) -> None:
    if jobs <= 1 or all(exp.executor != "ray" or exp.ray_address for _, _, exp in studies):
        return
    import torch

    if torch.cuda.is_available():
        raise ConfigError(
            f"--jobs {jobs} with the ray executor on a GPU: each study's own Ray would pack the "
            f"whole card; run the studies side by side with --executor local (each trains one "
            f"run at a time, {jobs} at a time on the card)"
        )


def _how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exit status {code}"


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


def study_process(exp, label: str, threads: int) -> None:
    """A spawned process's whole life: run one study, its lines behind ``[label]``, torch at most
    ``threads`` threads (unless OMP_NUM_THREADS says otherwise); exit 0 when it finished, 2 with one
    line when it could not (as the CLI does), 128 + the signal when stopped. It leaves the suite's
    process group, so a stop sent to the group (a terminal's Ctrl-C, ``timeout``) reaches it once,
    passed on by the suite, and it stops when the suite's process dies."""
    os.setpgrp()
    _stop_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from ..search.interrupts import caused_by_interrupt, exit_status, stops_on_signals

    prefix = f"[{label}] "

    def say(line: str, stream=sys.stdout) -> None:
        stream.write(f"{prefix}{line}\n")  # one write: lines of several studies do not mix
        stream.flush()

    try:
        with stops_on_signals():  # before torch loads: a stop while it does is said too
            from ..search.driver import run_search

            run_search(exp, printer=say)
    except KeyboardInterrupt as stop:
        say("petl-nas: interrupted; the study is kept", sys.stderr)
        sys.exit(exit_status(stop))
    except (ConfigError, OSError) as e:
        if caused_by_interrupt(e):
            say("petl-nas: interrupted; the study is kept", sys.stderr)
            sys.exit(exit_status(e))
        say(f"petl-nas: error: {in_suite_terms(error_line(e))}", sys.stderr)
        sys.exit(2)


def _stop_with_parent() -> None:
    """On Linux, SIGTERM for this process when the suite's process ends (killed outright too)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


__all__ = ["ready", "run_side_by_side", "study_process", "with_share_of_cores"]
