"""Confirmation one after another against side by side, on a real study, in one run.

Owns one measurement (issue 51's "affordable", issue 52's "speed of the loop"). A finished suite
study's database is copied twice and its confirmation (``confirm:*`` attributes) is removed from
both copies; then `petl_nas.search.confirm.confirm` re-scores the same candidates with the same
seeds on each copy, one layout after the other:

- **one after another**: the old path (and the ``local`` executor's): every run in this process,
  at the threads `threads.use_threads` chooses (2 on 2 quiet cores);
- **side by side**: the new default with the ``ray`` executor: a pool of spawned processes, one
  thread each (`petl_nas.search.side_by_side`).

Printed: each layout's wall time, the ratio, and each candidate's confirmed scores under both (a
thread count may change the order of float sums, so scores may differ in the last digits).

Run on a quiet machine, after a suite has run (about 15 minutes for SST-2's 0.05% study):

    HF_HUB_OFFLINE=1 python bench/confirm_side_by_side.py --suite suites/budgets.yaml --task sst2
        --budget 0.05% [--out bench/results/confirm_side_by_side.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import optuna

from petl_nas.search import calibrate, confirm
from petl_nas.search.specs import trial_recipe
from petl_nas.suite.config import Suite

LAYOUTS = (("one after another", "local"), ("side by side", "ray"))


def unconfirmed_copy(db: Path, to: Path) -> str:
    """``db`` copied to ``to`` without its confirmation; the copy's SQLite URL."""
    shutil.copy(db, to)
    with sqlite3.connect(to) as con:
        con.execute("DELETE FROM study_user_attributes WHERE key LIKE 'confirm%'")
    return f"sqlite:///{to}"


def confirm_on(exp, storage: str, executor: str) -> tuple[float, dict, str]:
    """(wall seconds, {trial: confirmed scores}, the layout line confirmation printed)."""
    study = optuna.load_study(study_name=exp.study_name, storage=storage)
    recorded = study.user_attrs["fidelity"]  # as `run_search` resumes it: the recipe the study recorded
    fidelity = dataclasses.replace(
        exp.fidelity, length_buckets=recorded["length_buckets"], precision=recorded.get("precision", "auto")
    )
    run, _ = calibrate.resolve(
        study,
        dataclasses.replace(exp, storage=storage, executor=executor, fidelity=fidelity),
        None,
        None,
        None,
        printer=lambda line: None,
    )  # and the trial length it recorded
    lines: list[str] = []
    began = time.perf_counter()
    confirm.confirm(study, run, trial_recipe(run), printer=lambda line: (lines.append(line), print(line, flush=True)))
    wall = time.perf_counter() - began
    study = optuna.load_study(study_name=exp.study_name, storage=storage)
    scores = {int(k.split(":")[1]): v for k, v in study.user_attrs.items() if k.startswith("confirm:")}
    return wall, scores, next((line for line in lines if line.startswith("confirming ")), "")


def table(exp, walls: dict, scores: dict, said: dict) -> str:
    first, second = (name for name, _ in LAYOUTS)
    out = [
        f"# Confirmation one after another vs side by side ({datetime.date.today()})",
        "",
        f"Study `{exp.study_name}` (its trials as the suite trained them); the same candidates and seeds "
        f"confirmed twice on copies of its database, one layout after the other, in one run.",
        "",
    ]
    out += [f"- {name}: `{said[name]}`" for name, _ in LAYOUTS] + [""]
    out += ["| layout | wall, min | runs |", "| --- | ---: | ---: |"]
    for name, _ in LAYOUTS:
        runs = sum(len(v) - 1 for v in scores[name].values())
        out.append(f"| {name} | {walls[name] / 60:.2f} | {runs} |")
    out += [
        "",
        f"**{walls[first] / walls[second]:.2f}x faster** side by side.",
        "",
        f"| trial | {first} | {second} |",
        "| ---: | --- | --- |",
    ]
    for n in sorted(scores[first]):
        fmt = lambda v: ", ".join(f"{x:.4f}" for x in v)  # noqa: E731
        out.append(f"| {n} | {fmt(scores[first][n])} | {fmt(scores[second].get(n, []))} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--budget", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    exp = next(e for t, b, e in Suite.load(args.suite).experiments() if (t, b) == (args.task, args.budget))
    db = Path(exp.storage_url.removeprefix("sqlite:///"))
    walls, scores, said = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, executor in LAYOUTS:
            url = unconfirmed_copy(db, Path(tmp) / f"{executor}.db")
            walls[name], scores[name], said[name] = confirm_on(exp, url, executor)
    text = table(exp, walls, scores, said)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
