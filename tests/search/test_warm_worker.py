"""A warm worker (one process running trial after trial on its cached backbone and data) leaks
nothing from one trial into the next: the same trial scores bit-identically first, fifth and after
a trial that failed half-way, and the cached backbone's weights never change."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import TINY_BACKBONE

from petl_nas import ModuleSpec, PetlConfig
from petl_nas.search.worker import TrialSpec, prepare, run_trial

RECIPE = {
    "lr": 5e-3,
    "epochs": 2,
    "batch_size": 16,
    "max_length": 16,
    "seed": 3,
    "evals_per_epoch": 1,
    "length_buckets": 4,
}
PROBE = PetlConfig(modules=(ModuleSpec(form="lora", size=4, layers=(1,)),), pooling="mean")
# Between the probes: trials that train the backbone's own tensors in their copy (biases, LayerNorms,
# the head), insert modules at other sites, or prepend a prompt.
OTHERS = (
    PetlConfig(bitfit=True, train_layernorms=True, pooling="mean"),
    PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=4),), head_lr_mult=10.0, pooling="mean"),
    PetlConfig(prompt_length=4, modules=(ModuleSpec(form="prefix", size=2, layers=(0,)),), pooling="mean"),
)


class Failed(RuntimeError):
    pass


def _spec(config: PetlConfig, **recipe) -> TrialSpec:
    return TrialSpec(
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        config=config.to_dict(),
        k=96,
        search_dev=48,
        recipe={**RECIPE, **recipe},
    )


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _fail_after_first_evaluation(index: int, metrics: dict, last: bool) -> None:
    raise Failed(f"stopped after evaluation {index}")  # as a pruned or crashed trial stops


@pytest.mark.slow
def test_a_trial_scores_bit_identically_first_fifth_and_after_a_failed_trial(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread count for every run: same sums
    probe = _spec(PROBE)
    base = prepare(probe)[1]
    before = _weights(base)
    first = run_trial(probe)
    for config in OTHERS:
        run_trial(_spec(config, lr=3e-2))
    fifth = run_trial(probe)
    with pytest.raises(Failed):
        run_trial(_spec(OTHERS[0], lr=3e-2), report=_fail_after_first_evaluation)
    after_failure = run_trial(probe)

    for again in (fifth, after_failure):
        assert again.history == first.history
        assert (again.score, again.metrics, again.steps) == (first.score, first.metrics, first.steps)
    assert all(torch.equal(before[k], v) for k, v in _weights(prepare(probe)[1]).items())
    assert prepare(probe)[1] is base  # warm: the same cached backbone throughout
    other_seed = run_trial(dataclasses.replace(probe, recipe={**probe.recipe, "seed": 4}))
    assert other_seed.history != first.history  # the comparison can tell runs apart
