"""DoRA (``dora: true`` on a LoRA module) against its formula and PEFT's ``LoraConfig(use_dora=True)``:
exact counts, identity at the start, PEFT's outputs after copying weights, the merged weight
m/‖W + s·B·A‖·(W + s·B·A) (also on GPT-2's fused projection, through the ``weight`` edit), only its
tensors train, save/load, its PEFT config loads, and the space samples it and maps it back."""

from __future__ import annotations

import copy
import warnings

import optuna
import peft
import pytest
import torch
from conftest import TINY, batch, tiny_model

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_parameters, load_petl, save_petl
from petl_nas.core.canonical import canonical
from petl_nas.core.forms import form_named

BERT_PATHS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}


def dora(**kw) -> ModuleSpec:
    return ModuleSpec(**{"form": "lora", "size": 2, "composition": "scaled", "scale": 2.0, "dora": True, **kw})


def ours(spec: ModuleSpec, base=None):
    with warnings.catch_warnings():  # the tiny model's untrained pooler
        warnings.simplefilter("ignore")
        return apply_petl(copy.deepcopy(base or tiny_model()), PetlConfig(modules=(spec,), pooling="pooler"))


def with_biases(model):
    """``model`` with random biases (a fresh one's are zeros): x·Wᵀ is then not the linear's output."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def randomise(model, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def peft_twin(base, spec: ModuleSpec):
    """PEFT's model of ``spec`` from the form's own hooks (peft_type, peft_fields)."""
    form = form_named(spec.form)
    regex = r".*\.layer\.\d+\.(" + "|".join(BERT_PATHS[t].replace(".", r"\.") for t in spec.targets) + ")"
    config = peft.get_peft_config(
        {"peft_type": form.peft_type, "task_type": "SEQ_CLS", **form.peft_fields(spec, regex)}
    )
    return peft.get_peft_model(copy.deepcopy(base), config)


def copy_into(model, twin, spec: ModuleSpec) -> None:
    for key, module in next(iter(model.petl.groups.values())).items():
        layer, target = key.split("_", 1)
        form_named(spec.form).peft_weights(
            module, twin.get_submodule(f"base_model.model.bert.encoder.layer.{layer}.{BERT_PATHS[target]}")
        )


def peft_trainable(twin) -> int:
    return sum(p.numel() for n, p in twin.named_parameters() if p.requires_grad and "classifier" not in n)


def test_the_genotype_takes_it_and_round_trips():
    spec = ModuleSpec.from_dict({"form": "lora", "dora": True})
    assert spec.dora and ModuleSpec.from_dict(spec.to_dict()) == spec
    assert "dora" in spec.to_dict() and "dora" not in ModuleSpec(form="lora").to_dict()
    with pytest.raises(ConfigError, match=r"module\.dora: "):
        ModuleSpec.from_dict({"form": "lora", "dora": "yes"})
    with pytest.raises(ConfigError, match=r"module\.dora: adapter does not use it"):
        ModuleSpec.from_dict({"form": "adapter", "dora": True})


@pytest.mark.parametrize("position", ["attn", "ffn"])
def test_the_count_is_loras_plus_one_magnitude_per_output_row_and_peft_s(position):
    spec = dora(position=position)
    base = tiny_model()
    d, ffn, layers, r = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"], spec.size
    shapes = {"q": (d, d), "v": (d, d), "ffn_in": (d, ffn), "ffn_out": (ffn, d)}  # (in, out)
    formula = layers * sum(r * (i + o) + o for i, o in (shapes[t] for t in spec.targets))
    counts = count_parameters(base.config, PetlConfig(modules=(spec,)))
    assert counts.trainable == counts.deployable == formula  # the head apart
    assert peft_trainable(peft_twin(base, spec)) == formula


@pytest.mark.parametrize("position", ["attn", "ffn"])
def test_it_starts_as_the_identity_and_its_magnitudes_are_the_weights_row_norms(position):
    base = tiny_model()
    with torch.no_grad():
        expected = base(**batch()).logits
    model = ours(dora(position=position), base)
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, expected)
    module = model.petl.groups["0_%s_lora" % position]["0_" + ("q" if position == "attn" else "ffn_in")]
    path = "bert.encoder.layer.0." + BERT_PATHS["q" if position == "attn" else "ffn_in"]
    assert torch.equal(module.magnitude, base.get_submodule(path).weight.norm(dim=1))


@pytest.mark.parametrize(
    "spec",
    [
        dora(),
        dora(position="ffn", init="bert", scale=0.5, size=3),
        dora(targets=("q", "k", "v", "o"), composition="add", scale=1.0),
    ],
    ids=["qv", "ffn", "qkvo"],
)
def test_after_copying_weights_it_predicts_as_peft(spec):
    base = with_biases(tiny_model())
    model, twin = ours(spec, base), peft_twin(base, spec)
    randomise(model)
    copy_into(model, twin, spec)
    model.eval(), twin.eval()
    with torch.no_grad():
        got, want, bare = (m(**batch(), output_hidden_states=True) for m in (model, twin, base))
    assert (got.hidden_states[-1] - bare.hidden_states[-1]).abs().max() > 0.1  # the update is not small
    torch.testing.assert_close(got.hidden_states[-1], want.hidden_states[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=0)


def merged_reference(base, model, paths: dict, rows=None):
    """``base`` with each adapted weight replaced by m/‖W + s·B·A‖·(W + s·B·A): DoRA folded in by hand."""
    merged = copy.deepcopy(base)
    with torch.no_grad():
        for key, module in next(iter(model.petl.groups.values())).items():
            layer, target = key.split("_", 1)
            linear = merged.get_submodule(paths[target].format(layer=layer))
            weight = linear.weight if rows is None else linear.weight.t()  # Conv1D keeps [in, out]
            part = weight if rows is None else weight[rows[target]]
            new = part + module.compose.fixed_scale * module.B @ module.A
            new = module.magnitude[:, None] / new.norm(dim=1, keepdim=True) * new
            if rows is None:
                weight.copy_(new)
            else:
                weight[rows[target]] = new
    return merged


def test_it_computes_the_merged_dora_weight():
    base = with_biases(tiny_model())
    model = ours(dora(targets=("q", "v", "o")), base)
    randomise(model)
    paths = {t: "bert.encoder.layer.{layer}." + BERT_PATHS[t] for t in BERT_PATHS}
    with torch.no_grad():
        torch.testing.assert_close(
            model(**batch()).logits, merged_reference(base, model, paths)(**batch()).logits, atol=1e-5, rtol=0
        )


def test_on_a_fused_projection_it_reads_its_slice_of_the_weight():
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    base = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, pad_token_id=0)
    ).eval()
    with_biases(base)
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(dora(targets=("q", "v")),)))
    ids = torch.randint(1, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    randomise(model)
    rows = {"q": slice(0, 16), "v": slice(32, 48)}  # c_attn: [q; k; v]
    reference = merged_reference(base, model, {t: "transformer.h.{layer}.attn.c_attn" for t in rows}, rows)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_only_its_tensors_train_the_magnitudes_among_them():
    model = ours(dora()).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(**batch(), labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert all(n.startswith(("petl.", "classifier.")) for n in changed), changed
    assert any(n.endswith(".magnitude") for n in changed) and any(n.endswith(".B") for n in changed)


def test_it_saves_and_loads_to_the_same_outputs(tmp_path):
    model = ours(dora(position="ffn"))
    randomise(model)
    with torch.no_grad():
        expected = model(**batch()).logits
    save_petl(model, tmp_path)
    loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**batch()).logits, expected)


def test_its_peft_config_loads_with_use_dora():
    spec = dora()
    fields = form_named("lora").peft_fields(spec, r".*\.(query|value)")
    config = peft.get_peft_config({"peft_type": "LORA", "task_type": "SEQ_CLS", **fields})
    assert config.use_dora and config.r == 2 and config.lora_alpha == 4.0
    assert form_named("lora").peft_refusal(spec, "m") is None


def test_two_doras_on_one_weight_stay_two_and_two_loras_merge():
    two = lambda **kw: PetlConfig(
        modules=(ModuleSpec(form="lora", size=1, **kw), ModuleSpec(form="lora", size=3, **kw))
    )  # noqa: E731
    assert len(canonical(two()).modules) == 1
    assert len(canonical(two(dora=True)).modules) == 2


def test_a_space_samples_it_and_maps_it_back():
    from petl_nas.core.describe import describe_config
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "dora",
            "slots": {"attn": {"site": "attn", "forms": ["lora"]}},
            "rank": {"low": 1, "high": 8},
            "composition": "scaled",
            "scale": 2.0,
            "dora": [False, True],
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
        }
    )
    assert "attn.dora" in {d.name for d in space.dimensions()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(8):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=3)
        (spec,) = config.modules
        seen.add(spec.dora)
        assert spec.dora == trial.params["attn.dora"]
        assert space.params_for(config, trial.params["lr"], 3) == trial.params  # the same point
        assert ("on q,v DoRA" in describe_config(config)) == spec.dora
    assert seen == {False, True}
