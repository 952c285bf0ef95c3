"""What the search benchmarks share: the product's own `petl-nas search` run in a subprocess, its
study read back, and the rates computed from it.

`gpu_packing.py` (one trial per GPU against packed trials) and `executor_overhead.py` (the local
executor against Ray) each run a search twice with different flags and compare what these give.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

STOP_GRACE_S = 60  # after SIGTERM, how long a cut search may take to fail its trials and exit


def _run(cmd: list[str], cwd: Path, limit_s: float | None) -> tuple[int, bool]:
    """Run ``cmd``; past ``limit_s`` seconds, stop it with SIGTERM, which a search takes as Ctrl-C
    (its study kept; SIGINT itself is ignored by a command started in the background of a
    non-interactive shell), and wait for it. Its exit status, and whether it was cut."""
    proc = subprocess.Popen(cmd, cwd=cwd)
    try:
        return proc.wait(timeout=limit_s), False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return proc.returncode, True


def run_search(label: str, flags: list[str], work: Path, during=None, limit_s: float | None = None) -> dict:
    """``petl-nas search FLAGS --storage sqlite:///WORK/LABEL.db --name LABEL`` in ``work``, with the
    context manager ``during`` held around it; its wall time and complete trials, with rates. Past
    ``limit_s`` seconds the search is stopped as Ctrl-C stops it, and what it completed is measured
    (``cut``: the wall time is then the limit, the rates those of the completed trials)."""
    import optuna

    storage = f"sqlite:///{work / label}.db"
    cmd = [sys.executable, "-m", "petl_nas.app.cli", "search", *flags, "--storage", storage, "--name", label]
    print(f"\n== {label}: {' '.join(cmd[2:])}", flush=True)
    start = time.perf_counter()
    with during or contextlib.nullcontext():
        returncode, cut = _run(cmd, work, limit_s)
    wall = limit_s if cut else time.perf_counter() - start
    if returncode and not (cut and returncode in (130, -signal.SIGKILL)):  # stopped, or killed after the grace
        raise SystemExit(f"the {label} search exited {returncode}")
    study = optuna.load_study(study_name=label, storage=storage)
    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.number)
    ends = sorted(t.datetime_complete for t in done)
    span = (ends[-1] - ends[0]).total_seconds() if len(ends) > 1 else 0.0
    # the second half of the completions: in a packed search, after most workers' cold start
    half = len(ends) // 2
    late_span = (ends[-1] - ends[half]).total_seconds() if len(ends) - half > 1 else 0.0
    first_created = min((t.datetime_start for t in study.trials if t.datetime_start), default=None)
    mean = lambda key: statistics.mean(t.user_attrs[key] for t in done) if done else None  # noqa: E731
    return {
        "label": label,
        "trials": len(done),
        "wall_s": wall,
        "per_hour": 3600 * len(done) / wall,
        "cut": cut,
        # the rate a long search runs at: trials completed after the first, over that time
        "steady": 3600 * (len(ends) - 1) / span if span else None,
        "between_s": span / (len(ends) - 1) if span else None,
        "late": 3600 * (len(ends) - 1 - half) / late_span if late_span else None,
        # each trial: seconds from the first trial's creation to its end; its setup, training, wall
        "timeline": [
            (
                (t.datetime_complete - first_created).total_seconds(),
                t.number,
                t.user_attrs.get("setup_s"),
                t.user_attrs.get("train_s"),
                t.user_attrs.get("wall_s"),
            )
            for t in sorted(done, key=lambda t: t.datetime_complete)
        ]
        if first_created
        else [],
        "train_s": mean("train_s"),
        "setup_s": mean("setup_s"),
        # the first trial of a process loads the backbone and tokenises; the rest reuse both
        "first_setup_s": done[0].user_attrs["setup_s"] if done else None,
        "later_setup_s": statistics.mean(t.user_attrs["setup_s"] for t in done[1:]) if len(done) > 1 else None,
        "trial_wall_s": mean("wall_s"),
        "done": done,
        # the trials after the first: what every further trial of a long search costs
        "later_wall_s": statistics.mean(t.user_attrs["wall_s"] for t in done[1:]) if len(done) > 1 else None,
        "later_train_s": statistics.mean(t.user_attrs["train_s"] for t in done[1:]) if len(done) > 1 else None,
        # from the trial's creation to its end, less its time in the worker: waiting for a slot,
        # the worker process's start and imports, and reporting back
        "outside_s": statistics.mean(
            (t.datetime_complete - t.datetime_start).total_seconds() - t.user_attrs["wall_s"] for t in done
        )
        if done
        else None,
        "scores": [(t.number, round(t.values[0], 4)) for t in done],
    }
