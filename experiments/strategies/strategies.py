"""One-shot, TPE and random search at equal compute: hypervolume against compute spent.

An arm is a study (same task, data, space, presets, head and trial recipe as the other arms), or
some groups of one (`petl_nas.study.fronts.group_of`: ``preset``, ``sweep``, ``oneshot``,
``searched``), so a study that ran several strategies gives one arm each. Each arm is replayed in
the order its trials finished, charging what each step cost; with ``--charge wall`` (the default):
- a trained trial: its wall time times the one core it held (trials run two at a time on two cores);
- the one-shot supernet: its wall time times the two cores it held (it trains alone, before trials);
- a proposal rejected over the budget: nothing (it is never trained).
Compute is reported in CPU-minutes and in *trial equivalents* (CPU time over the median trained
trial's CPU time in the same arm), which cancels what else the machine was running while a
study ran. Where the load changed *within* a study (some of its trials ran beside another study),
``--charge trials`` counts each trained trial as one trial equivalent (every trial of an arm runs
the same recipe) and the supernet as its CPU time over the median CPU time of the study's presets.
After each step the arm's front of trials that learned gives a hypervolume (search score up, log10
deployable parameters down, from the trivial baseline's score and the budget: `petl_nas.study.fronts`),
the same reference point for every arm.

    python experiments/strategies/strategies.py \\
        --arm tpe=sqlite:///runs/sst2_minilm_v4/study.db:sst2_minilm_v4 \\
        --arm oneshot=sqlite:///runs/sst2_oneshot/study.db:sst2_oneshot \\
        --arm random=sqlite:///runs/sst2_random/study.db:sst2_random --at 4,8,12,16 --plot out.png
    python experiments/strategies/strategies.py --charge trials \\
        --arm oneshot=sqlite:///runs/cola_minilm_full/study.db:cola_minilm_full:preset,oneshot ...
"""

from __future__ import annotations

import argparse
import statistics

import optuna
from optuna.trial import TrialState

from petl_nas.study.fronts import GROUPS, group_of, hypervolume, pareto

SUPERNET_CORES = 2


def replay(study, groups: tuple[str, ...] = GROUPS, charge: str = "wall") -> list[dict]:
    """Steps in the order they finished: (cost in CPU-seconds, trial or None, running hypervolume)."""
    a = study.user_attrs
    ref = (a["baseline"]["score"], float(a["budget"]))
    complete = [
        t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and "wall_s" in t.user_attrs
    ]
    trained = sorted((t for t in complete if group_of(t) in groups), key=lambda t: t.datetime_complete)
    if charge == "wall":
        cost = {t.number: t.user_attrs["wall_s"] for t in trained}
        unit = statistics.median(cost.values())
    else:
        unit = statistics.median(t.user_attrs["wall_s"] for t in complete if group_of(t) == "preset")
        cost = {t.number: unit for t in trained}
    steps = []
    if "oneshot" in groups and "oneshot" in a:
        steps.append({"cpu_s": a["oneshot"]["cost_s"] * SUPERNET_CORES, "trial": None})
    steps += [{"cpu_s": cost[t.number], "trial": t} for t in trained]
    learned, spent = [], 0.0
    for s in steps:
        spent += s["cpu_s"]
        t = s["trial"]
        if t is not None and not t.user_attrs.get("did_not_learn"):
            learned.append((t.values[0], t.values[1]))
        s.update(
            cpu_min=spent / 60,
            units=spent / unit,
            hv=hypervolume(learned, ref) if learned else 0.0,
            best=max((p[0] for p in learned), default=float("nan")),
            front=[(round(x, 4), int(n)) for x, n in pareto(learned, score=lambda p: p[0], size=lambda p: p[1])],
        )
    return steps


def at(steps: list[dict], units: float) -> dict | None:
    """The last step whose cumulative compute is within ``units`` trial equivalents."""
    done = [s for s in steps if s["units"] <= units + 1e-9]
    return done[-1] if done else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--arm",
        action="append",
        required=True,
        help="name=storage_url:study_name[:group,group] (groups: " + ", ".join(GROUPS) + "; default all)",
    )
    p.add_argument(
        "--charge",
        choices=("wall", "trials"),
        default="wall",
        help="a trained trial costs its wall time (wall) or one trial equivalent (trials)",
    )
    p.add_argument("--at", default="4,8,12,16", help="trial equivalents to tabulate at")
    p.add_argument("--plot", help="write hypervolume against trial equivalents here (PNG)")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    arms = {}
    for spec in args.arm:
        name, rest = spec.split("=", 1)
        url, study_name = rest.rsplit(":", 1)
        groups = GROUPS
        if study_name and all(g in GROUPS for g in study_name.split(",")):
            groups = tuple(study_name.split(","))
            url, study_name = url.rsplit(":", 1)
        arms[name] = replay(optuna.load_study(study_name=study_name, storage=url), groups, args.charge)
    marks = [float(x) for x in args.at.split(",")]
    print(
        "| arm | " + " | ".join(f"hv at {m:g}" for m in marks) + " | total: trial equivalents | CPU-min | hv | best |"
    )
    print("| --- | " + " | ".join("---:" for _ in marks) + " | ---: | ---: | ---: | ---: |")
    for name, steps in arms.items():
        cells = [f"{s['hv']:.3f}" if (s := at(steps, m)) else "-" for m in marks]
        last = steps[-1]
        print(
            f"| {name} | " + " | ".join(cells) + f" | {last['units']:.1f} | {last['cpu_min']:.1f} | "
            f"{last['hv']:.3f} | {last['best']:.4f} |"
        )
    for name, steps in arms.items():
        print(f"\n{name}: final front (score, deployable): {steps[-1]['front']}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, steps in arms.items():
            xs, ys = [0.0], [0.0]
            for s in steps:
                xs += [s["units"], s["units"]]
                ys += [ys[-1], s["hv"]]
            ax.plot(xs, ys, label=name)
        ax.set_xlabel("compute (trial equivalents)")
        ax.set_ylabel("hypervolume (score x log10 params)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
