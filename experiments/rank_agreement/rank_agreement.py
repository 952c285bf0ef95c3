"""Does search-dev rank configurations the way the test split does? (issue 14)

The SST-2 and STS-B v5 studies picked trials that led LoRA r=8 on search-dev on every seed and
trailed it on test. Search-dev is carved from the *training* file; GLUE's test split here is its
dev file, which can be drawn differently (SST-2 trains on phrases and is tested on whole
sentences). This experiment measures how much that matters. Every learned trial of a finished
study is trained again with the trial recipe for a few seeds, and each run is scored on

- search-dev (what the search ranked by), and
- two fixed random halves A and B of the test split.

Half B is the referee. If half A, drawn like the test split, ranks the trials on half B much
better than search-dev does, the search should score on data drawn like its target (the
protocol of Compacter and UniPELT for small GLUE sets: half of dev to choose, half to report).
If neither ranks well, the good configurations are within noise of each other and no protocol
will find a margin. Nothing here feeds a decision of the product: it is a measurement.

Two steps, so the training can run where it is cheap (a GPU, through the `device` tool):

    python experiments/rank_agreement/rank_agreement.py jobs --experiment experiments/sst2_minilm/v5/experiment.yaml \\
        --storage sqlite:///runs/sst2_minilm_v5/study.db --seeds 0,1 --out jobs_sst2.json
    python experiments/rank_agreement/rank_agreement.py run jobs_sst2.json --workers 8 --out runs_sst2.json
    python experiments/rank_agreement/rank_agreement.py report runs_sst2.json [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HALVES_SEED = 20261124


# --- jobs: what to train, read from a finished study ------------------------------------------------


def make_jobs(args) -> list[dict]:
    """One job per (learned trial, seed), with the study's trial recipe and the trial's own rate."""
    import optuna

    from petl_nas.study.experiment import Experiment
    from petl_nas.training.loop import Recipe

    exp = Experiment.load(args.experiment)
    fid = exp.fidelity
    study = optuna.load_study(study_name=args.study or exp.study_name, storage=args.storage)
    jobs = []
    for t in study.get_trials(deepcopy=False):
        if t.state != optuna.trial.TrialState.COMPLETE or t.user_attrs.get("did_not_learn"):
            continue
        for seed in args.seeds:
            recipe = Recipe(
                epochs=fid.epochs,
                batch_size=fid.batch_size,
                max_length=fid.max_length,
                evals_per_epoch=0,
                seed=seed,
                max_steps=fid.max_steps,
                eval_rows=fid.eval_rows,
                length_buckets=fid.length_buckets,
                lr=t.user_attrs["recipe"]["lr"],
            )
            spec = {
                "backbone": args.backbone or exp.backbone,
                "task": exp.task,
                "config": t.user_attrs["petl_config"],
                "recipe": recipe.to_dict(),
                "data_dir": args.data_dir or exp.data_dir,
                "k": fid.k,
                "data_seed": exp.data_seed,
                "search_dev": fid.search_dev,
                "number": t.number,
                "score": fid.score,
            }
            jobs.append(
                {
                    "trial": t.number,
                    "seed": seed,
                    "preset": t.user_attrs.get("preset"),
                    "source": source(t.user_attrs),
                    "deployable": t.user_attrs.get("deployable"),
                    "study_score": t.values[0],
                    "spec": spec,
                }
            )
    return jobs


def source(attrs: dict) -> str:
    """Where a trial came from: a preset, the LoRA rank sweep, the supernet or the sampler."""
    if attrs.get("preset"):
        return attrs["preset"]
    return "sweep" if attrs.get("baseline") else "one-shot" if attrs.get("oneshot") else "sampler"


# --- run: train each job, score it on search-dev and both halves ------------------------------------


def halves(n: int) -> tuple[list[int], list[int]]:
    """Two fixed random halves of ``n`` test rows (the same for every run and every machine)."""
    import torch

    order = torch.randperm(n, generator=torch.Generator().manual_seed(HALVES_SEED)).tolist()
    return sorted(order[: n // 2]), sorted(order[n // 2 :])


def rows_of(split, index: list[int]):
    """The rows ``index`` of an encoded classification or regression split."""
    from petl_nas.tasks.encoding import EncodedSplit

    pick = lambda rows: tuple(rows[i] for i in index) if rows is not None else None  # noqa: E731
    return EncodedSplit(pick(split.input_ids), pick(split.token_type_ids), split.labels[index], split.pad_token_id)


def run_job(job: dict) -> dict:
    """Train one job in this worker process; its scores on search-dev, test, halves A and B."""
    import torch

    from petl_nas.core.config import PetlConfig
    from petl_nas.search.worker import TrialSpec, prepare
    from petl_nas.training.loading import TrainData, petl_copy
    from petl_nas.training.loop import Recipe, evaluate, train

    torch.set_num_threads(job.get("threads", 1))
    start = time.perf_counter()
    spec = TrialSpec(**job["spec"])
    task, base, _, encoded = prepare(spec)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = petl_copy(base, PetlConfig.from_dict(spec.config), int(spec.recipe["seed"]))
    recipe = Recipe(**spec.recipe)
    result = train(model, TrainData(encoded.train, encoded.search_dev), task, recipe, device)
    a, b = halves(len(encoded.test))
    metric = task.main_metric
    score = lambda split: evaluate(model, split, task, recipe.batch_size, device)[metric]  # noqa: E731
    return {
        **{k: v for k, v in job.items() if k not in ("spec", "threads")},
        "metric": metric,
        "search": result.last_score,
        "test": score(encoded.test),
        "half_a": score(rows_of(encoded.test, a)),
        "half_b": score(rows_of(encoded.test, b)),
        "train_s": result.wall_s,
        "wall_s": time.perf_counter() - start,
    }


def run_all(jobs: list[dict], workers: int, threads: int, out: Path) -> list[dict]:
    """Every job in a pool of ``workers`` processes (several share one GPU); results as they finish,
    written after each so a cut-off run keeps what it has."""
    import multiprocessing as mp

    done = json.loads(out.read_text()) if out.exists() else []
    seen = {(r["trial"], r["seed"]) for r in done}
    todo = [{**j, "threads": threads} for j in jobs if (j["trial"], j["seed"]) not in seen]
    print(f"{len(done)} runs already done, {len(todo)} to train with {workers} workers", flush=True)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        for r in pool.imap_unordered(run_job, todo):
            done.append(r)
            out.write_text(json.dumps(done, indent=1))
            print(
                f"[{time.perf_counter() - start:6.0f}s] trial {r['trial']:3d} seed {r['seed']}: search "
                f"{r['search']:.4f}  test {r['test']:.4f}  A {r['half_a']:.4f}  B {r['half_b']:.4f}  "
                f"({r['train_s']:.0f}s)",
                flush=True,
            )
    return done


# --- report: how well each score ranks the trials on half B -----------------------------------------


def _paired(a: list[dict], b: list[dict], key: str) -> tuple[float, float]:
    """Mean and std over shared seeds of a's score minus b's (points)."""
    bs = {r["seed"]: r[key] for r in b}
    diffs = [100 * (r[key] - bs[r["seed"]]) for r in a if r["seed"] in bs]
    return statistics.fmean(diffs), statistics.stdev(diffs) if len(diffs) > 1 else 0.0


def report(runs: list[dict]) -> str:
    """Per ranking score: its Spearman correlation with half B (all trials, and the better half), its
    pick against the best preset by the same score, paired by seed on half B and on the whole test."""
    from petl_nas.tasks.metrics import spearman

    by_trial: dict[int, list[dict]] = {}
    for r in runs:
        by_trial.setdefault(r["trial"], []).append(r)
    rows = []
    for number, rs in sorted(by_trial.items()):
        mean = lambda key: statistics.fmean(r[key] for r in rs)  # noqa: E731
        rows.append(
            {
                "trial": number,
                "source": rs[0]["source"],
                "preset": rs[0]["preset"],
                "runs": rs,
                "deployable": rs[0]["deployable"],
                "seeds": len(rs),
                "study": rs[0]["study_score"],
                **{k: mean(k) for k in ("search", "half_a", "half_b", "test")},
            }
        )
    better = sorted(rows, key=lambda r: -r["half_b"])[: max(3, len(rows) // 2)]
    presets = [r for r in rows if r["preset"]]
    names = {
        "study": "the study's one search score",
        "search": "mean search-dev score",
        "half_a": "mean half-A score (drawn like the test split)",
        "half_b": "mean half-B score itself (the ceiling: no rule can pick better)",
    }
    out = [
        f"{len(rows)} trials x {max(r['seeds'] for r in rows)} seeds, metric {runs[0]['metric']}, test halves "
        f"drawn with seed {HALVES_SEED}. Spearman: with the mean half-B score, over all trials and over "
        f"the better half ({len(better)} trials by half B). Δ: the pick minus the best preset by the same "
        "score, in points, mean ± std over paired seeds.",
        "",
        "| ranked by | Spearman, all | Spearman, better half | its pick | best preset by it "
        "| Δ on half B | Δ on the whole test |",
        "|---|---:|---:|---|---|---:|---:|",
    ]
    for key, name in names.items():
        corr = lambda group: spearman([r[key] for r in group], [r["half_b"] for r in group])  # noqa: E731
        pick = max(rows, key=lambda r: r[key])
        preset = max(presets, key=lambda r: r[key]) if presets else None
        cells = [
            name,
            "-" if key == "half_b" else f"{corr(rows):.3f}",
            "-" if key == "half_b" else f"{corr(better):.3f}",
            f"trial {pick['trial']} ({pick['source']}, {pick['deployable']:,})",
        ]
        if preset:
            cells += [preset["preset"]] + [
                "{:+.2f} ± {:.2f}".format(*_paired(pick["runs"], preset["runs"], k)) for k in ("half_b", "test")
            ]
        else:
            cells += ["-", "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "| trial | source | deployable | study score | search-dev mean | half A | half B | test |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: -r["half_b"]):
        out.append(
            f"| {r['trial']} | {r['source']} | {r['deployable']:,} | {r['study']:.4f} | {r['search']:.4f} "
            f"| {r['half_a']:.4f} | {r['half_b']:.4f} | {r['test']:.4f} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    j = sub.add_parser("jobs", help="write the jobs of a finished study")
    j.add_argument("--experiment", required=True)
    j.add_argument("--storage", required=True)
    j.add_argument("--study")
    j.add_argument("--seeds", default="0,1", type=lambda s: [int(x) for x in s.split(",")])
    j.add_argument("--backbone", help="override the experiment's backbone (a path on the machine that runs)")
    j.add_argument("--data-dir", help="override the experiment's data_dir (a path on the machine that runs)")
    j.add_argument("--out", required=True)
    r = sub.add_parser("run", help="train the jobs; results appended to --out as they finish")
    r.add_argument("jobs")
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    r.add_argument("--out", required=True)
    p = sub.add_parser("report", help="the ranking table of finished runs")
    p.add_argument("runs")
    p.add_argument("--out")
    args = ap.parse_args(argv)
    if args.command == "jobs":
        jobs = make_jobs(args)
        Path(args.out).write_text(json.dumps(jobs, indent=1))
        print(f"{len(jobs)} jobs written to {args.out}")
    elif args.command == "run":
        run_all(json.loads(Path(args.jobs).read_text()), args.workers, args.threads, Path(args.out))
    else:
        text = report(json.loads(Path(args.runs).read_text()))
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
