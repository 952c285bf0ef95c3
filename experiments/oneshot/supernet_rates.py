"""A study's supernet trained again with one learning rate for every family, and with each family
at the rate the study measured for it (issue 50): does the supernet learn, and what does it keep?

Rebuilds the supernet run a study recorded (its backbone, task, data, space, budget, fidelity and
``oneshot`` settings, its seed) and trains it in this process once per ``--rates`` mode, one after
the other on the same machine: ``single`` (every family at ``oneshot.lr``, as before) and
``measured`` (each family at its ``rate_calibration`` rate, the default since), the penalty held
off for the first ``--warmup`` share of the steps. Prints, as Markdown, each run's search-dev
score with its standard error beside the trivial baseline's, its expected size, its multiplier
and its training time, and the ladder's proposals (deployable count). ``--rates measured`` alone
compares with the run the study recorded (the same spec at the rates and warm-up it recorded).
``--trace`` also prints, after every epoch, the supernet's search-dev score (gates at their
deterministic values), its expected size, the size each form keeps and the count's multiplier:
when it learned, and when its gates closed. Search scores only; nothing reads the test split.

    python experiments/oneshot/supernet_rates.py --storage sqlite:///runs/budgets_qnli_qnli_0.5pct/study.db
"""

from __future__ import annotations

import argparse
import json
import time

import optuna

from petl_nas.search.oneshot import run as supernet_run
from petl_nas.search.oneshot.propose import measured_rates
from petl_nas.search.oneshot.run import SupernetSpec, run_supernet
from petl_nas.search.oneshot.supernet import BITFIT, LAYERNORMS, PROMPT


def spec_of(study, rates: str, warmup: float = 0.0) -> SupernetSpec:
    """The spec of the supernet run ``study`` recorded, every family at ``oneshot.lr`` (``single``)
    or at its measured rate (``measured``)."""
    a, o = study.user_attrs, study.user_attrs["oneshot"]
    f = a["fidelity"]
    measured = measured_rates(study) if rates == "measured" else None
    if rates == "measured" and not measured:
        raise SystemExit(f"supernet_rates: study {study.study_name!r} measured no rates (rates: auto)")
    return SupernetSpec(
        backbone=json.loads(a["backbone"]),
        task=a.get("task_spec") or a["task"],
        data_dir=a.get("data_dir"),
        k=f["k"],
        data_seed=a["data_seed"],
        search_dev=f["search_dev"],
        space=a["space"],
        budget=a["budget"],
        rungs=o["settings"]["rungs"],
        lr=o["lr"],
        gate_lr=o["gate_lr"],
        epochs=o["epochs"],
        init_open=o["init_open"],
        batch_size=f["batch_size"],
        max_length=f["max_length"],
        length_buckets=f["length_buckets"],
        seed=int(o["run"].split("-")[1]),
        precision=f["precision"],
        penalty_step=o["penalty_step"],
        temperature=o["temperature"],
        anchors=False,
        warmup=warmup,
        lr_multiples={k: v / o["lr"] for k, v in measured.items()} if measured else None,
    )


def row(label: str, r: dict, baseline: dict) -> str:
    se = f" ± {r['score_se']:.4f}" if r.get("score_se") is not None else ""
    sizes = ", ".join(f"{p['deployable']:,}" for p in r["proposed"] if not p.get("anchor"))  # the ladder
    return (
        f"| {label} | {r['score']:.4f}{se} | {r['score'] - baseline['score']:+.4f} | {r['expected_count']:,.0f} "
        f"| {r['multiplier']:.3g} | {r['train_s'] / 60:.1f} min | {sizes} |"
    )


def traced(real):
    """``train_supernet`` that prints a line of the supernet's state after every epoch."""
    from petl_nas.tasks.encoding import encode
    from petl_nas.training.loading import load_backbone
    from petl_nas.training.loop import evaluate

    def train_supernet(net, backbone, task, splits, *args, **kw):
        _, tok = load_backbone(backbone, task, splits)
        dev = encode(splits, tok, max_length=kw["max_length"]).search_dev
        names = [s.form + "@" + s.position for s in net.specs]
        print("\n| epoch | search-dev | expected size | multiplier | kept by form |\n|---:|---:|---:|---:|---|")

        def trace(state):
            was = net.model.training
            score = evaluate(net.model, dev, task, 128, "cpu")[task.main_metric]
            net.model.train(was)
            kept = {}
            for u in (u for u in net.units if u.gate_of is None):  # UniPELT's gates left out
                name = {BITFIT: "bitfit", LAYERNORMS: "layernorms", PROMPT: "prompt"}.get(u.candidate) or names[
                    u.candidate
                ]
                kept[name] = kept.get(name, 0.0) + float(u.gate.p_open().sum().detach()) * u.unit_cost
            print(
                f"| {state['epoch']} | {score:.4f} | {float(net.expected_count().detach()):,.0f} | "
                f"{net.multiplier:.3g} | " + ", ".join(f"{k} {v:,.0f}" for k, v in kept.items()) + " |",
                flush=True,
            )

        return real(net, backbone, task, splits, *args, **{**kw, "on_epoch": trace})

    return train_supernet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", help="the study's name (default: the storage's only study without ':')")
    ap.add_argument("--rates", nargs="+", choices=("single", "measured"), default=["single", "measured"])
    ap.add_argument("--trace", action="store_true", help="a line after every epoch")
    ap.add_argument("--warmup", type=float, default=0.0, help="the share of steps before the penalty starts")
    args = ap.parse_args()
    if args.trace:
        supernet_run.train_supernet = traced(supernet_run.train_supernet)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = args.study or next(n for n in optuna.get_all_study_names(args.storage) if ":" not in n)
    study = optuna.load_study(study_name=name, storage=args.storage)
    record, baseline = study.user_attrs["oneshot"], study.user_attrs["baseline"]
    rates = measured_rates(study) or {}
    print(f"## {name}: the supernet at one rate and at measured rates\n")
    print(
        f"Trivial baseline on search-dev: {baseline['what']}, {baseline['score']:.4f}. Measured rates: "
        + ", ".join(f"{k} {v:.2g}" for k, v in rates.items())
        + f"; `oneshot.lr` {record['lr']:g}.\n"
    )
    print(
        "| rates | supernet search-dev | − trivial | expected size | multiplier | training | proposals (deployable) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    if args.rates == ["measured"]:
        was = ("measured" if record.get("family_rates") else "single") + (
            f", penalty after {record['warmup']:.0%} of the steps" if record.get("warmup") else ""
        )
        print(row(f"{was} (the study's record)", {**record, "train_s": record["cost_s"]}, baseline))
    for mode in args.rates:
        start = time.perf_counter()
        result = run_supernet(spec_of(study, mode, args.warmup))
        label = mode + (f", penalty after {args.warmup:.0%} of the steps" if args.warmup else "")
        print(row(label, {**result, "train_s": time.perf_counter() - start}, baseline), flush=True)


if __name__ == "__main__":
    main()
