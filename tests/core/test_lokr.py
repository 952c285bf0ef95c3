"""LoKr against its formula and PEFT's ``LoKrConfig``: PEFT's factor shapes, exact counts (MiniLM's
256 + 48·r per 384×384 weight), identity at the start, PEFT's outputs and delta weight after copying
weights, only its tensors train, save/load, its PEFT config loads, its rate probe, and the space
samples it and maps it back."""

from __future__ import annotations

import copy
import warnings

import optuna
import peft
import pytest
import torch
from conftest import TINY, batch, tiny_model
from peft.tuners.lokr.layer import factorization
from transformers import BertConfig

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_parameters, load_petl, save_petl
from petl_nas.core.forms import form_named
from petl_nas.core.modules.lokr import factor_pair, lokr_count

BERT_PATHS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}
MINILM = BertConfig(
    hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, vocab_size=100, num_labels=2
)


def lokr(**kw) -> ModuleSpec:
    return ModuleSpec(**{"form": "lokr", "size": 2, **kw})


def ours(spec: ModuleSpec, base=None):
    with warnings.catch_warnings():  # the tiny model's untrained pooler
        warnings.simplefilter("ignore")
        return apply_petl(copy.deepcopy(base or tiny_model()), PetlConfig(modules=(spec,), pooling="pooler"))


def randomise(model, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g))


def peft_twin(base, spec: ModuleSpec):
    """PEFT's model of ``spec`` from the form's own hooks (peft_type, peft_fields)."""
    form = form_named(spec.form)
    regex = r".*\.layer\.\d+\.(" + "|".join(BERT_PATHS[t].replace(".", r"\.") for t in spec.targets) + ")"
    config = peft.get_peft_config(
        {"peft_type": form.peft_type, "task_type": "SEQ_CLS", **form.peft_fields(spec, regex)}
    )
    return peft.get_peft_model(copy.deepcopy(base), config)


def pairs(model, twin):
    """(our module, PEFT's layer) per adapted weight."""
    for key, module in next(iter(model.petl.groups.values())).items():
        layer, target = key.split("_", 1)
        yield module, twin.get_submodule(f"base_model.model.bert.encoder.layer.{layer}.{BERT_PATHS[target]}")


def test_its_factors_are_peft_s():
    assert factor_pair(384) == (16, 24) and factor_pair(1536) == (32, 48) and factor_pair(7) == (1, 7)
    assert all(factor_pair(n) == factorization(n, -1) for n in range(1, 2049))


def test_the_genotype_takes_it_and_round_trips():
    spec = ModuleSpec.from_dict({"form": "lokr", "position": "ffn", "size": 4})
    assert spec.targets == ("ffn_in", "ffn_out") and spec.init == "lora" and spec.composition == "scaled"
    assert ModuleSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ConfigError, match=r"module\.dropout: lokr does not use it"):
        ModuleSpec.from_dict({"form": "lokr", "dropout": 0.1})
    with pytest.raises(ConfigError, match=r"module\.targets: unknown value 'x'"):
        ModuleSpec(form="lokr", targets=("x",))


@pytest.mark.parametrize("r, per_weight", [(1, 256 + 48), (8, 256 + 48 * 8), (11, 256 + 48 * 11), (12, 256 + 576)])
def test_on_minilm_q_v_it_counts_256_plus_48_r_per_weight_until_w2_is_full(r, per_weight):
    counts = count_parameters(MINILM, PetlConfig(modules=(lokr(size=r),)))
    assert counts.trainable == counts.deployable == 12 * per_weight == 12 * lokr_count(384, 384, r)
    if r == 1:
        assert counts.deployable == 3_648  # issue 86's figure for LoKr on q, v


@pytest.mark.parametrize("r, per_weight", [(23, 32 * 16 + 23 * (48 + 24)), (24, 32 * 16 + 48 * 24)])
def test_on_minilm_ffn_w2_is_full_from_half_its_longer_side(r, per_weight):
    """W1 (1536 x 384): W₁ 32×16, W₂ 48×24, a rank-r product below r = 24, full from there (W2 likewise)."""
    counts = count_parameters(MINILM, PetlConfig(modules=(lokr(position="ffn", size=r),)))
    assert counts.deployable == 6 * 2 * per_weight


@pytest.mark.parametrize(
    "spec",
    [lokr(), lokr(position="ffn", size=8, composition="add"), lokr(targets=("q", "k", "v", "o"), size=1, scale=3.0)],
    ids=["qv", "ffn-full-w2", "qkvo"],
)
def test_the_count_is_peft_s(spec):
    base = tiny_model()
    twin = peft_twin(base, spec)
    peft_count = sum(p.numel() for n, p in twin.named_parameters() if p.requires_grad and "classifier" not in n)
    d, ffn = TINY["hidden_size"], TINY["intermediate_size"]
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "ffn_in": (d, ffn), "ffn_out": (ffn, d)}
    formula = TINY["num_hidden_layers"] * sum(lokr_count(*shapes[t], spec.size) for t in spec.targets)
    assert count_parameters(base.config, PetlConfig(modules=(spec,))).deployable == formula == peft_count


def test_it_starts_as_the_identity():
    base = tiny_model()
    with torch.no_grad():
        expected = base(**batch()).logits
    model = ours(lokr(position="ffn"), base)
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, expected)
    assert all(not m.W1.any() for m in model.petl.modules() if hasattr(m, "W1"))


@pytest.mark.parametrize(
    "spec",
    [
        lokr(scale=0.5),
        lokr(position="ffn", size=8, composition="add"),
        lokr(targets=("q", "k", "v", "o"), size=1, scale=3.0),
    ],
    ids=["qv", "ffn-full-w2", "qkvo"],
)
def test_after_copying_weights_it_predicts_as_peft(spec):
    base = tiny_model()
    model, twin = ours(spec, base), peft_twin(base, spec)
    randomise(model)
    for module, layer in pairs(model, twin):
        form_named("lokr").peft_weights(module, layer)
        torch.testing.assert_close(module.delta_weight(), layer.get_delta_weight("default"), atol=1e-6, rtol=0)
    model.eval(), twin.eval()
    with torch.no_grad():
        got, want, bare = (m(**batch(), output_hidden_states=True) for m in (model, twin, base))
    assert (got.hidden_states[-1] - bare.hidden_states[-1]).abs().max() > 0.1  # the update is not small
    torch.testing.assert_close(got.hidden_states[-1], want.hidden_states[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=0)


def test_only_its_tensors_train_and_w1_moves_first():
    model = ours(lokr()).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(**batch(), labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert all(n.startswith(("petl.", "classifier.")) for n in changed), changed
    assert any(n.endswith(".W1") for n in changed)  # W₂ gets no gradient while W₁ = 0


def test_it_saves_and_loads_to_the_same_outputs(tmp_path):
    model = ours(lokr(position="ffn", size=8))
    randomise(model)
    with torch.no_grad():
        expected = model(**batch()).logits
    save_petl(model, tmp_path)
    loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**batch()).logits, expected)


def test_its_peft_config_loads_and_peft_refuses_a_gate():
    form = form_named("lokr")
    spec = lokr(size=4, scale=2.0)
    config = peft.get_peft_config(
        {"peft_type": form.peft_type, "task_type": "SEQ_CLS", **form.peft_fields(spec, r".*\.(query|value)")}
    )
    assert isinstance(config, peft.LoKrConfig) and (config.r, config.alpha, config.decompose_factor) == (4, 8.0, -1)
    assert form.peft_refusal(spec, "m") is None
    assert "no gate" in form.peft_refusal(lokr(gate=True), "m")


def test_its_rate_is_calibrated_on_its_preset():
    from petl_nas.search.rates import FAMILY_PROBES, probe
    from petl_nas.study.space import SearchSpace

    assert FAMILY_PROBES["lokr"] == ("lokr",)
    space = SearchSpace.load("unified")
    name, config = probe("lokr", space, MINILM, 11_357)  # 0.05% of MiniLM: r=8 on q, v fits
    assert name == "lokr" and count_parameters(MINILM, config).deployable == 12 * (256 + 48 * 8)
    name, config = probe("lokr", space, MINILM, 4_000)
    assert "sizes 1 to fit" in name and count_parameters(MINILM, config).deployable == 3_648


def test_a_space_samples_it_and_maps_it_back():
    from petl_nas.core.describe import describe_config
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "lokr",
            "slots": {"attn": {"site": "attn", "forms": ["lokr"]}, "ffn": {"site": "ffn", "forms": ["none", "lokr"]}},
            "rank": {"low": 1, "high": 16},
            "composition": "scaled",
            "scale": {"low": 0.5, "high": 2.0},
            "lora_targets": ["qv", "qkvo"],
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(8):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=3)
        seen.add(len(config.modules))
        assert all(m.form == "lokr" and m.size == trial.params[f"{m.position}.rank"] for m in config.modules)
        assert space.params_for(config, trial.params["lr"], 3) == trial.params  # the same point
    assert seen == {1, 2}
    assert describe_config(config).startswith("attn LoKr r=")
