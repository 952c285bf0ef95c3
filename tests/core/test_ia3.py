"""(IA)³ as a form: exact counts (the formula and PEFT's), the same outputs as PEFT's IA3 after
copying the vectors, identity at the start, only its vectors train, save/load, the search space,
and the PEFT config its hooks write. `vector_form_checks` is shared with the LN-tuning tests."""

from __future__ import annotations

import copy
import re
import warnings

import optuna
import peft
import pytest
import torch
from conftest import TINY, batch, tiny_model

from petl_nas import ConfigError, ModuleSpec, PetlConfig, apply_petl, count_parameters, load_petl, save_petl
from petl_nas.core.backbones import spec_for
from petl_nas.core.forms import form_named
from petl_nas.core.inject import petl_disabled

D, L, FF = TINY["hidden_size"], TINY["num_hidden_layers"], TINY["intermediate_size"]
T_FEW = PetlConfig(modules=(ModuleSpec(form="ia3", position="attn"), ModuleSpec(form="ia3", position="ffn")))


def adapted(model) -> dict[str, torch.nn.Module]:
    """Each petl-nas module of a one-block backbone by the name of the module it edits (relative to
    the base model), from its key ``<layer>_<target>``."""
    block = spec_for(model.config).blocks[0]
    out = {}
    for group in model.petl.groups.values():
        for key, module in group.items():
            layer, _, target = key.partition("_")
            out[f"{block.layers}.{layer}.{block.sites(target)[0].path}"] = module
    return out


def target_regex(names) -> str:
    """What `deploy.interop` hands a form's `peft_fields`: a regular expression naming exactly these
    modules (relative to the base model) under any prefix."""
    return r"(?:.*\.)?(?:" + "|".join(re.escape(n) for n in names) + ")"


def peft_config_of(config: PetlConfig, model) -> dict:
    """One PEFT config of one form from the form's hooks, as an export writes it."""
    form = form_named(config.modules[0].form)
    fields: dict = {}
    for m in config.modules:  # one config: merge the specs' fields
        names = [n for n in adapted(apply_petl(copy.deepcopy(model), PetlConfig(modules=(m,))))]
        for k, v in form.peft_fields(m, target_regex(names)).items():
            if isinstance(v, str) and isinstance(fields.get(k), str):
                v = f"(?:{fields[k]}|{v})"
            elif not v and k in fields:
                continue
            fields[k] = v
    return {"peft_type": form.peft_type, "task_type": "SEQ_CLS", **fields}


def randomised(model, seed: int = 3, std: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model


def vector_form_checks(config: PetlConfig, count: int, tuner_params: str):
    """What every such form must show on the tiny BERT: the count before allocation equals the
    formula and PEFT's (its tuner's parameters, ``tuner_params`` in their names); PEFT's model built
    from the form's hooks computes the same logits after the weights are copied through
    `peft_weights`; and it adapts exactly the modules this one edits."""
    base = tiny_model()
    assert count_parameters(base.config, config).deployable == count
    exported = peft_config_of(config, base)
    for m in config.modules:
        assert form_named(m.form).peft_refusal(m, "here") is None
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.get_peft_config(exported)).eval()
    assert sum(p.numel() for n, p in theirs.named_parameters() if p.requires_grad and tuner_params in n) == count
    ours = randomised(apply_petl(copy.deepcopy(base), config))
    mine = adapted(ours)
    layers = {
        n.removeprefix("base_model.model.bert."): mod
        for n, mod in theirs.named_modules()
        if isinstance(mod, peft.tuners.tuners_utils.BaseTunerLayer)
    }
    assert set(layers) == set(mine)  # PEFT adapts exactly these modules
    form = form_named(config.modules[0].form)
    with torch.no_grad():
        for name, module in mine.items():
            form.peft_weights(module, layers[name])
        theirs.classifier.modules_to_save["default"].load_state_dict(ours.classifier.state_dict())
        x = dict(batch(), output_hidden_states=True)
        expected, got, bare = ours(**x), theirs(**x), base(**x)
    assert (expected.hidden_states[-1] - bare.hidden_states[-1]).abs().max() > 0.05  # the trained values matter
    assert torch.allclose(got.hidden_states[-1], expected.hidden_states[-1], atol=1e-5)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5)


def identity_step_and_round_trip(config: PetlConfig, tmp_path):
    """Unchanged at the start (with and without PETL switched off), only PETL and the head move in
    a step, and a saved model loads to the same outputs."""
    base, x = tiny_model(), batch()
    with torch.no_grad():
        expected = base(**x).logits
    config = PetlConfig(modules=config.modules, pooling="pooler")  # the checkpoint's own head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = apply_petl(copy.deepcopy(base), config)
    with torch.no_grad():
        assert torch.equal(model(**x).logits, expected)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    model(**x, labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    model.eval()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {n for n in changed if n.startswith("petl.")} == {n for n in before if n.startswith("petl.")}
    assert all(n.startswith(("petl.", "classifier.")) for n in changed), changed
    with torch.no_grad():
        trained = model(**x).logits
        assert not torch.allclose(trained, expected, atol=1e-6)
        with petl_disabled(model):
            off = model(**x).logits
    head_only = copy.deepcopy(base)
    head_only.classifier.load_state_dict(model.classifier.state_dict())
    with torch.no_grad():
        assert torch.allclose(off, head_only(**x).logits, atol=1e-6)  # off: the backbone's own again
    save_petl(model, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**x).logits, trained)


# ---- (IA)³ ---------------------------------------------------------------------------------------
def test_the_t_few_placement_counts_as_the_formula_and_peft_and_computes_what_peft_does():
    vector_form_checks(T_FEW, (2 * D + FF) * L, "ia3_l")  # k, v and the activations W2 reads


def test_a_layer_subset_and_other_weights_count_and_match_peft_too():
    config = PetlConfig(
        modules=(
            ModuleSpec(form="ia3", targets=("q", "v", "o"), layers=(0, 2)),
            ModuleSpec(form="ia3", position="ffn", layers=(1,)),
        )
    )
    vector_form_checks(config, 3 * D * 2 + FF, "ia3_l")


def test_it_starts_as_the_identity_trains_only_its_vectors_and_round_trips(tmp_path):
    identity_step_and_round_trip(T_FEW, tmp_path)


def test_the_ffn_vector_scales_w2s_input():
    model = apply_petl(tiny_model(), PetlConfig(modules=(ModuleSpec(form="ia3", position="ffn", layers=(0,)),)))
    vector = model.petl.groups["0_ffn_ia3"]["0_ffn_out"].scale
    assert vector.shape == (FF,)
    seen = {}
    w2 = model.bert.encoder.layer[0].output.dense
    handle = w2.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        vector.fill_(2.0)
        model(**batch())
        scaled = seen["x"]
        with petl_disabled(model):
            model(**batch())
    handle.remove()
    assert torch.allclose(scaled, 2 * seen["x"])


def test_bad_settings_are_one_line_each():
    for fields, match in [
        ({"gate": True}, r"module\.gate: ia3 has no gate"),
        ({"composition": "scaled", "scale": 2.0}, r"module\.composition: ia3 takes only 'add'"),
        ({"insertion": "sequential"}, r"module\.insertion: ia3 edits"),
        ({"targets": ()}, r"module\.targets: IA3 needs"),
        ({"position": "ffn", "targets": ("ffn_in",)}, r"unknown value 'ffn_in'.*accepted: ffn_out"),
        ({"size": 4}, r"module\.size: ia3 does not use it"),
    ]:
        with pytest.raises(ConfigError, match=match):
            ModuleSpec(form="ia3", **fields)


def test_its_peft_config_loads_with_feed_forward_modules_only_at_the_ffn():
    exported = peft_config_of(T_FEW, tiny_model())
    loaded = peft.get_peft_config(exported)
    assert isinstance(loaded, peft.IA3Config)
    assert re.fullmatch(loaded.feedforward_modules, "bert.encoder.layer.2.output.dense")
    assert not re.fullmatch(loaded.feedforward_modules, "bert.encoder.layer.2.attention.self.key")


def test_a_space_samples_it_per_sublayer_and_maps_it_back():
    from petl_nas.core.describe import describe_config
    from petl_nas.core.presets import preset, preset_lr
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "v",
            "slots": {
                "attn": {"site": "attn", "forms": ["none", "ia3"]},
                "ffn": {"site": "ffn", "forms": ["none", "ia3"]},
            },
            "layers": ["all", "top"],
            "gates": [False, True],
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(16):
        trial = study.ask()
        config, recipe = space.sample(trial, n_layers=3)
        seen.add(tuple(m.position for m in config.modules))
        assert not any(m.gate for m in config.modules)  # a space's gates leave it ungated
        assert all(
            m.form == "ia3" and m.targets == form_named("ia3").default_targets(m.position) for m in config.modules
        )
        assert space.params_for(config, recipe["lr"], 3) is not None
    assert {("attn",), ("ffn",), ("attn", "ffn")} <= seen and {True, False} <= {t.params["gates"] for t in study.trials}
    assert describe_config(T_FEW).startswith("attn IA3 on k,v")
    unified = SearchSpace.load("unified")
    for name in ("ia3", "ia3_kv"):
        config = unified.with_head(preset(name, hidden_size=384))
        assert unified.params_for(config, preset_lr(name), n_layers=6) is not None


def test_on_a_fused_projection_each_vector_scales_its_own_slice():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=16)).eval()
    config = PetlConfig(modules=(ModuleSpec(form="ia3", layers=(1,)),))
    assert count_parameters(base.config, config).deployable == 2 * 16  # k and v of one layer
    model = apply_petl(copy.deepcopy(base), config)
    seen = []
    handle = model.transformer.h[1].attn.c_attn.register_forward_hook(lambda mod, args, out: seen.append(out))
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)  # ones: unchanged
        model.petl.groups["0_attn_ia3"]["1_k"].scale.fill_(2.0)
        model(input_ids=ids)
        with petl_disabled(model):
            model(input_ids=ids)
    handle.remove()
    scaled, plain = seen[1].split(16, dim=-1), seen[2].split(16, dim=-1)
    assert torch.equal(scaled[0], plain[0]) and torch.equal(scaled[2], plain[2])  # q and v untouched
    assert torch.allclose(scaled[1], 2 * plain[1])  # k doubled
