"""One supernet run as a job any worker can take: what it needs, where it runs, what it returns.

`SupernetSpec` holds plain values, so it travels to a Ray worker as a `TrialSpec` does.
`run_supernet` does the whole run in the process that takes it: it loads the data and the cached
backbone, builds the supernet from the space (with ``scales``, each candidate whose scale is only a
rate at its family's reference scale, as the study's trials train it), trains it toward the budget
on that process's device (a GPU when it has one), and derives one configuration per budget of the
ladder (and of each smaller budget's own ladder in ``also``: one supernet serving a suite's
budgets; with ``anchors``, also each budget's largest baseline of each kind plus what the supernet
keeps beside it, `derive.anchored`; with ``rate_proposals``, each also scored on search-dev with
the supernet's own weights: `inherit.inherited_score`, what the knob search compares runs by).
With the Ray executor, `run_on_ray` runs it as a Ray Tune trial, because the driver may have no
GPU. That trial gets a whole GPU where the cluster has one, else every CPU of the largest node (no
trial runs beside it). The local executor calls `run_supernet` in-process.

With ``checkpoint`` set, the run saves its training state there after every epoch
(`petl_nas.training.checkpoint`), with a standing file beside it that the waiting driver's
progress line reads (`standing`: epochs done, time left), and a later run of the same spec (the
same settings, data and candidates: its fingerprint) goes on from it instead of starting again; a
state of any other run is left unused. The file is on the machine that trains, so on a cluster
without a shared file system a run resumed on another node starts from scratch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import time

from ...core.budget import count_parameters
from ...core.config import PetlConfig
from ...core.family_rates import at_reference_scales
from ...study.space import SearchSpace
from ...tasks import load_splits, resolve_task
from ...tasks.encoding import encode
from ...training import checkpoint
from ...training.loading import load_backbone
from ...training.loop import Recipe, evaluate
from ..baselines import anchors as baseline_anchors
from . import standing
from .derive import anchored, configuration, ladder, select
from .gates import BETA
from .inherit import inherited_score
from .supernet import GLOBAL, allows_bitfit, allows_layernorms, build_supernet, candidates, prompt_length_for
from .train import train_supernet


@dataclasses.dataclass(frozen=True)
class SupernetSpec:
    """Everything a supernet run needs, as plain values."""

    backbone: object
    task: object
    data_dir: str | None
    k: int | None
    data_seed: int
    search_dev: int | None
    space: str
    budget: int
    rungs: int
    lr: float
    gate_lr: float
    epochs: float
    init_open: float
    batch_size: int
    max_length: int
    length_buckets: int
    seed: int
    checkpoint: str | None = None  # the file of its per-epoch training state (None: no resuming)
    precision: str = "auto"  # what its forward passes compute in (`precision.use_precision`)
    penalty_step: float = 0.02  # how fast the count's Lagrange multiplier rises (`Supernet.penalty`)
    temperature: float = BETA  # the hard-concrete gates' β
    rate_proposals: bool = False  # score each proposal with the supernet's weights (`inherit.py`)
    also: tuple = ()  # smaller budgets it also proposes for, each its own ladder
    anchors: bool = True  # also propose each budget's baselines plus the supernet's fill
    lr_multiples: dict | None = None  # {family: its rate / lr} (a study's measured rates); None: all at lr
    scales: dict | None = None  # {family: the scale its rate was measured at}: candidates trained at it
    warmup: float = 0.0  # the share of its steps trained before the count's penalty starts

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_supernet(spec: SupernetSpec | dict, device: str | None = None) -> dict:
    """Train the supernet of ``spec`` and derive its proposals, in this process."""
    import torch

    spec = spec if isinstance(spec, SupernetSpec) else SupernetSpec(**spec)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    task = resolve_task(spec.task)
    splits = load_splits(
        task, data_dir=spec.data_dir, k=spec.k, data_seed=spec.data_seed, search_dev_size=spec.search_dev
    )  # cached per process, as a trial's
    base, tok = load_backbone(spec.backbone, task, splits)
    space = SearchSpace.load(spec.space)
    head = space.with_head(PetlConfig())
    net, specs, built = _built(spec, base, space, head)
    trained_on = {k: v for k, v in spec.to_dict().items() if k not in ("also", "anchors")}  # they only derive more
    fingerprint = {**trained_on, "checkpoint": None, **built}
    state = checkpoint.load(spec.checkpoint) if spec.checkpoint else None
    trainable = {n for n, p in net.model.named_parameters() if p.requires_grad}
    if state is not None and (state.get("fingerprint") != fingerprint or set(state["params"]) != trainable):
        state = None  # another run's state: start from scratch
    result = _train(spec, net, task, splits, device, state, fingerprint)
    score_on_dev = None
    if spec.rate_proposals:
        dev = encode(splits, tok, max_length=spec.max_length).search_dev
        batch = Recipe(batch_size=spec.batch_size).eval_batch_size
        score_on_dev = lambda model: evaluate(model, dev, task, batch, device)[task.main_metric]  # noqa: E731
    proposals = _proposer(spec, net, base.config, head, task, score_on_dev)
    as_trained = PetlConfig(
        modules=specs,
        bitfit=built["bitfit"],
        train_layernorms=built["layernorms"],
        prompt_length=built["prompt_length"],
    )
    return {
        **{k: result[k] for k in ("score", "score_se", "expected_count", "multiplier", "train_s")},
        **built,
        "proposed": proposals(spec.budget, True),  # the knob search compares runs by these
        "proposed_for": {str(b): proposals(b, False) for b in spec.also},
        "supernet_params": count_parameters(base.config, as_trained).deployable,
        "device": str(device),
        "host": socket.gethostname(),
        "resumed_from": None if state is None else {"epoch": state["epoch"], "step": state["step"]},
    }


def _built(spec: SupernetSpec, base, space, head: PetlConfig):
    """The supernet over a copy of ``base`` (seeded: the same run, the same supernet), and what it
    holds: its candidates (each zero-start one at its family's scale, as a trial trains it), BitFit,
    trained LayerNorms and the soft prompt's length."""
    import torch

    specs = candidates(space, base.config, spec.budget)
    if spec.scales:
        specs = at_reference_scales(PetlConfig(modules=specs), spec.scales).modules
    built = {
        "candidates": [s.to_dict() for s in specs],
        "bitfit": allows_bitfit(space, base.config, spec.budget, head),
        "layernorms": allows_layernorms(space, base.config, spec.budget, head),
        "prompt_length": prompt_length_for(space, base.config, spec.budget, head),
    }
    torch.manual_seed(spec.seed)
    net = build_supernet(
        copy.deepcopy(base),
        specs,
        head,
        init_open=spec.init_open,
        bitfit=built["bitfit"],
        layernorms=built["layernorms"],
        prompt_length=built["prompt_length"],
    )
    return net, specs, built


def _train(spec: SupernetSpec, net, task, splits, device, state: dict | None, fingerprint: dict) -> dict:
    """Train ``net`` toward the budget from ``state`` (None: from scratch); after every epoch its
    state is saved with ``fingerprint`` and where the run stands is written (`standing`)."""
    began, first_epoch = time.time(), state["epoch"] if state is not None else 0
    ends: list[float] = []  # when each epoch trained here ended

    def save(s: dict) -> None:
        checkpoint.save({**s, "fingerprint": fingerprint}, spec.checkpoint)
        ends.append(time.time())
        standing.write(
            standing.standing_path(spec.checkpoint), s["epoch"], spec.epochs, first_epoch, began, first_done=ends[0]
        )

    return train_supernet(
        net,
        spec.backbone,
        task,
        splits,
        target=spec.budget,
        lr=spec.lr,
        gate_lr=spec.gate_lr,
        epochs=spec.epochs,
        batch_size=spec.batch_size,
        max_length=spec.max_length,
        seed=spec.seed,
        length_buckets=spec.length_buckets,
        precision=spec.precision,
        device=device,
        resume=state,
        on_epoch=save if spec.checkpoint else None,
        penalty_step=spec.penalty_step,
        temperature=spec.temperature,
        lr_multiples=spec.lr_multiples,
        warmup=spec.warmup,
    )


def _proposer(spec: SupernetSpec, net, model_config, head: PetlConfig, task, score_on_dev):
    """``proposals(budget, scored)``: the distinct configurations read off the trained ``net`` at
    each rung of the ladder to ``budget``, then around each baseline anchor (``spec.anchors``);
    ``scored``: each rung's inherited search-dev score too, where ``score_on_dev`` is given."""
    smallest = min(
        u.unit_cost + u.fixed_cost + (net.shared_cost if u.candidate in GLOBAL else 0)
        for u in net.units
        if u.gate_of is None
    )  # a UniPELT gate is never derived alone

    def proposals(budget: int, scored: bool) -> list[dict]:
        seen, out = set(), []

        def add(config, n: int, rung: int, **anchor) -> bool:  # each distinct configuration once
            as_dict = config.to_dict()
            if n == 0 or repr(as_dict) in seen:
                return False
            seen.add(repr(as_dict))
            out.append({"budget": rung, "deployable": n, "config": as_dict, **anchor})
            return True

        for rung in ladder(smallest, budget, spec.rungs):
            selection = select(net, rung)
            if (
                add(*configuration(net, model_config, selection, head, num_labels=task.num_labels), rung)
                and scored
                and score_on_dev is not None
            ):
                out[-1]["supernet_score"] = round(inherited_score(net, selection, score_on_dev), 6)
        anchors = baseline_anchors(model_config, budget, model_config.num_hidden_layers) if spec.anchors else ()
        for name, anchor in anchors:
            if (found := anchored(net, model_config, budget, anchor, head, num_labels=task.num_labels)) is not None:
                add(*found, budget, anchor=name)
        return out

    return proposals


def forget_state(spec: SupernetSpec) -> None:
    """Remove the run's per-epoch state and its standing file, once its result is stored."""
    for path in (spec.checkpoint, standing.standing_path(spec.checkpoint)) if spec.checkpoint else ():
        if os.path.exists(path):
            os.remove(path)


def supernet_trainable(config: dict) -> None:
    """The Ray Tune trainable of a supernet run: one report carrying the whole result."""
    import ray
    from ray import tune

    result = run_supernet(config["spec"])
    result["host"] += "/" + ray.get_runtime_context().get_node_id()[:8]
    tune.report({"run": json.dumps(result), "score": result["score"]})


def _resources(ray) -> dict:
    """A whole GPU where the cluster has one; else every CPU of the largest node."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(r.get("GPU", 0) >= 1 for r in nodes):
        return {"cpu": 1, "gpu": 1}
    return {"cpu": max((int(r.get("CPU", 1)) for r in nodes), default=1), "gpu": 0}


def run_on_ray(spec: SupernetSpec, run_dir: str, address: str | None = None) -> dict:
    """Run ``spec`` as one Ray Tune trial (local Ray, or the cluster at ``address``)."""
    from ray import tune

    from ..executors import init_ray

    ray = init_ray(address)
    resources = _resources(ray)
    tuner = tune.Tuner(
        tune.with_resources(supernet_trainable, resources),
        param_space={"spec": spec.to_dict()},
        tune_config=tune.TuneConfig(num_samples=1),
        run_config=tune.RunConfig(
            name="supernet",
            storage_path=os.path.abspath(os.path.join(run_dir, "ray")),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    start = time.perf_counter()
    outcome = tuner.fit()[0]
    if outcome.error is not None:
        raise RuntimeError(f"the supernet run failed in its Ray trial: {outcome.error}") from outcome.error
    if "run" not in (outcome.metrics or {}):
        raise RuntimeError("the supernet run ended in its Ray trial without a result")
    result = json.loads(outcome.metrics["run"])
    return {**result, "resources": resources, "ray_s": round(time.perf_counter() - start, 1)}


__all__ = ["SupernetSpec", "forget_state", "run_supernet", "run_on_ray", "supernet_trainable"]
