"""How far to trust the latencies a study measured: each trial's configuration timed again, quietly.

Trials time their deployed form beside whatever else runs (on 2 cores, the other trial). This
script rebuilds every complete trial's configuration on the study's backbone in one process, one
thread, merges what `costs.deployed_latency_ms` merges, and times the same 8 search-dev rows in
interleaved rounds (each round times every configuration once, so drift hits all alike); it prints
the quiet median beside the study's figure and the rank correlation between the two.

    python experiments/latency_check.py --storage sqlite:///runs/sst2_latency/study.db [--rounds 15]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import optuna
import torch
from optuna.trial import TrialState
from scipy.stats import spearmanr

from petl_nas.config import PetlConfig
from petl_nas.costs import LATENCY_BATCH, deployed_latency_ms
from petl_nas.data import encode
from petl_nas.inject import apply_petl
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.worker import load_backbone


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", required=True)
    p.add_argument("--study")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    a = study.user_attrs
    task = resolve_task(a.get("task_spec") or a["task"])
    fid = a["fidelity"]
    splits = load_splits(task, data_dir=a.get("data_dir"), k=fid.get("k"), data_seed=a.get("data_seed", 111),
                         search_dev_size=fid["search_dev"])
    base, tok = load_backbone(json.loads(a["backbone"]), task, splits)
    batch = next(iter(encode(splits, tok, fid["max_length"]).search_dev.batches(LATENCY_BATCH, shuffle=False)))
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    models = {}
    for t in trials:
        torch.manual_seed(0)
        model = apply_petl(copy.deepcopy(base), PetlConfig.from_dict(t.user_attrs["petl_config"]))
        deployed_latency_ms(model, batch, "cpu", repeats=1)       # merges, warms up
        models[t.number] = model
    times = {n: [] for n in models}
    for _ in range(args.rounds):
        for n, model in models.items():
            times[n].append(deployed_latency_ms(model, batch, "cpu", repeats=1))
    rows = sorted(trials, key=lambda t: statistics.median(times[t.number]))
    print("| trial | configuration | in the study, ms | quiet, ms (median of %d) |" % args.rounds)
    print("| ---: | --- | ---: | ---: |")
    for t in rows:
        print(f"| {t.number} | {t.user_attrs.get('preset') or t.user_attrs['config_text'][:60]} | "
              f"{t.user_attrs['latency_ms']:.1f} | {statistics.median(times[t.number]):.1f} |")
    rho = spearmanr([t.user_attrs["latency_ms"] for t in rows], [statistics.median(times[t.number]) for t in rows])[0]
    print(f"\nSpearman rank correlation, study vs quiet: {rho:.2f} over {len(rows)} trials")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
