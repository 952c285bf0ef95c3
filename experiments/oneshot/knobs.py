"""A knob search's runs and how well its inherited scores foretold the trained ones (issue 16).

Reads a study searched with ``oneshot.runs`` > 1 and prints, as Markdown: each supernet run (its
knobs, the inherited hypervolume it was chosen by, its cost), and for the chosen run each proposal's
inherited search-dev score (the supernet's own weights) beside the score it reached trained from
scratch as a trial, their Spearman correlation, and the hypervolume of the trained proposals in
the study's coordinates (`fronts.group_hypervolumes`). It reads search scores only.

    python experiments/oneshot/knobs.py --storage sqlite:///runs/sst2_oneshot_v9_knobs/study.db
"""

from __future__ import annotations

import argparse

import optuna
from scipy.stats import spearmanr

from petl_nas.study.fronts import group_hypervolumes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", help="the study's name (default: the storage's only study without ':')")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = args.study or next(n for n in optuna.get_all_study_names(args.storage) if ":" not in n)
    study = optuna.load_study(study_name=name, storage=args.storage)
    record = study.user_attrs["oneshot"]
    search = record["knob_search"]
    ranges = [k for k in search["runs"][0]["knobs"] if len({r["knobs"][k] for r in search["runs"]}) > 1]
    print(f"## {name}: {len(search['runs'])} supernet runs, {record['cost_s'] / 60:.1f} min in all\n")
    print("| run | " + " | ".join(ranges) + " | supernet search-dev | inherited hypervolume | cost |")
    print("|---:|" + "---:|" * len(ranges) + "---:|---:|---:|")
    for r in search["runs"]:
        mark = " (chosen)" if r["number"] == search["chosen"] else ""
        print(
            f"| {r['number']}{mark} | "
            + " | ".join(f"{r['knobs'][k]:.3g}" for k in ranges)
            + f" | {r['score']:.4f} | {r['hypervolume']:.4f} | {r['cost_s']:.0f} s |"
        )
    trained = {
        t.user_attrs["deployable"]: t.values[0]
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("oneshot") == record["run"] and t.values
    }
    chosen = next(r for r in search["runs"] if r["number"] == search["chosen"])
    pairs = [(d, s, trained[d]) for d, s in chosen["proposals"] if d in trained]
    print(f"\nThe chosen run's proposals (run {search['chosen']}):\n")
    print("| deployable | inherited search-dev | trained search-dev |")
    print("|---:|---:|---:|")
    for d, s, t in pairs:
        print(f"| {d:,} | {s:.3f} | {t:.3f} |")
    if len(pairs) > 2:
        rho = spearmanr([s for _, s, _ in pairs], [t for _, _, t in pairs]).statistic
        print(f"\nSpearman (inherited, trained): {rho:.2f} over {len(pairs)} proposals")
    print(f"hypervolume of the trained groups: {group_hypervolumes(study)}")


if __name__ == "__main__":
    main()
