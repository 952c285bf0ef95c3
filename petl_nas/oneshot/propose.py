"""One-shot proposals in a study: train the supernet once, enqueue what it suggests per budget.

`propose` runs before the sampler's trials (``strategy: oneshot`` or ``both``): it builds the
supernet from the study's space on the cached backbone, trains it with the trial recipe toward the
budget (`train.train_supernet`), derives a configuration for each budget of a ladder from the
smallest one-unit count to the budget (`derive`), and enqueues each distinct one as a proposal with
its configuration given whole (it is generally not a point of the space: sizes differ per layer)
and its learning rate (the supernet's, or the sampler's: ``oneshot.proposal_lr``), marked
``oneshot: <run>`` and ``oneshot_budget``. They are then trained from scratch with the trial recipe
and scored like every trial, so the front mixes one-shot, sampler and preset points measured the
same way.

The run is recorded on the study (user attribute ``oneshot``: its settings, cost, score, expected
count, what it proposed and how many attempts it took). Its start is recorded too
(``oneshot_started``), so a study killed while the supernet trains says so when it resumes, and
trains the supernet again from scratch; one killed later resumes with the proposals queued.
"""

from __future__ import annotations

import copy
import datetime
import time

from ..budget import count_parameters
from ..config import PetlConfig
from ..study import LR_FROM_SAMPLER
from ..worker import load_backbone
from .derive import derive, ladder
from .supernet import build_supernet, candidates
from .train import train_supernet

ATTR = "oneshot"
STARTED = "oneshot_started"


def propose(study, exp, task, splits, space, model_config, budget: int, lock) -> list[str]:
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
                     f"running elsewhere); training it again from scratch (attempt {attempt})")
    study.set_user_attr(STARTED, {"at": datetime.datetime.now().isoformat(timespec="seconds"), "attempt": attempt})
    start = time.perf_counter()
    o = exp.oneshot
    head = space.with_head(PetlConfig())
    base, _ = load_backbone(exp.backbone, task, splits)
    specs = candidates(space, model_config, budget)
    net = build_supernet(copy.deepcopy(base), specs, head, init_open=o.init_open)
    epochs = o.epochs if o.epochs is not None else exp.fidelity.epochs
    result = train_supernet(net, exp.backbone, task, splits, target=budget, lr=o.lr, gate_lr=o.gate_lr,
                            epochs=epochs, batch_size=exp.fidelity.batch_size, max_length=exp.fidelity.max_length,
                            seed=exp.seed, length_buckets=exp.fidelity.length_buckets)
    smallest = min(u.unit_cost + u.fixed_cost for u in net.units)
    run = f"oneshot-{exp.seed}"
    seen, proposed = set(), []
    for rung in ladder(smallest, budget, o.rungs):
        config, n = derive(net, model_config, rung, head, num_labels=task.num_labels)
        key = repr(config.to_dict())
        if n > 0 and key not in seen:
            seen.add(key)
            proposed.append({"budget": rung, "deployable": n, "config": config.to_dict()})
    record = {"run": run, "candidates": [s.to_dict() for s in specs], "lr": o.lr, "gate_lr": o.gate_lr,
              "proposal_lr": o.proposal_lr,
              "epochs": epochs, "target": budget, "score": result["score"],
              "expected_count": round(result["expected_count"]), "multiplier": result["multiplier"],
              "supernet_params": count_parameters(model_config, PetlConfig(modules=specs)).deployable,
              "proposed": proposed, "cost_s": round(time.perf_counter() - start, 1), "attempts": attempt}
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
    return lines + [f"one-shot: a supernet of {record['supernet_params']:,} parameters trained {epochs:g} epochs "
                    f"in {record['cost_s']:.0f}s (search-dev {result['score']:.4f}, expected size "
                    f"{record['expected_count']:,}); {len(proposed)} proposals enqueued: "
                    + ", ".join(f"{p['deployable']:,}" for p in proposed)]


__all__ = ["propose", "ATTR", "STARTED"]
