"""Why CoLA's 0.05% supernet does not learn even at a third of its rates: rate or count penalty.

`suites/cola_small_retry.yaml` (2026-12-06) trained CoLA's 0.05% supernet (317,474 trained
parameters, budget 11,356) at the 0.5% study's measured rates (MCC -0.011) and again at a third
of them (0.067, within noise of the constant predictor's 0.000), where the 0.5% supernet (2.84M,
budget 113,566) learned at a third (0.090, cola_supernet_rates.py). This trains the 0.05%
supernet with the study's settings (10 epochs, 16 length buckets, bf16, the penalty held off for
half of the steps) at a third of the rates, at a ninth, and at a third with the count's penalty
never applied, and prints each run's search-dev score and expected size, side by side in one run.

    PYTHONPATH=. python experiments/oneshot/cola_small_supernet.py [VARIANT ...]   (0-based; default: all)
"""

import dataclasses
import json
import sys
import time

from petl_nas.search.oneshot.propose import supernet_spec
from petl_nas.search.oneshot.run import run_supernet
from petl_nas.suite.config import Suite

BUDGET = 11_356


def main() -> None:
    ((_, _, exp),) = [e for e in Suite.load("suites/cola_small_retry.yaml").experiments() if e[1] == "0.05%"]
    measured = json.load(open("experiments/suite/rates/cola_0.5pct.json"))
    rates, scales = measured["rates"], measured["scales"]
    spec = dataclasses.replace(
        supernet_spec(exp, BUDGET, rates, scales),
        epochs=10,
        length_buckets=16,
        precision="native",
        anchors=False,
        checkpoint=None,
    )
    variants = {
        "every rate / 3 (the retry)": ({f: r / 3 for f, r in rates.items()}, spec.warmup),
        "every rate / 9": ({f: r / 9 for f, r in rates.items()}, spec.warmup),
        "every rate / 3, no count penalty": ({f: r / 3 for f, r in rates.items()}, 1.0),
    }
    only = [int(a) for a in sys.argv[1:]]
    for i, (name, (at, warmup)) in enumerate(variants.items()):
        if only and i not in only:
            continue
        start = time.perf_counter()
        run = dataclasses.replace(spec, warmup=warmup, lr_multiples={f: r / spec.lr for f, r in at.items()})
        out = run_supernet(run, device="cpu")
        print(
            f"{name}: search-dev MCC {out['score']:.4f}, expected size {round(out['expected_count']):,}, "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
