"""torch.compile for a run (``fidelity.compile``) and a training loop that does not wait on the GPU.

A compiled forward must be the eager one, traced as one graph (a graph break at every gate left
UniPELT eager on a GPU: `compose.mean_weights`); a compiled run trains the same weights; the
run's own model stays eager for what follows; a non-finite loss is still named with its step,
though the loop no longer reads each loss on the host.
"""

from __future__ import annotations

import pytest
import torch
from conftest import batch, tiny_config, tiny_model
from test_precision import Rows
from torch import nn

from petl_nas import apply_petl, preset, preset_names
from petl_nas.errors import ConfigError
from petl_nas.study.experiment import Fidelity
from petl_nas.tasks import get_task
from petl_nas.training.compiling import COMPILE_MODES, compiled
from petl_nas.training.loop import LossWatch, NonFiniteLoss, Recipe, train

ONE_GRAPH = [name for name in preset_names() if name != "prompt_tuning"]  # its input hook is a graph of its own


def petl_model(name: str) -> nn.Module:
    return apply_petl(tiny_model(), preset(name, tiny_config()))


@pytest.mark.parametrize("name", ONE_GRAPH)
@pytest.mark.slow
def test_every_preset_traces_as_one_graph(name):
    model = petl_model(name).train()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**batch())
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]


@pytest.mark.parametrize("name", ["unipelt_apl", "compacter", "houlsby"])
@pytest.mark.slow
def test_a_compiled_forward_is_the_eager_one(name):
    model = petl_model(name)  # eval mode: no dropout
    torch._dynamo.reset()
    eager = model(**batch()).logits
    out = compiled(model, "default")(**batch()).logits
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_models_of_one_class_compiled_in_one_process_keep_their_own_graphs():
    """Dynamo reuses compiled code across instances of a class whose guards pass; PETL modules live
    in hooks, which it does not guard on by default: without `compiled`'s hook guards, MAM, LoRA and
    Houlsby compiled after a frozen model without modules computed as that model (seen first as
    compiled step times equal to the frozen floor's)."""
    torch._dynamo.reset()
    frozen = tiny_model()  # the body frozen as apply_petl freezes it, no modules
    for name, p in frozen.named_parameters():
        p.requires_grad_(name.startswith("classifier"))
    models = [frozen, petl_model("mam"), petl_model("lora"), petl_model("houlsby")]
    with torch.no_grad():  # zero-initialised modules would hide a mix-up
        for model in models:
            for name, p in model.named_parameters():
                if p.requires_grad and name.startswith("petl."):
                    p.add_(0.05 * torch.randn_like(p))
    nets = [compiled(model, "default") for model in models]
    for _ in range(2):
        for model, net in zip(models, nets):
            torch.testing.assert_close(net(**batch()).logits, model(**batch()).logits, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_process_compiles_run_after_run_without_reaching_the_recompile_limit():
    """Each run's configuration is a new graph of the same forward: a worker that kept them all
    would pass Dynamo's recompile limit after a few trials and run later ones eagerly, silently
    (here the limit is 2, a run's training and evaluation graphs, and reaching it raises)."""
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for name in ("lora", "houlsby", "compacter"):
            train(petl_model(name), data, get_task("demo_sentiment"), Recipe(epochs=1, batch_size=4, compile="default"))


def no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


@pytest.mark.slow
def test_a_compiled_run_trains_the_same_weights_and_leaves_the_model_eager():
    trained = {}
    for mode in ("off", "default"):
        torch._dynamo.reset()
        model = no_dropout(apply_petl(tiny_model(), preset("unipelt_apl", tiny_config())))
        data = type("D", (), {"train": Rows(), "dev": Rows()})()
        result = train(model, data, get_task("demo_sentiment"), Recipe(lr=1e-2, epochs=3, batch_size=4, compile=mode))
        assert result.steps == 3
        assert result.steps_timed == (3 if mode == "off" else 2)  # one shape: its compiled first step left out
        assert not isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
        assert getattr(model, "_compiled_call_impl", None) is None  # the caller's model is not compiled
        trained[mode] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    start = {
        n: p
        for n, p in apply_petl(tiny_model(), preset("unipelt_apl", tiny_config())).named_parameters()
        if p.requires_grad
    }
    assert any(not torch.allclose(trained["off"][n], start[n]) for n in start)  # it did train
    for n in trained["off"]:
        torch.testing.assert_close(trained["default"][n], trained["off"][n], rtol=1e-4, atol=1e-5)


def test_modes_are_torchs_and_bad_ones_are_refused():
    assert COMPILE_MODES == ("off", "default", "reduce-overhead", "max-autotune")
    model = petl_model("lora")
    assert compiled(model, "off") is model
    with pytest.raises(ValueError, match="compile: expected one of off, default"):
        compiled(model, "fast")
    with pytest.raises(ConfigError, match="fidelity: compile: expected one of off, default, reduce-overhead"):
        Fidelity(length_buckets=0, compile="fast")
    assert Fidelity(length_buckets=0, compile=False).compile == "off"  # a bare ``compile: off`` in a YAML file
    with pytest.raises(ConfigError, match="got true \\(YAML reads on and yes as true: name a mode"):
        Fidelity(length_buckets=0, compile=True)
    with pytest.raises(ValueError, match="got False \\(YAML reads a bare off"):
        compiled(model, False)
    with pytest.raises(ConfigError, match="compile and frozen_cache_mb cannot be combined"):
        Fidelity(length_buckets=0, compile="default", frozen_cache_mb=64)
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    with pytest.raises(ValueError, match="compile and frozen_cache_mb cannot be combined"):
        train(
            model,
            data,
            get_task("demo_sentiment"),
            Recipe(epochs=1, batch_size=4, compile="default", frozen_cache_mb=8),
        )


def test_the_loss_watch_names_the_first_bad_step_across_checks():
    watch = LossWatch(every=4)
    for step, value in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, float("nan"), 7.0]):
        watch.see(torch.tensor(value), step)  # steps 0-3 checked and fine; 4-6 kept
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 5$"):
        watch.see(torch.tensor(float("inf")), 7)  # the check of steps 4-7 names the first bad one


def test_a_run_whose_loss_turns_nan_stops_naming_its_step():
    calls = []

    def regularizer():  # NaN from the third step on
        calls.append(1)
        return torch.tensor(float("nan") if len(calls) >= 3 else 0.0)

    model = petl_model("lora")
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 2$"):
        train(model, data, get_task("demo_sentiment"), Recipe(epochs=5, batch_size=4), regularizer=regularizer)


@pytest.mark.slow
def test_train_compiles_a_record_on_request_and_saves_the_same_weight_names(tmp_path, capsys):
    from conftest import TINY_BACKBONE as TINY
    from safetensors.torch import load_file
    from test_export import LORA

    from petl_nas.app.cli import main
    from petl_nas.deploy.export import write_record

    rec = {
        "backbone": TINY,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 120,
        "petl_config": LORA,
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 32, "max_length": 24},
        "seeds": 1,
        "counts": {},
    }
    write_record(rec, tmp_path / "best.yaml")
    graphs = {}
    for mode, out in (("off", "eager"), ("default", "compiled")):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        assert (
            main(
                [
                    "train",
                    "--config",
                    str(tmp_path / "best.yaml"),
                    "--out",
                    str(tmp_path / out),
                    "--no-progress",
                    "--compile",
                    mode,
                ]
            )
            == 0
        )
        graphs[mode] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs["off"] == 0 and graphs["default"] > 0  # the flag reached the run
    eager, comp = (load_file(tmp_path / out / "seed_0" / "petl_weights.safetensors") for out in ("eager", "compiled"))
    assert sorted(comp) == sorted(eager) and not any("_orig_mod" in name for name in comp)
    for name in eager:  # dropout draws differ under compile: close, not equal
        assert comp[name].shape == eager[name].shape
    with pytest.raises(SystemExit) as e:
        main(["train", "--config", str(tmp_path / "best.yaml"), "--compile", "fast"])
    assert e.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err
