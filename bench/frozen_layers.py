"""How much frozen computation a study's trials could reuse: the bound, before building it.

Owns one measurement. Hidden states below a configuration's lowest trainable module never change
during training, so they could be computed once and reused (issue 17, item 3). Whether that pays
depends on where the trials of a real search put their lowest trainable module: BitFit, trained
LayerNorms, a soft prompt or a module on every layer all train something in layer 0, and then
nothing is reusable. For each complete trial of a study this prints the lowest trainable layer k
(of L) and the share of the encoder's forward pass below it (k / L); the saving on a training
step is smaller still, since a frozen layer below k costs only its forward pass (no backward).

Run (instant; reads the study, trains nothing):

    python bench/frozen_layers.py --storage sqlite:///runs/sst2_minilm_v4/study.db [--layers 6]
"""

from __future__ import annotations

import argparse
import statistics

import optuna
from optuna.trial import TrialState

from petl_nas.core.config import PetlConfig


def lowest_trainable_layer(config: PetlConfig, n_layers: int) -> int:
    """The first layer whose computation a training step changes (0: reuse nothing)."""
    if config.bitfit or config.train_layernorms or config.prompt_length:
        return 0
    lowest = n_layers  # only the head trains: every layer is frozen
    for m in config.modules:
        lowest = min(lowest, min(config.layers_of(m, n_layers)))
    return lowest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", required=True)
    p.add_argument("--study")
    p.add_argument("--layers", type=int, default=6, help="the backbone's layers (MiniLM-L6: 6)")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    ks = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.COMPLETE and "petl_config" in t.user_attrs:
            ks.append(lowest_trainable_layer(PetlConfig.from_dict(t.user_attrs["petl_config"]), args.layers))
    if not ks:
        print("no complete trial")
        return 1
    counts = {k: ks.count(k) for k in sorted(set(ks))}
    share = [k / args.layers for k in ks]
    print(f"study {study.study_name!r}: {len(ks)} complete trials, L = {args.layers}")
    print("lowest trainable layer k: " + ", ".join(f"k={k}: {n}" for k, n in counts.items()))
    print(f"trials with anything to reuse (k > 0): {sum(k > 0 for k in ks)} of {len(ks)}")
    print(f"share of the encoder's forward pass below k: mean {statistics.fmean(share):.1%} over all trials")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
