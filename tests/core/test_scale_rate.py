"""A fixed scale is a learning rate in disguise (`petl_nas.core.family_rates`): a module whose output
starts at zero trains at scale s with rate η exactly as at scale 1 with its output projection at
s·η (AdamW without decay or clipping); where the output does not start at zero the scale changes
the function too. So a study at measured rates puts such modules at their family's reference
scale (`at_reference_scales`), and leaves every other module as it is."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import batch, tiny_config, tiny_model

from petl_nas import ModuleSpec, PetlConfig, apply_petl, count_parameters
from petl_nas.core.family_rates import at_rates, at_reference_scales, reference_scale
from petl_nas.core.forms import form_named
from petl_nas.core.presets import preset

S, LR, STEPS = 4.0, 3e-3, 8

# Each zero-start module, with the names of its output group U: Δh = s·F(U, θ), F linear in U.
STARTS_AT_ZERO = {
    "parallel adapter": (ModuleSpec(form="adapter", position="ffn", size=4, init="lora"), (".up.",)),
    "sequential adapter, attn": (
        ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, init="lora"),
        (".up.",),
    ),
    "lora q, v": (ModuleSpec(form="lora", size=2), (".B",)),
    "lora ffn": (ModuleSpec(form="lora", position="ffn", size=2), (".B",)),
    "gated lora": (ModuleSpec(form="lora", size=2, gate=True), (".B",)),
    "compacter": (ModuleSpec(form="compacter", position="ffn", size=8, init="lora"), (".up.t", ".up.bias")),
}
# The same forms with a random (bert-style) output projection: s scales the start too.
STARTS_ELSEWHERE = {
    "bert-init adapter": (ModuleSpec(form="adapter", position="ffn", size=4, init="bert"), (".up.",)),
    "bert-init lora": (ModuleSpec(form="lora", size=2, init="bert"), (".B",)),
}


def _at(spec: ModuleSpec, scale: float) -> ModuleSpec:
    return dataclasses.replace(spec, composition="add" if scale == 1.0 else "scaled", scale=scale)


def _trained_logits(spec: ModuleSpec, output: tuple[str, ...], output_rate: float) -> torch.Tensor:
    """Logits after `STEPS` AdamW steps (no decay, no clipping) on one batch: the module's output
    group at ``output_rate``, everything else at `LR`."""
    torch.manual_seed(1)
    model = apply_petl(tiny_model(seed=0), PetlConfig(modules=(spec,), pooling="mean"))  # eval: no dropout
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    is_out = lambda n: any(k in n for k in output)  # noqa: E731
    assert any(is_out(n) for n, _ in named)
    opt = torch.optim.AdamW(
        [
            {"params": [p for n, p in named if is_out(n)], "lr": output_rate},
            {"params": [p for n, p in named if not is_out(n)], "lr": LR},
        ],
        weight_decay=0.0,
    )
    x, y = batch(), torch.tensor([0, 1, 1])
    for _ in range(STEPS):
        opt.zero_grad()
        model(**x, labels=y).loss.backward()
        opt.step()
    with torch.no_grad():
        return model(**x).logits


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STARTS_AT_ZERO))
def test_a_fixed_scale_on_an_output_that_starts_at_zero_is_its_output_projections_rate(name):
    spec, output = STARTS_AT_ZERO[name]
    assert form_named(spec.form).scale_is_a_rate(spec)
    scaled = _trained_logits(_at(spec, S), output, LR)
    unscaled = _trained_logits(_at(spec, 1.0), output, S * LR)
    moved = _trained_logits(_at(spec, 1.0), output, LR)
    assert (moved - scaled).abs().max() > 1e-3  # the scale did change what was learned,
    torch.testing.assert_close(unscaled, scaled, atol=2e-5, rtol=1e-4)  # exactly as the rate does


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STARTS_ELSEWHERE))
def test_where_the_output_does_not_start_at_zero_the_scale_is_more_than_a_rate(name):
    spec, output = STARTS_ELSEWHERE[name]
    assert not form_named(spec.form).scale_is_a_rate(spec)
    scaled = _trained_logits(_at(spec, S), output, LR)
    unscaled = _trained_logits(_at(spec, 1.0), output, S * LR)
    assert (unscaled - scaled).abs().max() > 1e-3
    assert at_reference_scales(PetlConfig(modules=(_at(spec, S),)), {spec.form: 1.0}).modules[0].scale == S


def test_a_study_at_measured_rates_trains_such_modules_at_their_familys_reference_scale():
    scaled_pa = preset("scaled_pa", tiny_config())
    folded = at_reference_scales(scaled_pa, {"adapter": 1.0})
    (m,) = folded.modules
    assert (m.composition, m.scale, m.init, m.insertion, m.size) == (
        "add",
        1.0,
        "lora",
        "parallel",
        scaled_pa.modules[0].size,
    )
    assert count_parameters(tiny_config(), folded) == count_parameters(tiny_config(), scaled_pa)
    assert at_reference_scales(folded, {"adapter": 1.0}) is folded  # idempotent
    lora = PetlConfig(modules=(ModuleSpec(form="lora", size=2, composition="add", gate=True),))
    (g,) = at_reference_scales(lora, {"lora": 2.0}).modules
    assert (g.composition, g.scale, g.gate) == ("scaled", 2.0, True)  # the gate stays
    learned = PetlConfig(modules=(ModuleSpec(form="lora", size=2, composition="scaled", scale=4.0, learn_scale=True),))
    assert at_reference_scales(learned, {"lora": 2.0}) is learned  # a learned s is no rate
    assert at_reference_scales(scaled_pa, {"lora": 2.0}) is scaled_pa  # no reference: kept


def test_at_rates_with_reference_scales_puts_the_scale_back_before_setting_the_rates():
    config = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=2, composition="scaled", scale=8.0),
            ModuleSpec(form="adapter", position="ffn", size=4, init="lora", composition="scaled", scale=4.0),
        )
    )
    trained, lr = at_rates({"lora": 1e-3, "adapter": 3e-4}, config, 2.0, {"lora": 2.0, "adapter": 1.0})
    assert [(m.composition, m.scale) for m in trained.modules] == [("scaled", 2.0), ("add", 1.0)]
    assert lr == pytest.approx(2e-3) and dict(trained.lr_mults) == pytest.approx({"adapter": 0.3})
    as_drawn, _ = at_rates({"lora": 1e-3, "adapter": 3e-4}, config, 2.0)  # no scales: as drawn
    assert [m.scale for m in as_drawn.modules] == [8.0, 4.0]


def test_a_familys_reference_scale_is_its_probes_fixed_scale():
    assert reference_scale(preset("lora"), "lora") == 2.0
    assert reference_scale(preset("pfeiffer", tiny_config()), "adapter") == 1.0  # bert init: still its s
    assert reference_scale(preset("prefix"), "prefix") is None  # gated: no fixed s
    assert reference_scale(preset("lora"), "adapter") is None


def test_a_form_whose_zero_start_inits_name_no_init_is_refused_when_registered():
    from petl_nas.core.forms import Form, form_names, register

    class Misnamed(Form):
        name, title, zero_start_inits = "misnamed", "misnamed", ("kaiming",)

    with pytest.raises(ValueError, match="zero_start_inits names 'kaiming', not an init"):
        register(Misnamed())
    assert "misnamed" not in form_names()
