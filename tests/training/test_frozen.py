"""Frozen-layer reuse (`petl_nas.training.frozen`): the lowest trainable layer, exactness against recomputing
the frozen layers, that cached layers really do not run, sharing across trials, and the memory bound."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
from conftest import NO_RATES, batch, tiny_model

from petl_nas import ModuleSpec, PetlConfig
from petl_nas.core.inject import apply_petl
from petl_nas.errors import ConfigError
from petl_nas.search.worker import TrialSpec, prepare, run_trial
from petl_nas.study.experiment import Fidelity
from petl_nas.training import frozen

TINY = {"tiny": {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 64}}
RECIPE = {"lr": 5e-3, "epochs": 3, "batch_size": 16, "max_length": 16, "seed": 3, "evals_per_epoch": 1}
TOP_LORA = PetlConfig(modules=(ModuleSpec(form="lora", size=4, layers=(2, 3)),), pooling="mean")


@pytest.fixture(autouse=True)
def empty_store():
    frozen.clear()
    yield
    frozen.clear()


def lowest(config: PetlConfig) -> int | None:
    model = apply_petl(tiny_model(num_hidden_layers=4), config)
    layers = frozen.encoder_layers(model, "classification")
    return frozen.lowest_trainable_layer(model, layers, batch(), "cpu")


@pytest.mark.parametrize(
    "config, expected",
    [
        (TOP_LORA, 2),
        (PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=4, layers=(3,)),)), 3),
        (PetlConfig(modules=(ModuleSpec(form="prefix", size=4, layers=(1, 3)),)), 1),
        (PetlConfig(modules=(ModuleSpec(form="lora", size=4),)), 0),
        (PetlConfig(), 4),  # the head alone: every layer frozen
        (dataclasses.replace(TOP_LORA, bitfit=True), 0),  # biases of the embeddings train
        (dataclasses.replace(TOP_LORA, train_layernorms=True), 0),
        (dataclasses.replace(TOP_LORA, prompt_length=4), 0),
    ],
)
def test_the_lowest_trainable_layer_is_where_something_first_trains(config, expected):
    assert lowest(config) == expected


def test_the_probe_leaves_the_random_state_and_the_mode_alone():
    model = apply_petl(tiny_model(num_hidden_layers=4), TOP_LORA).train()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    frozen.lowest_trainable_layer(model, frozen.encoder_layers(model, "classification"), batch(), "cpu")
    assert torch.equal(torch.rand(3), expected) and model.training


def spec(config: PetlConfig, mb: float = 100, model_type: str = "bert", **recipe) -> TrialSpec:
    backbone = {"tiny": {**TINY["tiny"], "model_type": model_type}}
    return TrialSpec(
        backbone=backbone,
        task="demo_sentiment",
        config=config.to_dict(),
        k=96,
        search_dev=48,
        recipe={**RECIPE, "frozen_cache_mb": mb, **recipe},
    )


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "modernbert"])  # ModernBERT: rotary, sliding windows
@pytest.mark.slow
def test_reuse_trains_exactly_as_recomputing_the_frozen_layers(model_type):
    cached = run_trial(spec(TOP_LORA, model_type=model_type))
    frozen.clear()
    recomputed = run_trial(spec(TOP_LORA, mb=1e-9, model_type=model_type))  # over the bound: every layer runs
    assert cached.frozen["cached"] == {"train": True, "dev": True}
    assert recomputed.frozen["cached"] == {"train": False, "dev": False}
    assert cached.frozen["layer"] == recomputed.frozen["layer"] == 2
    for a, b in zip(cached.history, recomputed.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["accuracy"] == b["accuracy"]
    assert cached.score == recomputed.score
    off = run_trial(spec(TOP_LORA, mb=0, model_type=model_type))
    assert off.frozen is None  # off: the plain path, dropout everywhere


def test_layer_k_reads_from_the_cache_what_the_frozen_layers_compute():
    from petl_nas.training.loading import petl_copy

    _, base, _, encoded = prepare(spec(TOP_LORA))
    model = petl_copy(base, TOP_LORA, 0)
    reuse = frozen.FrozenReuse.prepare(model, "classification", encoded.train, 100, "cpu")
    assert reuse.k == 2 and reuse.cache(encoded.train, "train")
    seen = []
    layer_2 = reuse.layers[2]
    handle = layer_2.register_forward_pre_hook(
        lambda m, a, kw: seen.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    rows, batch = next(encoded.train.row_batches(16, shuffle=True, seed=1))
    outputs = []
    for feed in (True, False):
        reuse.train_mode()
        torch.manual_seed(0)
        with reuse.feeding(encoded.train, rows) if feed else contextlib.nullcontext():
            outputs.append(model(**batch).logits)
    handle.remove()
    reuse.close()
    real = batch["attention_mask"].bool()
    assert (~real).any()  # padded rows: pads are not compared
    assert torch.allclose(seen[0][real], seen[1][real], atol=1e-6)  # layer 2's input, from cache and computed
    assert torch.allclose(outputs[0], outputs[1], atol=1e-6)


@pytest.mark.slow
def test_cached_layers_do_not_run_after_the_cache_is_filled():
    from petl_nas.training.loading import TrainData, petl_copy
    from petl_nas.training.loop import Recipe, train

    task, base, _, encoded = prepare(spec(TOP_LORA))
    data = TrainData(encoded.train, encoded.search_dev)

    def calls_of_layer_1(mb: int, seed: int) -> int:
        model = petl_copy(base, TOP_LORA, seed)
        calls = []
        handle = frozen.encoder_layers(model, "classification")[1].attention.register_forward_hook(
            lambda *a: calls.append(1)
        )
        train(model, data, task, Recipe(**{**RECIPE, "frozen_cache_mb": mb, "seed": seed}))
        handle.remove()
        return len(calls)

    fill_batches = math.ceil(len(encoded.train) / 128) + math.ceil(len(encoded.search_dev) / 128)
    assert calls_of_layer_1(100, 3) == 1 + fill_batches  # the probe, then the fill: no step
    assert calls_of_layer_1(100, 4) == 1  # a second trial: the probe only
    steps = RECIPE["epochs"] * math.ceil(len(encoded.train) / RECIPE["batch_size"])
    evals = RECIPE["epochs"] * math.ceil(len(encoded.search_dev) / 128)
    assert calls_of_layer_1(0, 3) == steps + evals  # off: every step and evaluation


@pytest.mark.slow
def test_a_trial_reuses_states_only_of_the_same_frozen_layers():
    first = run_trial(spec(TOP_LORA))
    same = run_trial(spec(TOP_LORA, seed=7))
    deeper = run_trial(spec(PetlConfig(modules=(ModuleSpec(form="lora", size=4, layers=(3,)),))))
    assert first.frozen["fill_s"] > 0 and same.frozen["fill_s"] == 0
    assert deeper.frozen["layer"] == 3 and deeper.frozen["fill_s"] > 0


@pytest.mark.slow
def test_the_store_keeps_to_its_bound_by_dropping_the_oldest_states():
    run_trial(spec(TOP_LORA))
    one = frozen.stored_mb()
    bound = one * 1.5  # room for one set of states
    run_trial(spec(PetlConfig(modules=(ModuleSpec(form="lora", size=4, layers=(3,)),)), mb=bound))
    assert 0 < frozen.stored_mb() <= bound
    refilled = run_trial(spec(TOP_LORA, mb=bound))
    assert refilled.frozen["fill_s"] > 0  # layer 2's states were dropped


def test_the_model_runs_every_layer_again_after_training():
    from petl_nas.training.loading import TrainData
    from petl_nas.training.loop import Recipe, train

    task, base, _, encoded = prepare(spec(TOP_LORA))
    model = apply_petl(tiny_model(num_hidden_layers=4), TOP_LORA)
    model.config.name_or_path = "other"
    result = train(
        model,
        TrainData(encoded.train, encoded.search_dev),
        task,
        Recipe(**{**RECIPE, "epochs": 1, "frozen_cache_mb": 100}),
    )
    assert result.frozen["cached"]["train"]
    assert not any("forward" in vars(layer) for layer in frozen.encoder_layers(model, "classification"))


def test_reuse_does_not_apply_where_nothing_below_is_frozen_or_to_generation():
    assert run_trial(spec(dataclasses.replace(TOP_LORA, bitfit=True))).frozen is None
    from petl_nas.search.worker import resolve_task
    from petl_nas.training.loading import load_backbone

    task = resolve_task("demo_sentiment")
    model, _ = load_backbone(TINY, task)
    assert frozen.encoder_layers(model, "seq2seq") is None and frozen.encoder_layers(model, "causal_lm") is None


def test_a_negative_cache_size_is_refused():
    with pytest.raises(ConfigError, match="frozen_cache_mb"):
        Fidelity(length_buckets=0, frozen_cache_mb=-1)


@pytest.mark.slow
def test_a_search_on_upper_layers_records_what_each_trial_reused(tmp_path, monkeypatch):
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment, FinalEval

    monkeypatch.chdir(tmp_path)
    space = tmp_path / "upper.yaml"
    space.write_text(
        "version: 1\nname: upper\nslots:\n  attn: {site: attn, forms: [lora]}\n"
        "rank: {low: 1, high: 4}\nscale: 2.0\ncomposition: scaled\ninsertion: parallel\ninit: lora\ngates: false\n"
        "lora_targets: qv\nlayers: top\nbitfit: false\npooling: mean\n"
        "lr: {low: 3.0e-3, high: 3.0e-2, log: true}\n"
    )
    exp = Experiment(
        rates=NO_RATES,
        name="upper",
        backbone=TINY,
        task="demo_keyword",
        budget=None,
        space=str(space),
        trials=3,
        presets=[],
        executor="local",
        storage=f"sqlite:///{tmp_path}/study.db",
        fidelity=Fidelity(
            length_buckets=0, k=96, epochs=1, batch_size=16, max_length=16, search_dev=48, frozen_cache_mb=64
        ),
        final=FinalEval(seeds=0, baselines=False),
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name="upper", storage=exp.storage_url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3 and study.user_attrs["fidelity"]["frozen_cache_mb"] == 64
    first = {t.number: 4 - t.params["layers.top_k"] for t in done}  # layers: top -> the first trained layer
    assert any(first.values())
    for t in done:
        assert t.user_attrs.get("frozen", {}).get("layer", 0) == first[t.number]


def test_a_split_evicts_as_many_old_states_as_its_own_need_and_the_estimate_is_what_is_stored():
    """The bound holds whatever the order of sizes: a large split after two small ones evicts both
    (not just the oldest), and the size the bound is checked with is the size actually stored."""
    from petl_nas.training.loading import petl_copy

    _, base, _, encoded = prepare(spec(TOP_LORA))
    model = petl_copy(base, TOP_LORA, 0)
    layers = frozen.encoder_layers(model, "classification")
    lower, upper = (frozen.FrozenReuse(model, layers, k, 100, "cpu") for k in (2, 3))
    assert lower.cache(encoded.train, "train")
    assert frozen.stored_mb() == pytest.approx(lower._estimate_mb(encoded.train), rel=1e-6)  # fp32 on a CPU
    frozen.clear()
    dev_mb, train_mb = lower._estimate_mb(encoded.search_dev), lower._estimate_mb(encoded.train)
    assert lower.cache(encoded.search_dev, "dev") and upper.cache(encoded.search_dev, "dev")  # two small ones
    bound = train_mb + dev_mb / 2  # the large one fits only once both are dropped
    large = frozen.FrozenReuse(model, layers, 2, bound, "cpu")
    assert large.cache(encoded.train, "train")
    assert 0 < frozen.stored_mb() <= bound


@pytest.mark.slow
def test_states_computed_at_one_precision_are_not_fed_to_a_run_at_another():
    """A bf16 run computes its frozen layers in bf16: states an fp32 run cached are not its own."""
    fp32 = run_trial(spec(TOP_LORA, precision="fp32", epochs=1))
    bf16 = run_trial(spec(TOP_LORA, precision="bf16", epochs=1))
    assert fp32.frozen["fill_s"] > 0 and bf16.frozen["fill_s"] > 0


@pytest.mark.slow
def test_the_test_split_scored_at_the_end_is_each_seeds_own_model_on_every_row():
    """A run that is also a final run scores the test split once at its end (`TrainData.report`),
    through the frozen layers' cache: that score is what evaluating its trained model afresh, every
    layer recomputed, gives; at each seed its own (the cache is shared across seeds, the model not)."""
    from petl_nas.training.loading import TrainData, petl_copy
    from petl_nas.training.loop import Recipe, evaluate, train

    task, base, _, encoded = prepare(spec(TOP_LORA))
    reported, fresh = [], []
    for seed in range(3):
        model = petl_copy(base, TOP_LORA, seed)
        result = train(
            model,
            TrainData(encoded.train, encoded.search_dev, encoded.test),
            task,
            Recipe(
                lr=3e-2,
                epochs=8,
                batch_size=16,
                max_length=16,
                seed=seed,
                evals_per_epoch=0,
                length_buckets=8,
                frozen_cache_mb=100,
            ),
        )
        assert result.frozen["cached"]["report"]
        reported.append(result.report_metrics)
        fresh.append(evaluate(model, encoded.test, task, 128, "cpu"))
    assert [r[task.main_metric] for r in reported] == [f[task.main_metric] for f in fresh]
    assert len({r[task.main_metric] for r in reported}) == 3  # three models, three scores
