"""Frozen-layer reuse against recomputing the frozen layers: trial time and scores, side by side.

The same configurations, whose lowest trainable layer k runs from 0 (LoRA on every layer: nothing
to reuse, the control) to L (the head alone), each trained with `fidelity.frozen_cache_mb` off
(every layer runs at every step, dropout everywhere) and on (the embeddings and layers 0..k-1 run
once per split without dropout, then are read from memory), in a pool of one-thread worker
processes, off and on interleaved so both see the same machine load. Each worker fills its cache
once per (split, k) and reuses it across its later trials, as a search worker does; the fill is
part of the "on" trial that paid it and is shown on its own.

    python bench/frozen_reuse.py --seeds 2 --out bench/results/frozen_reuse_sst2.md
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preset_trials import ROOT, emit  # noqa: E402

LORA_QV = {
    "form": "lora",
    "position": "attn",
    "size": 8,
    "insertion": "parallel",
    "composition": "scaled",
    "scale": 2.0,
    "targets": ["q", "v"],
    "init": "lora",
}
CONFIGS = {  # name: (modules, learning rate); pooling auto (MiniLM: mean)
    "LoRA r=8 q,v on every layer": ([LORA_QV], 5e-4),
    "LoRA r=8 q,v on the top half": ([{**LORA_QV, "layers": [3, 4, 5]}], 5e-4),
    "LoRA r=8 q,v on the top layer": ([{**LORA_QV, "layers": [5]}], 1e-3),
    "the head alone (a linear probe)": ([], 3e-3),
}


def jobs(args) -> list[dict]:
    out = []
    for seed in range(args.seeds):
        for name, (modules, lr) in CONFIGS.items():
            for mb in (0, args.cache_mb):
                recipe = {
                    "lr": lr,
                    "epochs": args.epochs,
                    "batch_size": 32,
                    "max_length": 64,
                    "seed": seed,
                    "evals_per_epoch": 0,
                    "length_buckets": 16,
                    "frozen_cache_mb": mb,
                }
                spec = {
                    "backbone": args.model,
                    "task": args.task,
                    "config": {"modules": modules},
                    "recipe": recipe,
                    "data_dir": args.data_dir,
                    "k": args.k,
                    "data_seed": 111,
                    "search_dev": 1000,
                }
                out.append({"config": name, "seed": seed, "reuse": bool(mb), "spec": spec})
    return out


def run(job: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from petl_nas.search.worker import TrialSpec, run_trial

    start = time.perf_counter()
    r = run_trial(TrialSpec(**job["spec"]))
    info = r.get("frozen") or {}
    return {
        **{k: v for k, v in job.items() if k != "spec"},
        "score": r["score"],
        "train_s": r["train_s"],
        "wall_s": time.perf_counter() - start,
        "layer": info.get("layer", 0),
        "fill_s": info.get("fill_s", 0.0),
        "cached": all(info.get("cached", {}).values()) if info else False,
        "pid": os.getpid(),
    }


def _scores(rows: list[dict]) -> str:
    return ", ".join(f"{r['score']:.3f}" for r in rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--epochs", type=float, default=10)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--cache-mb", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, maxtasksperchild=None) as pool:
        rows = pool.map(run, jobs(args), chunksize=1)
    wall = time.perf_counter() - start
    lines = [
        f"# Frozen-layer reuse against recomputing the frozen layers ({datetime.date.today()})",
        "",
        f"{args.model}, {args.task} K={args.k}, {args.epochs:g} epochs, batch 32, length 64, length buckets 16, "
        f"one evaluation of 1,000 search-dev rows; {args.seeds} seed(s); {args.workers} one-thread workers, "
        f"off and on interleaved; {wall / 60:.1f} min in all.",
        "",
        "| configuration | lowest trainable layer | trial time off (s) | trial time on (s) | of which filling (s) "
        "| speed-up | score off | score on |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in CONFIGS:
        off = [r for r in rows if r["config"] == name and not r["reuse"]]
        on = [r for r in rows if r["config"] == name and r["reuse"]]
        t_off, t_on = statistics.mean(r["train_s"] for r in off), statistics.mean(r["train_s"] for r in on)
        lines.append(
            f"| {name} | {on[0]['layer']} | {t_off:.1f} | {t_on:.1f} | {statistics.mean(r['fill_s'] for r in on):.1f} "
            f"| {t_off / t_on:.2f}x | {_scores(off)} | {_scores(on)} |"
        )
    diffs = [
        b["score"] - a["score"]
        for a in rows
        if not a["reuse"]
        for b in rows
        if b["reuse"] and b["config"] == a["config"] and b["seed"] == a["seed"] and b["layer"] > 0
    ]
    if diffs:
        spread = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        lines += [
            "",
            f"Score on minus off where something was reused: {100 * statistics.mean(diffs):+.2f} ± "
            f"{100 * spread:.2f} points over {len(diffs)} pairs (dropout below the lowest trainable layer is "
            "off with reuse on, so equal scores are not expected, only equal within seed noise).",
        ]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
