"""VeRA (`petl_nas.core.forms.vera`): frozen random A, B shared by every weight of a module spec,
rebuilt from its seed as PEFT's `VeraConfig` builds them; trained d, b. Counts equal the formula
L_t·(out + r) and PEFT's; outputs equal PEFT's after copying d and b; Δh = 0 at the start; only d, b
(and the head) train; the frozen parts never reach the saved weights. Helpers for the other seeded
form's tests (`peft_twin`, `PATHS`) live here too."""

from __future__ import annotations

import copy
import warnings

import optuna
import peft
import pytest
import torch
from conftest import TINY, batch, tiny_model
from safetensors.torch import load_file

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_parameters, load_petl, save_petl
from petl_nas.core.forms import form_named
from petl_nas.core.inject import WEIGHTS_FILE, lora_updates, merge_lora

# A tiny BERT's module path for each weight a form may target.
PATHS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}
D, FFN, L = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"]
SHAPES = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "ffn_in": (D, FFN), "ffn_out": (FFN, D)}  # (in, out)


def pattern(spec: ModuleSpec, layers: int = L) -> str:
    """PEFT's ``target_modules`` for ``spec`` on the tiny BERT: exactly the modules it adapts."""
    covered = "|".join(str(i) for i in (spec.layers if spec.layers is not None else range(layers)))
    weights = "|".join(PATHS[t].replace(".", r"\.") for t in spec.targets)
    return rf".*\.layer\.(?:{covered})\.(?:{weights})"


def peft_twin(base, spec: ModuleSpec, ours=None):
    """``base`` under PEFT's config from the form's `peft_fields` (as export writes it), with the
    weights of ``ours`` copied in through `peft_weights` when given."""
    form = form_named(spec.form)
    fields = {**form.peft_fields(spec, pattern(spec)), "peft_type": form.peft_type, "task_type": "SEQ_CLS"}
    twin = peft.get_peft_model(copy.deepcopy(base), peft.get_peft_config(fields))
    if ours is not None:
        updates = lora_updates(ours)
        assert len(updates) == len(spec.targets) * len(spec.layers or range(L))
        for name, module, _ in updates:
            form.peft_weights(module, twin.base_model.model.get_submodule(name))
    return twin.eval()


def peft_reloaded(base, twin, directory):
    """``twin`` written as a PEFT adapter and loaded by PEFT alone onto a fresh copy of ``base``."""
    twin.save_pretrained(str(directory))
    return peft.PeftModel.from_pretrained(copy.deepcopy(base), str(directory)).eval()


def peft_count(twin) -> int:
    """PEFT's trainable parameters outside the head (modules_to_save)."""
    return sum(p.numel() for n, p in twin.named_parameters() if p.requires_grad and "classifier" not in n)


def outputs(model, inputs) -> torch.Tensor:
    """The logits and the last hidden states, side by side (a tiny random pooler hides a lot)."""
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    return torch.cat([out.logits.flatten(), out.hidden_states[-1].flatten()])


def randomise(model, seed: int = 0) -> None:
    """Trained-looking PETL values (not the init), so a parity test sees every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 2)


def applied(spec: ModuleSpec, base=None):
    config = PetlConfig(modules=(spec,), pooling="pooler")  # the model's own head, as PEFT's
    with warnings.catch_warnings():  # the tiny pooler is untrained: said, not here
        warnings.simplefilter("ignore")
        return apply_petl(copy.deepcopy(base if base is not None else tiny_model()), config)


SPECS = {
    "q,v r=16": ModuleSpec(form="vera", size=16, seed=3),
    "ffn r=8 (A, B at the largest shape)": ModuleSpec(form="vera", position="ffn", size=8, seed=11),
    "q,k,v,o top layers, scaled": ModuleSpec(
        form="vera", size=4, targets=("q", "k", "v", "o"), layers=(1, 2), composition="scaled", scale=2.0
    ),
}


@pytest.mark.parametrize("label", SPECS)
def test_the_count_is_the_formula_and_peft_s(label):
    spec = SPECS[label]
    base = tiny_model()
    layers = len(spec.layers or range(L))
    formula = layers * sum(SHAPES[t][1] + spec.size for t in spec.targets)  # L_t · (out + r)
    counts = count_parameters(base.config, PetlConfig(modules=(spec,)))
    assert counts.trainable == counts.deployable == formula
    assert peft_count(peft_twin(base, spec)) == formula


@pytest.mark.parametrize("label", SPECS)
def test_outputs_equal_peft_s_after_copying_d_and_b(label):
    spec = SPECS[label]
    base = tiny_model()
    ours = applied(spec, base)
    randomise(ours)
    inputs = batch()
    expected, got = outputs(ours, inputs), outputs(peft_twin(base, spec, ours), inputs)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert (outputs(base, inputs) - expected).abs().max() > 1e-2  # the update matters


def test_the_peft_adapter_loads_elsewhere_and_predicts_the_same(tmp_path):
    spec = SPECS["q,k,v,o top layers, scaled"]
    base, inputs = tiny_model(), batch()
    ours = applied(spec, base)
    randomise(ours, seed=7)
    reloaded = peft_reloaded(base, peft_twin(base, spec, ours), tmp_path)
    assert reloaded.peft_config["default"].projection_prng_key == spec.seed
    assert torch.allclose(outputs(reloaded, inputs), outputs(ours, inputs), atol=1e-5)


def test_a_and_b_are_peft_s_from_the_seed_and_nothing_else():
    spec = SPECS["ffn r=8 (A, B at the largest shape)"]
    rule = applied(spec).petl.groups["0_ffn_vera"]["rule"]
    twin = peft_twin(tiny_model(), spec)
    assert rule.A.shape == (8, FFN) and rule.B.shape == (FFN, 8)  # W2's in, W1's out
    assert torch.equal(rule.A, twin.base_model.vera_A["default"])
    assert torch.equal(rule.B, twin.base_model.vera_B["default"])
    again = applied(spec).petl.groups["0_ffn_vera"]["rule"]
    other = applied(ModuleSpec(form="vera", position="ffn", size=8, seed=12)).petl.groups["0_ffn_vera"]["rule"]
    assert torch.equal(again.A, rule.A) and torch.equal(again.B, rule.B)
    assert not torch.equal(other.A, rule.A) and not torch.equal(other.B, rule.B)


def test_it_starts_as_the_identity_and_trains_only_d_b_and_the_head():
    base, inputs = tiny_model(), batch()
    model = applied(SPECS["q,v r=16"], base)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, base(**inputs).logits)
    d = [p for n, p in model.named_parameters() if n.endswith(".d")]
    assert d and all(torch.all(p == 0.1) for p in d)  # PEFT's d_initial
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = {n: b.detach().clone() for n, b in model.named_buffers()}
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # d moves once b is off zero (LoRA's A alike)
        opt.zero_grad()
        model(**inputs, labels=torch.tensor([0, 1, 1])).loss.backward()
        opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert len({n for n in changed if n.endswith((".b", ".d"))}) == 2 * 2 * L
    assert all(n.startswith(("petl.", "classifier.")) for n in changed), changed
    assert all(torch.equal(b, frozen[n]) for n, b in model.named_buffers())  # A and B stay


def test_save_and_load_give_the_same_outputs_without_storing_a_or_b(tmp_path):
    model = applied(SPECS["q,k,v,o top layers, scaled"])
    randomise(model, seed=4)
    with torch.no_grad():
        expected = model(**batch()).logits
    save_petl(model, tmp_path)
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    assert not [k for k in saved if k.startswith("petl.") and not k.endswith((".d", ".b"))], sorted(saved)
    loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.allclose(loaded(**batch()).logits, expected, atol=0, rtol=0)


def test_merging_folds_it_into_the_weights():
    model = applied(SPECS["q,k,v,o top layers, scaled"])
    randomise(model, seed=5)
    with torch.no_grad():
        expected = model(**batch()).logits
        assert merge_lora(model) == 8
        assert torch.allclose(model(**batch()).logits, expected, atol=1e-5)


def test_bad_fields_are_one_clear_error():
    with pytest.raises(ConfigError, match=r"module\.seed: must be >= 0"):
        ModuleSpec(form="vera", seed=-1)
    with pytest.raises(ConfigError, match=r"module\.seed: lora does not use it"):
        ModuleSpec(form="lora", seed=3)
    with pytest.raises(ConfigError, match=r"module\.init: vera does not use it"):
        ModuleSpec.from_dict({"form": "vera", "init": "bert"})
    spec = ModuleSpec.from_dict({"form": "vera", "size": 64, "seed": 7, "targets": ["q", "k"]})
    assert ModuleSpec.from_dict(spec.to_dict()) == spec and spec.composition == "add"


def test_a_space_samples_it_and_maps_it_back():
    from petl_nas.core.describe import describe_config
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "vera",
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
            "slots": {"attn": {"site": "attn", "forms": ["vera"]}, "ffn": {"site": "ffn", "forms": ["none", "vera"]}},
            "vera_rank": {"low": 16, "high": 1024, "log": True},
            "lora_targets": ["qv", "qkvo"],
            "layers": ["all", "top"],
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(8):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=3)
        seen.add((len(config.modules), config.modules[0].targets))
        assert all(m.form == "vera" and 16 <= m.size <= 1024 for m in config.modules)
        assert space.params_for(config, trial.params["lr"], 3) is not None  # a point of the space
    assert {n for n, _ in seen} == {1, 2} and {t for _, t in seen} == {("q", "v"), ("q", "k", "v", "o")}
    assert describe_config(PetlConfig(modules=(ModuleSpec(form="vera", size=256),))) == "attn VeRA r=256 on q,v"


def test_a_copy_reads_its_own_projections():
    """Warm workers copy a model per trial: the copy's layers read the copy's shared A and B."""
    model = applied(SPECS["q,v r=16"])
    twin = copy.deepcopy(model)
    group = twin.petl.groups["0_attn_vera"]
    assert group["0_q"].bases[0] is group["rule"] and group["rule"] is not model.petl.groups["0_attn_vera"]["rule"]
    assert torch.equal(group["rule"].A, model.petl.groups["0_attn_vera"]["rule"].A)
