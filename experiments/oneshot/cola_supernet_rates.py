"""Why the supernet does not learn on CoLA (K=1000, 0.5%): its rates, side by side in one run.

The CoLA suite of 2026-12-06 (experiments/suite/README.md) measured LoRA's rate at 4.5e-3 and the
bottleneck adapter's at 9e-4, each 9x its paper rate, and gave every unmeasured family (Compacter,
prefix, multi-head adapter, prompt, BitFit) its paper rate x 9 too; its supernet, trained with all
of them at once, scored search-dev MCC 0.000. This trains the same supernet (the study's settings
as it resolved them: 10 epochs, 16 length buckets, bf16; the spec `propose.supernet_spec` builds)
with the study's rates, with the unmeasured families at their paper rates, and with every rate a
third of the study's (LoRA at 1.5e-3, its rate of 2026-11-29), and prints each run's search-dev
score and expected size.

    PYTHONPATH=. python experiments/oneshot/cola_supernet_rates.py [VARIANT ...]   (0-based; default: all)
"""

import dataclasses
import sys
import time

from petl_nas.search.oneshot.propose import supernet_spec
from petl_nas.search.oneshot.run import SupernetSpec, run_supernet
from petl_nas.suite.config import Suite

MEASURED = {"lora": 4.5e-3, "adapter": 9e-4}  # the CoLA study's measured rates
PAPER = {"compacter": 1e-3, "prefix": 2e-4, "mh_adapter": 2e-4, "prompt": 3e-3, "bitfit": 1e-4}
SCALES = {"lora": 2.0, "adapter": 1.0, "compacter": 1.0, "mh_adapter": 1.0}


def spec_for(exp, budget: int, rates: dict) -> SupernetSpec:
    """The supernet the study trained (as `propose` builds it), with the settings it resolved and ``rates``."""
    return dataclasses.replace(
        supernet_spec(exp, budget, rates, SCALES),
        epochs=10,
        length_buckets=16,
        precision="native",
        anchors=False,
        checkpoint=None,
    )


def main() -> None:
    ((_, _, exp),) = [e for e in Suite.load("suites/cola_scales.yaml").experiments() if e[1] == "0.5%"]
    budget = 113_566
    variants = {
        "the study's (unmeasured families at paper x 9)": {**MEASURED, **{f: r * 9 for f, r in PAPER.items()}},
        "unmeasured families at their paper rates": {**MEASURED, **PAPER},
        "every rate of the study / 3": {
            f: r / 3 for f, r in {**MEASURED, **{f: r * 9 for f, r in PAPER.items()}}.items()
        },
    }
    only = [int(a) for a in sys.argv[1:]]  # e.g. `... 2`: the third variant alone
    for i, (name, rates) in enumerate(variants.items()):
        if only and i not in only:
            continue
        start = time.perf_counter()
        out = run_supernet(spec_for(exp, budget, rates), device="cpu")
        print(
            f"{name}: search-dev MCC {out['score']:.4f}, expected size {round(out['expected_count']):,}, "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
