"""One-shot proposals in a study: train the supernet once, enqueue what it suggests per budget.

`propose` runs before the sampler's trials (``strategy: oneshot`` or ``both``): one supernet run
(`run.run_supernet`: a Ray Tune trial with the Ray executor, in-process with the local one) builds
the supernet from the study's space, trains it with the trial recipe toward the budget
(`train.train_supernet`) and derives a configuration for each budget of a ladder from the smallest
one-unit count to the budget (`derive`); `propose` enqueues each distinct one as a proposal with
its configuration given whole (it is generally not a point of the space: sizes differ per layer)
and its learning rate (the supernet's, or the sampler's: ``oneshot.proposal_lr``), marked
``oneshot: <run>`` and ``oneshot_budget``. They are then trained from scratch with the trial recipe
and scored like every trial, so the front mixes one-shot, sampler and preset points measured the
same way.

The run is recorded on the study (user attribute ``oneshot``: its settings, cost, score, expected
count, what it proposed, where it ran and how many attempts it took). Its start is recorded too
(``oneshot_started``), so a study killed while the supernet trains says so when it resumes, and
trains the supernet again, going on from the training state it saved after its last whole epoch
(``<run dir>/oneshot/<run>.pt``; the record says from which epoch); one killed later resumes with
the proposals queued. The state file is removed once the record is stored.
"""

from __future__ import annotations

import datetime
import os
import time

from ..study import LR_FROM_SAMPLER
from .run import SupernetSpec, run_on_ray, run_supernet

ATTR = "oneshot"
STARTED = "oneshot_started"


def propose(study, exp, budget: int, lock) -> list[str]:
    """Train the supernet and enqueue its proposals unless the study already has them; lines to print.
    Training runs outside ``lock`` (the study's `ClaimLock`: held for minutes it would block the
    other workers); the enqueueing inside it, so two workers never both enqueue."""
    if ATTR in study.user_attrs:
        return []
    lines = []
    earlier = study.user_attrs.get(STARTED)
    attempt = earlier["attempt"] + 1 if earlier else 1
    if earlier:
        lines.append(f"one-shot: the supernet run started {earlier['at']} left no result (killed, or still "
                     f"running elsewhere); training it again from its last saved epoch, if any (attempt {attempt})")
    study.set_user_attr(STARTED, {"at": datetime.datetime.now().isoformat(timespec="seconds"), "attempt": attempt})
    start = time.perf_counter()
    o = exp.oneshot
    epochs = o.epochs if o.epochs is not None else exp.fidelity.epochs
    run = f"oneshot-{exp.seed}"
    state_file = os.path.abspath(os.path.join(exp.run_dir, "oneshot", f"{run}.pt"))
    spec = SupernetSpec(backbone=exp.backbone, task=exp.task, data_dir=exp.data_dir, k=exp.fidelity.k,
                        data_seed=exp.data_seed, search_dev=exp.fidelity.search_dev, space=exp.space,
                        budget=budget, rungs=o.rungs, lr=o.lr, gate_lr=o.gate_lr, epochs=epochs,
                        init_open=o.init_open, batch_size=exp.fidelity.batch_size,
                        max_length=exp.fidelity.max_length, length_buckets=exp.fidelity.length_buckets,
                        seed=exp.seed, checkpoint=state_file, precision=exp.fidelity.precision)
    if exp.executor == "ray":                      # a Ray Tune trial: the driver may have no GPU
        result = run_on_ray(spec, str(exp.run_dir), exp.ray_address)
    else:
        result = run_supernet(spec)
    proposed = result["proposed"]
    record = {"run": run, "candidates": result["candidates"], "bitfit": result["bitfit"],
              "layernorms": result.get("layernorms", False),
              "prompt_length": result.get("prompt_length", 0), "lr": o.lr, "gate_lr": o.gate_lr,
              "proposal_lr": o.proposal_lr,
              "epochs": epochs, "target": budget, "score": result["score"],
              "expected_count": round(result["expected_count"]), "multiplier": result["multiplier"],
              "supernet_params": result["supernet_params"], "proposed": proposed,
              "where": {"executor": exp.executor, "device": result["device"], "host": result["host"],
                        **({"resources": result["resources"]} if "resources" in result else {})},
              "cost_s": round(time.perf_counter() - start, 1), "attempts": attempt,
              "resumed_from": result["resumed_from"]}
    with lock():
        if ATTR in study.user_attrs:                   # another worker got there first
            return []
        for p in proposed:
            attrs = {"petl_config": p.pop("config"), ATTR: run, "oneshot_budget": p["budget"]}
            if o.proposal_lr == "sampler":               # the sampler draws it when the trial starts
                attrs[LR_FROM_SAMPLER] = True
            else:
                attrs["recipe"] = {"lr": o.lr if o.proposal_lr == "supernet" else float(o.proposal_lr)}
            study.enqueue_trial({}, user_attrs=attrs, skip_if_exists=False)
        study.set_user_attr(ATTR, record)
    if os.path.exists(state_file):
        os.remove(state_file)
    resumed = record["resumed_from"]
    went_on = f" (went on from epoch {resumed['epoch']})" if resumed else ""
    return lines + [f"one-shot: a supernet of {record['supernet_params']:,} parameters trained {epochs:g} epochs{went_on} "
                    f"in {record['cost_s']:.0f}s on {result['device']} (search-dev {result['score']:.4f}, expected size "
                    f"{record['expected_count']:,}); {len(proposed)} proposals enqueued: "
                    + ", ".join(f"{p['deployable']:,}" for p in proposed)]


__all__ = ["propose", "ATTR", "STARTED"]
