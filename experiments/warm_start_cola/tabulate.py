"""Warm start against cold start: hypervolume after the first N trained trials of each arm.

Reads the two studies of `experiments/warm_start_cola/cold.yaml` (cold) and `experiments/warm_start_cola/warm.yaml` (warm, from
the SST-2 v4 study's front) and prints, after 8 and 16 trained trials (in the order they were
proposed), each arm's hypervolume (search score up, log10 deployable parameters down, from the
trivial baseline's score and the budget: `petl_nas.study.fronts`), how many trials learned, and the best
search score. Trials that did not learn add nothing to a hypervolume.

    python experiments/warm_start_cola/tabulate.py --storage sqlite:///runs/cola_warm_start/study.db
"""

from __future__ import annotations

import argparse

import optuna
from optuna.trial import TrialState

from petl_nas.search.study import is_trained
from petl_nas.study.fronts import hypervolume, reference_from


def rows(study, checkpoints) -> list[dict]:
    trained = sorted((t for t in study.get_trials(deepcopy=False) if is_trained(t)), key=lambda t: t.number)
    a = study.user_attrs
    out = []
    for n in checkpoints:
        first = [t for t in trained[:n] if t.state == TrialState.COMPLETE]
        learned = [t for t in first if not t.user_attrs.get("did_not_learn")]
        points = [(t.values[0], t.values[1]) for t in learned]
        ref = reference_from(points or [(a["baseline"]["score"], a["budget"])], a.get("baseline"), a.get("budget"))
        out.append(
            {
                "n": min(n, len(trained)),
                "hv": hypervolume(points, ref) if points else 0.0,
                "learned": len(learned),
                "best": max((t.values[0] for t in first), default=float("nan")),
                "warm": sum(1 for t in trained[:n] if t.user_attrs.get("warm_start")),
            }
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default="sqlite:///runs/cola_warm_start/study.db")
    p.add_argument("--checkpoints", default="8,16")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    checkpoints = [int(n) for n in args.checkpoints.split(",")]
    print("| arm | trials | of them warm-started | learned | best search score | hypervolume |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for arm in ("cold", "warm"):
        study = optuna.load_study(study_name=arm, storage=args.storage)
        for r in rows(study, checkpoints):
            print(f"| {arm} | {r['n']} | {r['warm']} | {r['learned']} | {r['best']:.4f} | {r['hv']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
