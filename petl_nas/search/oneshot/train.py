"""Training a supernet: the trial trainer, plus the count penalty that holds its expected size.

`train_supernet` trains every candidate and its gates together on the training rows (one level,
as L0 pruning does; S3Delta's bi-level search would need a second held-out split), adding
`Supernet.penalty` to each step's loss, and scores the supernet on search-dev with its gates at
their deterministic values.
"""

from __future__ import annotations

import math

from ...core.family_rates import at_rates
from ...core.inject import parameter_families
from ...tasks import resolve_task
from ...tasks.encoding import encode
from ...training.loading import TrainData, load_backbone
from ...training.loop import Recipe, train
from .gates import BETA


def train_supernet(
    net,
    backbone,
    task,
    splits,
    target: float,
    lr: float = 1e-3,
    gate_lr: float = 0.05,
    epochs: float = 2,
    batch_size: int = 32,
    max_length: int = 64,
    seed: int = 0,
    length_buckets: int = 0,
    precision: str = "auto",
    device: str = "cpu",
    resume: dict | None = None,
    on_epoch=None,
    penalty_step: float = 0.02,
    temperature: float = BETA,
    lr_multiples: dict | None = None,
    warmup: float = 0.0,
) -> dict:
    """Train ``net`` (built on ``backbone`` for ``task``) toward ``target`` expected deployable
    parameters; the gates learn at ``gate_lr`` (they were built with speed ``gate_lr / lr``, or
    are rescaled here) and sample at ``temperature``; the count's multiplier rises by
    ``penalty_step`` × log(expected / target) each step. Returns the score (and its standard
    error where the metric has one), the expected count and the Lagrange multiplier.

    ``lr_multiples`` ({family: multiple}, e.g. a study's measured rates over ``oneshot.lr``): each
    family trains at ``lr`` times its multiple, as a trial would (`at_rates`: the first family sets
    the recipe's rate, the head follows it); without them every family trains at ``lr``.

    ``warmup``: the share of the steps trained before the count's penalty starts (the weights and
    gates learn the task first; the multiplier stays 0 until then).

    ``on_epoch`` gets the training state after every epoch, with the multiplier in it (key
    ``multiplier``); ``resume`` is such a state to go on from."""
    task = resolve_task(task)
    _, tok = load_backbone(backbone, task, splits)
    encoded = encode(splits, tok, max_length=max_length)
    lr = set_rates(net, lr, gate_lr, lr_multiples, temperature)
    recipe = Recipe(
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        evals_per_epoch=0,
        length_buckets=length_buckets,
        precision=precision,
    )
    if resume is not None:
        net.multiplier = resume["multiplier"]
    saver = None if on_epoch is None else (lambda state: on_epoch({**state, "multiplier": net.multiplier}))
    free = int(warmup * recipe.epochs * math.ceil(len(encoded.train) / batch_size))  # steps before the penalty
    step = resume["step"] if resume is not None else 0

    def penalty():
        nonlocal step
        step += 1
        return net.penalty(target, penalty_step) if step > free else 0.0

    result = train(
        net.model,
        TrainData(encoded.train, encoded.search_dev),
        task,
        recipe,
        device,
        regularizer=penalty,
        resume=resume,
        on_epoch=saver,
    )
    return {
        "score": result.last_score,
        "score_se": result.metrics.get("se"),  # its one evaluation
        "expected_count": float(net.expected_count().detach()),
        "multiplier": net.multiplier,
        "steps": result.steps,
        "train_s": result.wall_s,
    }


def set_rates(
    net, lr: float, gate_lr: float, lr_multiples: dict | None = None, temperature: float | None = None
) -> float:
    """Give each family of ``net`` its rate (``lr`` times its multiple in ``lr_multiples``, through
    the model's `PetlConfig.lr_mults`, which `param_groups` reads) and each gate the speed that makes
    it learn at ``gate_lr`` in the group it trains in (Adam's steps scale with the rate); returns
    the recipe's rate (the first family's, `at_rates`)."""
    if lr_multiples:
        config, lr = at_rates({f: lr * m for f, m in lr_multiples.items()}, net.model.petl.config, 1.0)
        net.model.petl.config = config
    config, families = net.model.petl.config, parameter_families(net.model)
    for g in net.gates():
        g.retune(speed=gate_lr / (lr * config.lr_mult(families.get(id(g.raw), "head"))), temperature=temperature)
    return lr


__all__ = ["set_rates", "train_supernet"]
