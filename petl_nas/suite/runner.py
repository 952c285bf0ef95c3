"""Run a suite: its studies one after another, then its table (`cells`) in ``runs/<suite>/``.

Each study is an ordinary search (`petl_nas.search.driver.run_search`), so a suite run again after a
kill resumes where it stopped: finished studies train nothing (their trials, confirmations and final
runs are in their storage) but the final runs a newer version asks for, and the interrupted one
goes on from its last finished trial. The table is rewritten after every study, so it shows what
has been measured so far (the studies not run yet, and those still running, as rows that say so;
the macro-average says over how many tasks it is).
With ``jobs`` above 1 the studies run side by side (`petl_nas.suite.jobs`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..console import say
from ..errors import ConfigError
from ..fileio import atomic_write
from ..study.records import load_study, run_state
from ..study.storage import close_storage
from . import cells as table
from .config import Suite, in_suite_terms
from .plan import check_plan


def run_suite(suite: Suite, printer=None, train: bool = True, jobs: int = 1) -> list[dict]:
    """Run every study of ``suite`` (``train`` False: only read those that exist), ``jobs`` at a time,
    and write the table; returns its cells. ``printer`` hears every line; with ``jobs`` above 1 only
    the suite's own, each study printing its lines to standard output from its process."""
    printer = printer or say  # each line within the width, live when piped
    studies = suite.in_running_order()
    if train:
        check_plan(suite)  # every study's input, before the first trains
    done: dict[tuple[str, str], dict] = {}  # each study read once, after it ran

    def finished(task: str, budget: str, exp) -> None:
        done[task, budget] = _cell(exp, task, budget)
        write(suite, [done.get((t, b)) or _unread(e, t, b) for t, b, e in suite.experiments()])

    if train and jobs > 1:
        from .jobs import run_side_by_side

        run_side_by_side(studies, jobs, printer, suite.name, finished)
        return [done[t, b] for t, b, _ in suite.experiments()]
    from ..search.driver import run_search  # torch: only when a suite runs here

    for i, (task, budget, exp) in enumerate(studies, 1):
        if train:
            left = time_left(list(done.values()), [b for _, b, _ in studies[i - 1 :]])
            printer(
                f"suite {suite.name}: {task} at budget {budget}, study {exp.study_name!r} ({i} of {len(studies)})"
                + (f"; {left}" if left else "")
                + (f"; its rates from {exp.rates.file}" if exp.rates.file else "")
                + (f"; its proposals from {exp.oneshot.file}" if exp.strategy != "sampler" and exp.oneshot.file else "")
            )
            try:
                run_search(exp, printer=printer)
            except ConfigError as e:  # said in the suite's terms, the error otherwise as it was
                e.args = (in_suite_terms(str(e)),)
                raise
        finished(task, budget, exp)
    return [done[t, b] for t, b, _ in suite.experiments()]


def time_left(done: list[dict], budgets_left: list[str]) -> str:
    """About how long the studies of ``budgets_left`` will take, judged by the wall time of the
    studies ``done`` (their cells): each as the mean of those done at its budget, else of all done
    (a study's cost is mostly its budget's: a 0.5% study trains more and larger configurations
    than a 0.01% one). "" while none has a wall time."""
    timed = [c for c in done if c.get("wall_min") is not None]
    if not timed or not budgets_left:
        return ""
    mean = lambda cells: sum(c["wall_min"] for c in cells) / len(cells)  # noqa: E731
    minutes = sum(mean([c for c in timed if c["budget"] == b] or timed) for b in budgets_left)
    return (
        f"about {max(1, round(minutes))} min left in the suite ({len(budgets_left)} "
        f"{'study' if len(budgets_left) == 1 else 'studies'} to run, judged by the "
        f"{'one' if len(timed) == 1 else len(timed)} run so far)"
    )


def _cell(exp, task: str, budget: str) -> dict:
    try:
        study = load_study(exp.storage_url, exp.study_name)
    except ConfigError:  # not run yet (the table only reads what exists)
        return table.empty(task, budget)
    try:
        return table.cell(study, task, budget)
    finally:
        close_storage(study)


def _unread(exp, task: str, budget: str) -> dict:
    """The row of a study this run has not read yet: ``not run yet`` where it has no study, a
    finished one's cell (a suite run again reads it before it resumes it), else ``running``."""
    try:
        study = load_study(exp.storage_url, exp.study_name)
    except ConfigError:
        return table.empty(task, budget)
    try:
        return (
            table.cell(study, task, budget)
            if run_state(study) == "finished"
            else table.empty(task, budget, table.RUNNING)
        )
    finally:
        close_storage(study)


def write(suite: Suite, found: list[dict]) -> None:
    """``suite.md``, ``suite.json`` and ``suite.png`` in ``runs/<suite>/``, each replaced whole."""
    out = suite.run_dir
    out.mkdir(parents=True, exist_ok=True)
    text = table.markdown(suite.name, found)
    atomic_write(out / "suite.md", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    data = json.dumps({"suite": suite.name, "cells": found, "macro": table.macro(found)}, indent=1)
    atomic_write(out / "suite.json", lambda tmp: Path(tmp).write_text(data, encoding="utf-8"))
    png = table.plot_png(found)
    atomic_write(out / "suite.png", lambda tmp: Path(tmp).write_bytes(png))


__all__ = ["run_suite", "time_left", "write"]
