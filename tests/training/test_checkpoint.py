"""Resuming training from an epoch boundary: a run killed after an epoch and resumed from the state
it saved ends exactly where the uninterrupted run ends (parameters, history, dropout draws). Also
what a run's progress bar ends on: the score the run reports."""

import copy

import pytest
import torch
from conftest import TINY_BACKBONE

from petl_nas import PetlConfig, apply_petl
from petl_nas.core.config import ModuleSpec
from petl_nas.errors import ConfigError
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.tasks.encoding import encode
from petl_nas.training import checkpoint
from petl_nas.training.loading import TrainData, load_backbone
from petl_nas.training.loop import Recipe, train


class Killed(Exception):
    pass


def _setup():
    task = resolve_task("demo_keyword")
    splits = load_splits(task, k=160, data_seed=111, search_dev_size=32)
    base, tok = load_backbone(TINY_BACKBONE, task, splits)
    encoded = encode(splits, tok, max_length=24)
    config = PetlConfig(
        modules=(ModuleSpec(form="lora", position="attn", targets=("q", "v"), size=4, dropout=0.1),), pooling="mean"
    )
    return task, base, TrainData(encoded.train, encoded.search_dev), config


def _trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_a_run_resumed_from_its_last_epoch_ends_as_the_uninterrupted_run(tmp_path):
    task, base, data, config = _setup()
    recipe = Recipe(lr=3e-3, epochs=3, batch_size=16, seed=5, length_buckets=4)
    torch.manual_seed(0)
    whole = apply_petl(copy.deepcopy(base), config)
    expected = train(whole, data, task, recipe)

    path = tmp_path / "state.pt"

    def kill_after_one(state):
        checkpoint.save(state, path)
        raise Killed

    torch.manual_seed(0)  # the same initial LoRA weights
    killed = apply_petl(copy.deepcopy(base), config)
    with pytest.raises(Killed):
        train(killed, data, task, recipe, on_epoch=kill_after_one)
    torch.manual_seed(999)  # a new process: other weights, other draws
    resumed = apply_petl(copy.deepcopy(base), config)
    state = checkpoint.load(path)
    assert state["epoch"] == 1 and state["step"] == len(data.train) // 16 + (len(data.train) % 16 > 0)
    got = train(resumed, data, task, recipe, resume=state)
    assert got.steps == expected.steps and got.history == expected.history
    assert got.steps_timed == got.steps - state["step"] and expected.steps_timed == expected.steps  # this call's
    a, b = _trainable(whole), _trainable(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_a_state_of_another_model_is_refused_before_anything_is_changed():
    task, base, data, config = _setup()
    model = apply_petl(copy.deepcopy(base), config)
    states = []
    train(model, data, task, Recipe(lr=3e-3, epochs=1, batch_size=16), on_epoch=states.append)
    other = apply_petl(
        copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(form="lora", position="attn", targets=("q",), size=2),))
    )
    before = _trainable(other)
    with pytest.raises(ValueError, match="does not fit"):
        train(other, data, task, Recipe(lr=3e-3, epochs=2, batch_size=16), resume=states[0])
    after = _trainable(other)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_a_state_saved_with_more_gpus_visible_restores_the_generators_there_are(monkeypatch):
    """Saved on a 2-GPU machine, resumed where one is visible (Ray sets CUDA_VISIBLE_DEVICES)."""
    from petl_nas.training import checkpoint

    task, base, data, config = _setup()
    model = apply_petl(copy.deepcopy(base), config)
    states = []
    train(model, data, task, Recipe(lr=3e-3, epochs=1, batch_size=16), on_epoch=states.append)
    state = {**states[0], "cuda_rng": [torch.get_rng_state(), torch.get_rng_state()]}
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda rng, device="cuda": restored.append(device))
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in trained if p.ndim >= 2]},  # train's groups: matrices,
            {"params": [p for p in trained if p.ndim < 2]},
        ]
    )  # then the rest
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    checkpoint.restore(state, model, opt, sched, torch.amp.GradScaler("cpu", enabled=False))
    assert restored == [0]


def test_saving_is_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    checkpoint.save({"epoch": 1}, path)

    def crash(obj, f):
        open(f, "wb").write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"epoch": 2}, path)
    assert checkpoint.load(path) == {"epoch": 1} and checkpoint.load(tmp_path / "none.pt") is None


def test_the_progress_bar_ends_on_the_reported_score(capsys):
    task, base, data, config = _setup()
    result = train(
        apply_petl(copy.deepcopy(base), config),
        data,
        task,
        Recipe(lr=3e-2, epochs=3, batch_size=16, evals_per_epoch=2),
        progress=True,
    )
    scores = [h[task.main_metric] for h in result.history]
    assert scores[-1] != scores[-2]  # else the bar could show the one before and pass
    last_line = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"{task.main_metric}={result.last_score:.4f}" in last_line, last_line
    assert f"loss={result.history[-1]['loss']:.4f} (step {result.steps})" in last_line, last_line  # read when


def test_each_epoch_shuffles_with_its_own_seed():
    """`train.train`: epoch e of a run with seed s draws its order from ``epoch_seed(s, e)``, so no
    two epochs of a run repeat one order."""
    from petl_nas.training.loop import epoch_seed

    task = resolve_task("demo_keyword")
    splits = load_splits(task, k=48, data_seed=111, search_dev_size=16)
    tiny = {
        "tiny": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 400,
        }
    }
    base, tok = load_backbone(tiny, task, splits)
    encoded = encode(splits, tok, max_length=16)

    class Recording:
        """The training split, noting the seed of each epoch's shuffle."""

        def __init__(self, split):
            self.split, self.seeds = split, []
            self.labels = split.labels

        def __len__(self):
            return len(self.split)

        def batches(self, batch_size, shuffle=False, seed=0, order=None, multiple=1):
            self.seeds.append(seed)
            return self.split.batches(batch_size, shuffle=shuffle, seed=seed, order=order, multiple=multiple)

    train_split = Recording(encoded.train)
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(form="lora", size=2),), pooling="mean"))
    train(
        model,
        TrainData(train_split, encoded.search_dev),
        task,
        Recipe(lr=1e-3, epochs=3, batch_size=16, seed=5, evals_per_epoch=0),
    )
    assert train_split.seeds == [epoch_seed(5, e) for e in range(3)]
    assert len(set(train_split.seeds)) == 3


# ---- the recipe's schedule and clipping, as the loop applies them ------------------------------
def test_the_learning_rate_warms_up_from_the_first_step_then_decays_linearly_to_zero():
    from petl_nas.training.loop import _linear_schedule

    assert [_linear_schedule(s, 10, 4) for s in range(11)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0]
    )


def test_the_loop_warms_up_over_its_share_of_all_steps():
    """warmup_ratio is a share of the whole run's steps: after the first of 4 epochs (10 steps of 40,
    4 of warm-up) the rate is (40 - 10) / (40 - 4) of the peak."""
    task, base, data, config = _setup()
    rates = []
    torch.manual_seed(0)
    train(
        apply_petl(copy.deepcopy(base), config),
        data,
        task,
        Recipe(lr=1e-2, epochs=4, batch_size=16, warmup_ratio=0.1, evals_per_epoch=0),
        on_epoch=lambda state: rates.append(state["sched"]["_last_lr"][0]),
    )
    assert len(data.train) == 160 and rates[0] == pytest.approx(1e-2 * 30 / 36)


def test_gradients_are_clipped_to_max_grad_norm():
    """AdamW divides a step by the gradient's own size, so clipping shows where it shrinks the
    gradient below AdamW's eps: clipped to 1e-12, the trained weights stay where they started."""
    task, base, data, config = _setup()
    moved = []
    for norm in (1.0, 1e-12):
        torch.manual_seed(0)
        model = apply_petl(copy.deepcopy(base), config)
        before = _trainable(model)
        train(
            model,
            data,
            task,
            Recipe(lr=1e-2, epochs=1, batch_size=16, weight_decay=0.0, max_grad_norm=norm, evals_per_epoch=0),
        )
        after = _trainable(model)
        moved.append(max(float((after[n] - before[n]).abs().max()) for n in before))
    assert moved[0] > 1e-3 and moved[1] < 1e-5


class _RunsCode:
    """What a crafted file holds: unpickling it calls ``Path.touch`` on the marker."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_a_state_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "state.pt"
    torch.save({"step": 1, "params": {}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(ConfigError, match=r"state\.pt: not a training state petl-nas can load safely"):
        checkpoint.load(path)
    assert not marker.exists()
    path.write_bytes(b"not a zip archive")  # nor a file of another format
    with pytest.raises(ConfigError, match="nothing in it was run"):
        checkpoint.load(path)


def test_a_real_state_loads_weights_only(tmp_path):
    """AdamW, the warm-up schedule, the loss scaler, the generators and the history all load with
    ``weights_only=True``, so the safe load costs nothing."""
    task, base, data, config = _setup()
    path, saved = tmp_path / "state.pt", []
    train(
        apply_petl(copy.deepcopy(base), config),
        data,
        task,
        Recipe(lr=3e-3, epochs=1, batch_size=16),
        on_epoch=lambda state: (checkpoint.save(state, path), saved.append(state)),
    )
    state = checkpoint.load(path)
    assert set(state) == set(saved[0]) and state["history"] == saved[0]["history"]
    assert torch.equal(state["rng"], saved[0]["rng"]) and state["opt"]["state"]
