"""A new functional form is one file and one registration line: IA3-style scaling (Liu et al.,
2022: learned vectors that rescale the keys, the values and W1's output, starting at one), written
here and nowhere in the package, works everywhere a form is read: the genotype and its round trip,
injection with identity at the start, exact counts, training only its vectors, saving and loading,
the search space (sampling and the inverse mapping), the one-line description, the PEFT and
AdapterHub mappings (which say they cannot express it), and a real search.

(IA3 proper scales the FFN after its activation, and is a form of the package: `forms/ia3.py`;
this demonstration, "demo_scale", scales W1's output, the closest edit of a weight's output.)"""

from __future__ import annotations

import copy
import warnings

import optuna
import pytest
import torch
from conftest import TINY, TINY_BACKBONE, batch, tiny_experiment, tiny_model
from torch import nn

from petl_nas import ModuleSpec, PetlConfig, apply_petl, count_parameters, load_petl, save_petl
from petl_nas.core.forms import Form, registered


# ---- the whole new form -----------------------------------------------------------------------
class ScaleVector(nn.Module):
    """out ⊙ l, as the update out·(l - 1) that `apply_petl` adds to the weight's output."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, out, mask=None):
        return out * (self.scale - 1)


class DemoScale(Form):
    name, title, sized = "demo_scale", "Scale", False
    keys = ("targets",)
    dimensions = ("blocks",)  # searchable: nothing to choose but where it goes

    def targets(self, position):
        return {"attn": ("k", "v"), "ffn": ("ffn_in",)}[position]

    def default_targets(self, position):
        return self.targets(position)

    def place(self, spec, at):
        for layer in at.covered:
            for target in spec.targets:
                (site,) = at.block.sites(target)
                vector = at.modules[f"{layer}_{target}"] = ScaleVector(at.features(layer, site)[1])
                at.edit(layer, site.path, "sequential", vector)

    def spec_fields(self, site, values):
        return {"targets": self.targets(site)}

    def describe(self, spec):
        return ["on " + ",".join(spec.targets)]


# ------------------------------------------------------------------------------------------------


@pytest.fixture
def demo_scale():
    with registered(DemoScale()) as form:  # the registration line (a plugin would call register)
        yield form


def test_the_genotype_takes_it_and_round_trips(demo_scale):
    spec = ModuleSpec.from_dict({"form": "demo_scale", "position": "ffn"})
    assert spec.targets == ("ffn_in",) and ModuleSpec.from_dict(spec.to_dict()) == spec
    config = PetlConfig(modules=(spec,))
    assert PetlConfig.from_dict(config.to_dict()) == config
    from petl_nas import ConfigError

    with pytest.raises(ConfigError, match=r"module\.dropout: demo_scale does not use it"):
        ModuleSpec.from_dict({"form": "demo_scale", "dropout": 0.1})
    with pytest.raises(ConfigError, match=r"module\.targets: unknown value 'q'.*accepted: k, v"):
        ModuleSpec(form="demo_scale", targets=("q",))


def test_it_starts_as_the_identity_counts_exactly_and_trains_only_its_vectors(demo_scale):
    base = tiny_model()
    inputs = batch()
    with torch.no_grad():
        expected = base(**inputs).logits
    config = PetlConfig(
        modules=(ModuleSpec(form="demo_scale", position="attn"), ModuleSpec(form="demo_scale", position="ffn")),
        pooling="pooler",
    )  # the checkpoint's own head: identity is exact
    with warnings.catch_warnings():  # a random tiny model's pooler is untrained:
        warnings.simplefilter("ignore")  # said once per process, so maybe not here
        model = apply_petl(copy.deepcopy(base), config)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, expected)
    hidden, layers, ffn = TINY["hidden_size"], TINY["num_hidden_layers"], TINY["intermediate_size"]
    counts = count_parameters(base.config, config)
    assert counts.trainable == counts.deployable == (2 * hidden + ffn) * layers  # k, v and W1's outputs
    petl = {n for n, p in model.named_parameters() if p.requires_grad and n.startswith("petl.")}
    assert len(petl) == 3 * layers
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(**inputs, labels=torch.tensor([0, 1, 1])).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("petl.") or n.startswith("classifier.") for n in changed), changed
    with torch.no_grad():
        assert not torch.equal(model(**inputs).logits, expected)


def test_it_saves_and_loads_to_the_same_outputs(demo_scale, tmp_path):
    config = PetlConfig(modules=(ModuleSpec(form="demo_scale", position="attn"),))
    model = apply_petl(tiny_model(), config)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.uniform_(0.5, 1.5)
        expected = model(**batch()).logits
    save_petl(model, tmp_path)
    loaded = load_petl(tiny_model(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**batch()).logits, expected)


def test_a_space_samples_it_and_maps_it_back(demo_scale):
    from petl_nas.core.describe import describe_config
    from petl_nas.study.space import SearchSpace

    space = SearchSpace(
        {
            "version": 1,
            "name": "demo_scale",
            "slots": {
                "attn": {"site": "attn", "forms": ["demo_scale"]},
                "ffn": {"site": "ffn", "forms": ["none", "demo_scale"]},
            },
            "lr": {"low": 1e-3, "high": 1e-2, "log": True},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(6):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=3)
        seen.add(len(config.modules))
        assert all(m.form == "demo_scale" for m in config.modules)
        assert space.params_for(config, trial.params["lr"], 3) is not None  # a point of the space
    assert seen == {1, 2}
    assert describe_config(config).startswith("attn Scale on k,v")


def test_peft_and_adapterhub_say_they_cannot_express_it(demo_scale):
    from petl_nas.deploy.interop import NotExpressible, to_adapters, to_peft

    config = PetlConfig(modules=(ModuleSpec(form="demo_scale"),), pooling="cls")
    with pytest.raises(NotExpressible, match="PEFT has no Scale"):
        to_peft(config, tiny_model().config)
    with pytest.raises(NotExpressible, match="AdapterHub has no Scale"):
        to_adapters(config, 32, 3)


def test_it_is_gone_when_unregistered():
    from petl_nas import ConfigError

    with pytest.raises(ConfigError, match="unknown value 'demo_scale'"):
        ModuleSpec(form="demo_scale")


@pytest.mark.slow
def test_a_real_search_trains_it(demo_scale, tmp_path, monkeypatch):
    import yaml

    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo_scale.yaml").write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "demo_scale",
                "slots": {
                    "attn": {"site": "attn", "forms": ["demo_scale"]},
                    "ffn": {"site": "ffn", "forms": ["none", "demo_scale"]},
                },
                "lr": {"low": 1e-2, "high": 3e-2, "log": True},
                "pooling": "mean",
            }
        )
    )
    exp = tiny_experiment(name="demo_scale", space=str(tmp_path / "demo_scale.yaml"), trials=3)
    summary = run_search(exp, printer=lambda line: None)
    study = optuna.load_study(study_name="demo_scale", storage=exp.storage_url)
    trained = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trained) == 3 and summary.counts
    assert all(m["form"] == "demo_scale" for t in trained for m in t.user_attrs["petl_config"]["modules"])
    hidden, layers, ffn = (TINY_BACKBONE["tiny"][k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size"))
    assert {t.user_attrs["deployable"] for t in trained} <= {2 * hidden * layers, (2 * hidden + ffn) * layers}
