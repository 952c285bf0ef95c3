"""Does the learning rate decide a trial's score? Reads studies and prints, for the trials the
sampler drew (presets and sweep points left out), the rank correlation between each trial's rate
and its search score, how much of the scores' spread a straight line in log(rate) explains, and how
the spread compares with one score's noise.

A trial's rate is its ``lr_scale`` in a study whose families train at measured rates
(`petl_nas.search.rates`), else its ``lr``. The spread beyond noise is
max(0, var(scores) - median(se)^2) / var(scores): the share of the scores' variance that one
score's sampling error cannot account for; what the rate's straight line does not explain of it is
left to structure (and to what a seed changes).

    python experiments/rates/lr_vs_score.py sqlite:///runs/rates_sst2_random/study.db#rates_sst2_random
"""

from __future__ import annotations

import argparse
import math
import statistics

import optuna
from optuna.trial import TrialState
from scipy import stats

from petl_nas.study.records import stored_trials


def measure(url: str, name: str) -> dict:
    study = optuna.load_study(study_name=name, storage=url)
    drawn = [t for t in stored_trials(study, (TrialState.COMPLETE,)) if t.params and not (t.preset or t.sweep)]
    rate = [t.lr_scale if t.lr_scale is not None else t.lr for t in drawn]
    score = [t.values[0] for t in drawn]
    rho, p = stats.spearmanr(rate, score)
    fit = stats.linregress([math.log(r) for r in rate], score)
    var = statistics.pvariance(score)
    se = statistics.median(t.score_se for t in drawn if t.score_se is not None)
    beyond = max(0.0, var - se**2) / var if var else 0.0
    return {
        "study": name,
        "trials": len(drawn),
        "by": "lr_scale" if drawn and drawn[0].lr_scale is not None else "lr",
        "range": (min(rate), max(rate)),
        "rho": rho,
        "p": p,
        "r2": fit.rvalue**2,
        "sd": math.sqrt(var),
        "se": se,
        "beyond": beyond,
        "structure": max(0.0, beyond - fit.rvalue**2),
        "scores": (min(score), max(score)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", help="URL#STUDY")
    args = parser.parse_args()
    print(
        "| study | drawn trials | rate | its range | Spearman ρ (p) | R² of log rate | scores | sd of scores "
        "| median se | variance beyond noise | beyond noise, not the rate |"
    )
    print("| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for source in args.studies:
        url, _, name = source.partition("#")
        m = measure(url, name)
        print(
            f"| {m['study']} | {m['trials']} | {m['by']} | {m['range'][0]:.3g}–{m['range'][1]:.3g} | "
            f"{m['rho']:+.2f} ({m['p']:.2g}) | {m['r2']:.2f} | {m['scores'][0]:.3f}–{m['scores'][1]:.3f} | "
            f"{m['sd']:.4f} | {m['se']:.4f} | {m['beyond']:.0%} | {m['structure']:.0%} |"
        )


if __name__ == "__main__":
    main()
