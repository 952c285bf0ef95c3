"""The ceiling under a study's final recipe: full fine-tuning with the same head, data and schedule.

Issue 14's bar for SST-2 is a pick >= 1.0 point above the best preset and >= 84.0. This measures
what the backbone reaches when *every* weight trains, with the head the presets use (``pooling:
auto``: mean pooling for all-MiniLM-L6-v2), the experiment's final recipe (its fidelity with
``final.epochs``, one evaluation at the end) and the same training rows. Learning rates are chosen
on search-dev (mean over the seeds), never on test; test (the task's dev file) is then reported
for every rate, per seed, beside a configuration of the study trained the same way (LoRA r=8 on
q, v by default) so the paired difference is measured in one run.

    python experiments/ceiling/ceiling.py --experiment experiments/sst2_minilm/v5/experiment.yaml \
        --lrs 2e-5,5e-5,1e-4 --seeds 0,1,2 --out experiments/ceiling_sst2.md

Each (configuration, rate, seed) is one run: trained once, scored at its end on search-dev (the
choice) and on test (the report); training reads neither. Runs go to ``--jobs`` one-thread
processes.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from petl_nas.core.config import PetlConfig
from petl_nas.core.inject import apply_petl
from petl_nas.core.presets import preset, preset_lr
from petl_nas.search.specs import final_recipe, trial_recipe
from petl_nas.search.worker import TrialSpec, prepare
from petl_nas.study.experiment import Experiment
from petl_nas.training.loading import TrainData
from petl_nas.training.loop import evaluate, train


def run(experiment: str, what: str, lr: float, seed: int, threads: int) -> dict:
    """Train ``what`` (``full`` or a preset name) once; its search-dev and test scores at the end."""
    torch.set_num_threads(threads)
    exp = Experiment.load(experiment)
    recipe = final_recipe(exp, trial_recipe(exp), lr, seed)  # what the study's finals train
    spec = TrialSpec(
        backbone=exp.backbone,
        task=exp.task,
        config={},
        recipe=recipe.to_dict(),
        data_dir=exp.data_dir,
        k=exp.fidelity.k,
        data_seed=exp.data_seed,
        search_dev=exp.fidelity.search_dev,
    )
    task, base, _, encoded = prepare(spec)
    torch.manual_seed(seed)
    config = PetlConfig() if what == "full" else preset(what, base.config)
    model = apply_petl(copy.deepcopy(base), config)
    if what == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    start = time.perf_counter()
    result = train(model, TrainData(encoded.train, encoded.search_dev), task, recipe)
    test = evaluate(model, encoded.test, task, recipe.eval_batch_size, "cpu")
    return {
        "what": what,
        "lr": lr,
        "seed": seed,
        "search_dev": result.last_score,
        "test": test[task.main_metric],
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "cpu_s": round(time.perf_counter() - start, 1),
    }


def table(rows: list[dict], reference: str) -> str:
    """Per configuration and rate: search-dev and test means, per-seed test, paired Δ to ``reference``
    at its rate chosen on search-dev."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["what"], r["lr"]), []).append(r)
    chosen = {}
    for (what, lr), rs in groups.items():
        mean = statistics.fmean(r["search_dev"] for r in rs)
        if what not in chosen or mean > chosen[what][1]:
            chosen[what] = (lr, mean)
    ref = {r["seed"]: r["test"] for r in groups[(reference, chosen[reference][0])]} if reference in chosen else {}
    lines = [
        "| configuration | lr | trainable | search-dev, mean | test, mean ± std | test per seed | paired Δ to "
        f"{reference} (points) | chosen on search-dev | CPU s per run |",
        "|---|---:|---:|---:|---|---|---|:-:|---:|",
    ]
    for (what, lr), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        test = [r["test"] for r in rs]
        sd = statistics.stdev(test) if len(test) > 1 else 0.0
        diffs = [100 * (r["test"] - ref[r["seed"]]) for r in rs if r["seed"] in ref]
        paired = f"{statistics.fmean(diffs):+.2f} ± {statistics.stdev(diffs):.2f}" if len(diffs) > 1 else "-"
        lines.append(
            f"| {what} | {lr:g} | {rs[0]['trainable']:,} | {statistics.fmean(r['search_dev'] for r in rs):.4f} "
            f"| {100 * statistics.fmean(test):.2f} ± {100 * sd:.2f} | "
            f"{', '.join(f'{100 * t:.2f}' for t in test)} | {paired} | "
            f"{'yes' if chosen[what][0] == lr else ''} | {statistics.fmean(r['cpu_s'] for r in rs):.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--lrs", default="2e-5,5e-5,1e-4", help="full fine-tuning's learning rates")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--reference", default="lora", help="a preset trained beside it at its own rate")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--records", default=None, help="a JSON-lines file of finished runs (resumed from)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    todo = [("full", float(lr), s) for lr in args.lrs.split(",") for s in seeds]
    todo += [(args.reference, preset_lr(args.reference), s) for s in seeds]
    done: list[dict] = []
    records = Path(args.records) if args.records else None
    if records and records.exists():
        done = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    have = {(r["what"], r["lr"], r["seed"]) for r in done}
    todo = [t for t in todo if t not in have]
    with cf.ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, args.experiment, w, lr, s, 1) for w, lr, s in todo]
        for f in cf.as_completed(futures):
            r = f.result()
            done.append(r)
            print(json.dumps(r), flush=True)
            if records:
                with records.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
    text = table(done, args.reference)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
