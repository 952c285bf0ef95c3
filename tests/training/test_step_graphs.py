"""CUDA graphs for a run's steps (``fidelity.cuda_graphs``), the parts that hold on any machine.

Recording itself needs a GPU (`test_step_graphs_cuda.py`). Here: padding batches to a multiple of 8
tokens changes their shapes and not what a model computes; a run asked for graphs where they
cannot apply trains exactly as without and says why; the optimiser made recordable follows its
schedule through device-tensor rates and comes back to numbers, so that a checkpoint saved by a
graphed run resumes in an eager one; the setting reaches a search's trials and is refused where
it cannot combine.
"""

from __future__ import annotations

import dataclasses

import optuna
import pytest
import torch
from conftest import tiny_config, tiny_model
from test_precision import Rows
from test_search import experiment

from petl_nas import apply_petl, preset
from petl_nas.deploy.export import record
from petl_nas.errors import ConfigError
from petl_nas.search.driver import run_search
from petl_nas.study.experiment import Fidelity
from petl_nas.tasks import get_task
from petl_nas.tasks.encoding import EncodedSplit
from petl_nas.training import checkpoint
from petl_nas.training.loop import Recipe, _linear_schedule, adamw, param_groups, train
from petl_nas.training.step_graphs import LENGTH_MULTIPLE, prepare_optimizer, why_not


def split(lengths=(3, 9, 5, 17, 12, 1, 8, 6), seed=0) -> EncodedSplit:
    g = torch.Generator().manual_seed(seed)
    ids = tuple(torch.randint(3, 120, (n,), generator=g).tolist() for n in lengths)
    return EncodedSplit(ids, None, torch.arange(len(lengths)) % 2, pad_token_id=0)


def test_batches_padded_to_a_multiple_change_shapes_not_what_a_model_computes():
    rows = split()
    model = apply_petl(tiny_model(), preset("unipelt_apl", tiny_config()))  # eval mode: no dropout
    plain = list(rows.batches(3, shuffle=True, seed=4))
    padded = list(rows.batches(3, shuffle=True, seed=4, multiple=LENGTH_MULTIPLE))
    assert len(padded) == len(plain) == 3
    for a, b in zip(plain, padded):
        width = a["input_ids"].shape[1]
        assert b["input_ids"].shape[1] % LENGTH_MULTIPLE == 0 and 0 <= b["input_ids"].shape[1] - width < LENGTH_MULTIPLE
        assert torch.equal(b["attention_mask"].sum(1), a["attention_mask"].sum(1))  # the same tokens
        assert torch.equal(b["input_ids"][:, :width], a["input_ids"]) and torch.equal(b["labels"], a["labels"])
        assert (b["input_ids"][:, width:] == 0).all()
        with torch.no_grad():
            logits = {
                k: model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
                for k, x in (("plain", a), ("padded", b))
            }
        torch.testing.assert_close(logits["padded"], logits["plain"], rtol=1e-5, atol=1e-6)


def lora_model():
    return apply_petl(tiny_model(), preset("lora", tiny_config()))


def trained(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_a_run_asked_for_graphs_where_they_cannot_apply_trains_as_without_and_says_why():
    runs = {}
    for graphs in (False, True):
        model = lora_model()
        data = type("D", (), {"train": Rows(), "dev": Rows()})()
        result = train(
            model, data, get_task("demo_sentiment"), Recipe(lr=1e-2, epochs=3, batch_size=4, cuda_graphs=graphs)
        )
        runs[graphs] = (result, trained(model))
    assert runs[False][0].graphs is None
    assert runs[True][0].graphs == {
        "used": False,
        "why_not": "no CUDA device",
        "shapes": [],
        "eager_steps": 0,
        "replays": 0,
    }
    for name, value in runs[False][1].items():
        assert torch.equal(runs[True][1][name], value)


def test_why_not_names_what_keeps_a_step_from_being_recorded():
    cuda = torch.device("cuda")
    plain = dict(scaled=False, regularized=False, frozen_reuse=False, compiled=False)
    assert why_not(cuda, **plain) is None
    assert why_not(torch.device("cpu"), **plain) == "no CUDA device"
    for flag, words in (
        ("scaled", "fp16 loss scaling"),
        ("regularized", "regulariser"),
        ("frozen_reuse", "frozen-layer reuse"),
        ("compiled", "torch.compile"),
        ("layerdrop", "LayerDrop"),
    ):
        assert words in why_not(cuda, **{**plain, flag: True})


@pytest.mark.slow
def test_a_model_with_layerdrop_is_not_recorded(monkeypatch):
    """LayerDrop (BART, M2M100, Marian, ...: ``encoder_layerdrop``) picks the layers on the host at
    every step; a graph would replay one pick forever. The run tells `why_not` so."""
    import petl_nas.training.loop as training

    asked = []
    monkeypatch.setattr(training, "why_not", lambda device, **kw: asked.append(kw["layerdrop"]) or "no CUDA device")
    for drop in (0.0, 0.05):
        model = lora_model()
        model.config.encoder_layerdrop = drop
        data = type("D", (), {"train": Rows(), "dev": Rows()})()
        train(model, data, get_task("demo_sentiment"), Recipe(lr=1e-2, epochs=1, batch_size=4, cuda_graphs=True))
    assert asked == [False, True]


def optimizer_and_schedule(model, lr=1e-2, total=10, warmup=3):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(param_groups(model, params, Recipe(lr=lr)), lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _linear_schedule(s, total, warmup))
    return opt, sched


def test_a_recordable_optimizer_reads_its_schedule_from_tensors_and_turns_back_into_numbers():
    numbers, tensors = (optimizer_and_schedule(lora_model()) for _ in range(2))
    prepare_optimizer(tensors[0], torch.device("cpu"), graphed=True)
    for group in tensors[0].param_groups:
        assert isinstance(group["lr"], torch.Tensor) and group["lr"].dim() == 0 and group["capturable"]
        assert not isinstance(group["initial_lr"], torch.Tensor)  # the schedule's base is not aliased
    rates = [group["lr"] for group in tensors[0].param_groups]
    for _ in range(6):
        numbers[1].step()
        tensors[1].step()
        for group, plain, rate in zip(tensors[0].param_groups, numbers[0].param_groups, rates):
            assert group["lr"] is rate  # filled in place: a graph reads it there
            assert float(rate) == pytest.approx(plain["lr"], rel=1e-6)
    prepare_optimizer(tensors[0], torch.device("cpu"), graphed=False)
    for group, plain in zip(tensors[0].param_groups, numbers[0].param_groups):
        assert type(group["lr"]) is float and group["lr"] == pytest.approx(plain["lr"], rel=1e-6)
        assert group["capturable"] is False


def test_a_state_saved_by_a_graphed_run_resumes_in_an_eager_one(tmp_path):
    """A graphed run's checkpoint holds device-tensor rates and ``capturable``; a CPU run resuming it
    must train with numbers (fused AdamW refuses capturable tensors on a CPU)."""
    task, recipe = get_task("demo_sentiment"), Recipe(lr=1e-2, epochs=2, batch_size=4)
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    model = lora_model()
    opt, sched = optimizer_and_schedule(model, total=2, warmup=1)
    prepare_optimizer(opt, torch.device("cpu"), graphed=True)  # as a graphed run leaves it
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    checkpoint.save(checkpoint.capture(model, opt, sched, scaler, step=0, epoch=0, history=[]), tmp_path / "s.pt")
    saved = []
    result = train(lora_model(), data, task, recipe, resume=checkpoint.load(tmp_path / "s.pt"), on_epoch=saved.append)
    assert result.steps == 2
    for group in saved[-1]["opt"]["param_groups"]:
        assert type(group["lr"]) is float and group["capturable"] is False


def test_the_setting_is_checked_and_reaches_a_searchs_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="fidelity: cuda_graphs: expected true or false"):
        Fidelity(length_buckets=0, cuda_graphs="yes")
    with pytest.raises(ConfigError, match="cuda_graphs cannot be combined with compile"):
        Fidelity(length_buckets=0, cuda_graphs=True, compile="default")
    with pytest.raises(ConfigError, match="cuda_graphs cannot be combined"):
        Fidelity(length_buckets=0, cuda_graphs=True, frozen_cache_mb=64)
    exp = experiment(tmp_path, trials=1, presets=["bitfit"])
    exp = dataclasses.replace(exp, fidelity=dataclasses.replace(exp.fidelity, cuda_graphs=True))
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    graphs = study.trials[0].user_attrs["graphs"]
    assert graphs["used"] == torch.cuda.is_available()
    assert graphs["why_not"] == (None if torch.cuda.is_available() else "no CUDA device")
    assert record(study, study.trials[0], recipe="search").recipe["cuda_graphs"] is True  # the exported runs too
