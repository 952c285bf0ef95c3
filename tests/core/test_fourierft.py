"""FourierFT (`petl_nas.core.forms.fourierft`): n trained coefficients per weight at frequencies
drawn from the spec's seed as PEFT's `FourierFTConfig` draws them. Counts equal n·L_t and PEFT's;
outputs equal PEFT's after copying the coefficients; ``init: lora`` starts at ΔW = 0 and the default
starts as PEFT's (N(0, 1)); only the coefficients (and the head) train; the frequencies never reach
the saved weights."""

from __future__ import annotations

import optuna
import pytest
import torch
from conftest import batch, tiny_model
from safetensors.torch import load_file
from test_vera import SHAPES, L, applied, outputs, peft_count, peft_reloaded, peft_twin, randomise

from petl_nas import ConfigError, ModuleSpec, PetlConfig, count_parameters, load_petl, save_petl
from petl_nas.core.inject import WEIGHTS_FILE, merge_lora

SPECS = {
    "q,v n=50 s=150": ModuleSpec(form="fourierft", size=50, composition="scaled", scale=150.0, seed=777),
    "ffn n=200 zero start": ModuleSpec(
        form="fourierft", position="ffn", size=200, composition="scaled", scale=20.0, init="lora", seed=1
    ),
    "k,o top layers, unscaled": ModuleSpec(
        form="fourierft", size=300, targets=("k", "o"), layers=(2,), composition="add"
    ),
}


@pytest.mark.parametrize("label", SPECS)
def test_the_count_is_the_formula_and_peft_s(label):
    spec = SPECS[label]
    base = tiny_model()
    formula = spec.size * len(spec.targets) * len(spec.layers or range(L))  # n · L_t
    counts = count_parameters(base.config, PetlConfig(modules=(spec,)))
    assert counts.trainable == counts.deployable == formula
    assert peft_count(peft_twin(base, spec)) == formula


@pytest.mark.parametrize("label", SPECS)
def test_outputs_equal_peft_s_after_copying_the_coefficients(label):
    spec = SPECS[label]
    base = tiny_model()
    ours = applied(spec, base)
    randomise(ours, seed=2)
    inputs = batch()
    expected, got = outputs(ours, inputs), outputs(peft_twin(base, spec, ours), inputs)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert (outputs(base, inputs) - expected).abs().max() > 1e-2  # the update matters


def test_the_peft_adapter_loads_elsewhere_and_predicts_the_same(tmp_path):
    """PEFT stores the coefficients and the seed, not the frequencies: it redraws them on loading."""
    spec = SPECS["q,v n=50 s=150"]
    base, inputs = tiny_model(), batch()
    ours = applied(spec, base)
    randomise(ours, seed=7)
    reloaded = peft_reloaded(base, peft_twin(base, spec, ours), tmp_path)
    assert reloaded.peft_config["default"].random_loc_seed == spec.seed
    assert torch.allclose(outputs(reloaded, inputs), outputs(ours, inputs), atol=1e-5)


def test_the_frequencies_are_peft_s_from_the_seed_and_nothing_else():
    spec = SPECS["ffn n=200 zero start"]
    group = applied(spec).petl.groups["0_ffn_fourierft"]
    twin = peft_twin(tiny_model(), spec)
    w1 = twin.base_model.model.bert.encoder.layer[0].intermediate.dense
    assert torch.equal(group["0_ffn_in"].where, w1.indices["default"])
    again = applied(spec).petl.groups["0_ffn_fourierft"]
    other = applied(ModuleSpec(form="fourierft", position="ffn", size=200, seed=2)).petl.groups["0_ffn_fourierft"]
    assert torch.equal(again["0_ffn_in"].where, group["0_ffn_in"].where)
    assert not torch.equal(other["0_ffn_in"].where, group["0_ffn_in"].where)
    (d_in, d_out) = SHAPES["ffn_out"]
    rows, cols = group["0_ffn_out"].where
    assert len(set(zip(rows.tolist(), cols.tolist()))) == 200 and rows.max() < d_out and cols.max() < d_in


def test_zero_start_is_the_identity_and_only_coefficients_train():
    base, inputs = tiny_model(), batch()
    model = applied(SPECS["ffn n=200 zero start"], base)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, base(**inputs).logits)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = {n: b.detach().clone() for n, b in model.named_buffers()}
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**inputs, labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert len({n for n in changed if n.endswith(".spectrum")}) == 2 * L
    assert all(n.startswith(("petl.", "classifier.")) for n in changed), changed
    assert all(torch.equal(b, frozen[n]) for n, b in model.named_buffers())


def test_the_default_start_is_peft_s_standard_normal():
    spec = ModuleSpec(form="fourierft", size=2000, targets=("ffn_in",), position="ffn", layers=(0,))
    assert spec.init == "bert" and spec.composition == "scaled"
    coefficients = applied(spec).petl.groups["0_ffn_fourierft"]["0_ffn_in"].spectrum
    assert abs(coefficients.mean().item()) < 0.1 and abs(coefficients.std().item() - 1) < 0.1
    assert not form_fields(spec)["init_weights"] and form_fields(SPECS["ffn n=200 zero start"])["init_weights"]


def form_fields(spec):
    from petl_nas.core.forms import form_named

    return form_named("fourierft").peft_fields(spec, "x")


def test_save_and_load_give_the_same_outputs_without_storing_the_frequencies(tmp_path):
    model = applied(SPECS["k,o top layers, unscaled"])
    randomise(model, seed=4)
    with torch.no_grad():
        expected = model(**batch()).logits
    save_petl(model, tmp_path)
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    assert sorted(k for k in saved if k.startswith("petl.")) == [
        "petl.groups.0_attn_fourierft.2_k.spectrum",
        "petl.groups.0_attn_fourierft.2_o.spectrum",
    ]
    loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**batch()).logits, expected)


def test_merging_folds_it_into_the_weights():
    model = applied(SPECS["q,v n=50 s=150"])
    randomise(model, seed=5)
    with torch.no_grad():
        expected = model(**batch()).logits
        assert merge_lora(model) == 2 * L
        assert torch.allclose(model(**batch()).logits, expected, atol=1e-5)


def test_bad_fields_are_one_clear_error():
    with pytest.raises(ConfigError, match=r"fourierft size n=2000 exceeds the 32×32 entries"):
        applied(ModuleSpec(form="fourierft", size=2000))
    with pytest.raises(ConfigError, match=r"module\.dropout: fourierft does not use it"):
        ModuleSpec(form="fourierft", dropout=0.1)
    spec = ModuleSpec.from_dict(
        {"form": "fourierft", "size": 64, "seed": 777, "init": "lora", "scale": 100.0, "composition": "scaled"}
    )
    assert ModuleSpec.from_dict(spec.to_dict()) == spec


def test_a_space_samples_it_and_maps_it_back():
    from petl_nas.core.describe import describe_config
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "fourierft",
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
            "slots": {
                "attn": {"site": "attn", "forms": ["none", "lora", "fourierft"]},
                "ffn": {"site": "ffn", "forms": ["none", "fourierft"]},
            },
            "frequencies": {"low": 10, "high": 1000, "log": True},
            "rank": {"low": 1, "high": 8},
            "composition": ["add", "scaled"],
            "scale": {"low": 1.0, "high": 4.0},
            "init": ["bert", "lora"],
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=3)
        for m in config.modules:
            seen.add((m.form, m.init))
            if m.form == "fourierft":
                assert 10 <= m.size <= 1000 and m.composition == "scaled" and m.scale == 140.0  # the paper's s
        assert space.params_for(config, trial.params["lr"], 3) is not None  # a point of the space
    assert {("fourierft", "bert"), ("fourierft", "lora")} <= seen
    assert (
        describe_config(PetlConfig(modules=(SPECS["ffn n=200 zero start"],)))
        == "ffn FourierFT n=200 on ffn_in,ffn_out zero start seed 1 scaled s=20"
    )
