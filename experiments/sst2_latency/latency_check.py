"""How far to trust the latencies a study measured: each trial's configuration timed again, quietly.

Trials time their deployed form beside whatever else runs (on 2 cores, the other trial). This
script times every complete trial's deployed form again with `petl_nas.deploy.retime` (what `export
--pick fastest-within` runs on its candidates), in one process and one thread, in interleaved
rounds (each round times every configuration once, so drift hits all alike); it prints the quiet
median beside the study's figure and the rank correlation between the two.

    python experiments/sst2_latency/latency_check.py --storage sqlite:///runs/sst2_latency/study.db [--rounds 15]
"""

from __future__ import annotations

import argparse

import optuna
import torch
from optuna.trial import TrialState
from scipy.stats import spearmanr

from petl_nas.deploy.retime import retime


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", required=True)
    p.add_argument("--study")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    quiet = retime(study, trials, rounds=args.rounds, device="cpu", limit=len(trials))  # as export does
    trials = [t for t in trials if t.number in quiet]  # (those whose backbone copies fit)
    rows = sorted(trials, key=lambda t: quiet[t.number])
    print("| trial | configuration | in the study, ms | quiet, ms (median of %d) |" % args.rounds)
    print("| ---: | --- | ---: | ---: |")
    for t in rows:
        print(
            f"| {t.number} | {t.user_attrs.get('preset') or t.user_attrs['config_text'][:60]} | "
            f"{t.user_attrs['latency_ms']:.1f} | {quiet[t.number]:.1f} |"
        )
    rho = spearmanr([t.user_attrs["latency_ms"] for t in rows], [quiet[t.number] for t in rows])[0]
    print(f"\nSpearman rank correlation, study vs quiet: {rho:.2f} over {len(rows)} trials")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
