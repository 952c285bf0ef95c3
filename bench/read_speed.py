"""How long the read-only commands take to open a study, against plain Optuna, side by side.

Issue 90 asks `export --list` to come within 2x of ``optuna.load_study(...).best_trials`` on the same
study. Each command runs as a fresh process, as a user runs it (interpreter start and imports
included): plain Optuna's ``load_study(...).best_trials``, ``petl-nas export --list`` and ``petl-nas
report``, the last two once per code tree given with ``--code LABEL=PATH`` (PYTHONPATH=PATH, so the
same run can time main's code beside a branch's). The rounds interleave every command, so a load on
the machine falls on all of them alike; the table gives each command's median and its ratio to plain
Optuna's. Without ``--storage`` it first makes a small quickstart study in a temporary folder
(``petl-nas quickstart --demo --executor local`` with 4 trials of K=100 for 1 epoch, no final
re-evaluation: a minute or two on 2 cores).

    python bench/read_speed.py [--storage URL] [--code after=. --code before=/work/main] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTUNA = "import optuna, sys; s = optuna.load_study(study_name=None, storage=sys.argv[1]); print(len(s.best_trials))"


def quickstart_study(work: Path, code: Path) -> str:
    """A small quickstart study made in ``work`` with the code at ``code``; its storage URL."""
    flags = [
        "quickstart",
        "--demo",
        "--executor",
        "local",
        "--trials",
        "4",
        "--k",
        "100",
        "--epochs",
        "1",
        "--final-seeds",
        "0",
    ]
    subprocess.run(
        [sys.executable, "-m", "petl_nas.app.cli", *flags],
        cwd=work,
        env=_env(code),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return f"sqlite:///{work}/runs/quickstart_demo/study.db"


def _env(code: Path | None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return env


def timed(argv: list[str], code: Path | None, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=cwd, env=_env(code), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", help="the study's URL (default: make a small quickstart study)")
    ap.add_argument(
        "--code", action="append", help="LABEL=PATH of a code tree to time (repeatable; default this checkout)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    trees = dict(c.split("=", 1) for c in args.code) if args.code else {"this checkout": str(ROOT)}
    trees = {label: Path(path).resolve() for label, path in trees.items()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, path in trees.items():
            found = subprocess.run(
                [sys.executable, "-c", "import petl_nas; print(petl_nas.__file__)"],
                cwd=work,
                env=_env(path),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if not found.startswith(str(path)):
                raise SystemExit(f"--code {label}={path}: petl_nas is imported from {found}, not from there")
        storage = args.storage or quickstart_study(work, next(iter(trees.values())))
        runs = {("plain Optuna: load_study(...).best_trials", None): ["-c", OPTUNA, storage]}
        for label, path in trees.items():
            runs[("petl-nas export --list", label)] = [
                "-m",
                "petl_nas.app.cli",
                "export",
                "--list",
                "--storage",
                storage,
            ]
            runs[("petl-nas report", label)] = [
                "-m",
                "petl_nas.app.cli",
                "report",
                "--storage",
                storage,
                "-o",
                str(work / f"report-{len(runs)}"),
            ]
        times: dict = {key: [] for key in runs}
        for r in range(args.rounds):
            for (what, label), command in runs.items():
                times[(what, label)].append(timed(command, trees.get(label), work))
            print(
                f"round {r + 1} of {args.rounds}: "
                + ", ".join(f"{w.split(':')[0]}{f' ({l})' if l else ''} {t[-1]:.2f} s" for (w, l), t in times.items()),
                flush=True,
            )
    base = statistics.median(times[next(iter(runs))])
    lines = [
        f"# Read-only commands against plain Optuna ({datetime.date.today()})",
        "",
        f"Study: {'the one given, ' + storage if args.storage else 'a small quickstart study made for the run'}."
        f" Each command a fresh process; {args.rounds} interleaved rounds, medians.",
        "",
        "| command | code | median (s) | min–max (s) | × plain Optuna |",
        "|---|---|---:|---:|---:|",
    ]
    for (what, label), t in times.items():
        lines.append(
            f"| {what} | {label or '-'} | {statistics.median(t):.2f} | {min(t):.2f}–{max(t):.2f} | "
            f"{statistics.median(t) / base:.2f} |"
        )
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
