"""The one-shot supernet: all gates shut computes the backbone exactly; unit costs are the exact
deployable counts; derived configurations are plain PetlConfigs within each budget of the ladder,
counted exactly by budget.py, that train like any trial; the count penalty pulls the supernet's
expected size to its target."""

import copy
import dataclasses
import html
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import TINY_BACKBONE, batch, tiny_experiment, tiny_model

from petl_nas import PetlConfig
from petl_nas.core.budget import count_parameters
from petl_nas.core.forms import form_named
from petl_nas.search.oneshot import HardConcrete, build_supernet, derive, ladder
from petl_nas.search.oneshot.supernet import PROMPT, candidates, prompt_length_for
from petl_nas.search.oneshot.train import train_supernet
from petl_nas.search.worker import TrialSpec, run_trial
from petl_nas.study.space import SearchSpace
from petl_nas.tasks import load_splits, resolve_task
from petl_nas.training.loading import load_backbone, model_config_for

HEAD = PetlConfig(pooling="mean")


def _supernet(kind="bert", budget=None):
    model = tiny_model(kind)
    space = SearchSpace.load("unified")
    specs = candidates(space, model.config, budget)
    prompt = prompt_length_for(space, model.config, budget, HEAD)
    # unified allows every form: BitFit, LayerNorms and a prompt too
    return build_supernet(model, specs, HEAD, bitfit=True, layernorms=True, prompt_length=prompt), specs


def _perturb(net, seed=3):
    """Move every trainable tensor away from its start: PETL weights, BitFit's biases, LayerNorms."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.model.named_parameters():
            if (name.startswith("petl.") and not name.endswith(".raw")) or name.endswith(
                ("bias.original", "weight.original")
            ):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def test_a_copy_of_a_supernet_is_a_supernet_of_its_own():
    """copy.deepcopy after a training forward (whose draws are not copied): the copy computes what
    the original does, draws its own gates, and a change to it changes it alone. (torch.save of a
    supernet is refused by torch itself: its gated weights are parametrizations.)"""
    net, _ = _supernet()
    _perturb(net)
    x = batch("bert")
    net.model.train()
    net.model(**x).logits.sum().backward()  # this forward's draws hold a graph
    twin = copy.deepcopy(net.model)
    gates = [m for m in net.model.modules() if isinstance(m, HardConcrete)]
    net.model.eval()
    twin.eval()
    with torch.no_grad():
        before = net.model(**x).logits
        assert torch.equal(twin(**x).logits, before)
        drawn = [g._z for g in gates]
        twin(**x)  # draws the copy's gates, not the original's
        assert all(a is b for a, b in zip(drawn, (g._z for g in gates)))
        for m in twin.modules():
            if isinstance(m, HardConcrete):
                m.close()
        assert not torch.equal(twin(**x).logits, before)
        assert torch.equal(net.model(**x).logits, before)


def test_candidates_cover_the_spaces_forms_at_sizes_that_fit():
    model = tiny_model()
    specs = candidates(SearchSpace.load("unified"), model.config, None)
    assert [(s.form, s.position) for s in specs] == [
        ("lora", "attn"),
        ("adapter", "attn"),
        ("compacter", "attn"),
        ("prefix", "attn"),
        ("mh_adapter", "attn"),
        ("lora", "ffn"),
        ("adapter", "ffn"),
        ("compacter", "ffn"),
    ]
    assert specs[0].size == 64 and specs[0].targets == ("q", "k", "v", "o") and specs[1].size == 512
    assert specs[2].size == 512 and specs[2].phm_n == 4 and specs[2].insertion == "parallel"
    assert specs[3].size == 64 and specs[3].reparam == 0 and specs[3].composition == "gated"  # flat: 0 is allowed
    small = candidates(SearchSpace.load("unified"), model.config, 2000)
    for s in small:
        one_layer = count_parameters(
            model.config, PetlConfig(modules=(s.__class__(**{**s.to_dict(), "layers": (0,)}),))
        )
        assert one_layer.deployable <= 2000
    (lora,) = [s for s in candidates(SearchSpace.load("small"), model.config, None) if s.form == "lora"]
    assert lora.targets == ("q", "v")  # small fixes lora_targets: qv
    mam = candidates(SearchSpace.load("mam"), model.config, None)  # prefix (or MH adapter) + FFN adapter
    assert [(s.form, s.position) for s in mam] == [("prefix", "attn"), ("mh_adapter", "attn"), ("adapter", "ffn")]


def test_a_supernet_with_every_gate_shut_is_the_backbone(kind):
    base = tiny_model(kind)
    x = batch(kind)
    net, _ = _supernet(kind)
    _perturb(net)
    net.model.eval()
    with torch.no_grad():
        open_out = net.model(**x).logits
        net.close_all()
        shut = net.model(**x).logits
        ref = apply_head_only(base, kind)(**x).logits
    assert torch.equal(shut, ref)  # bit-exact, no tolerance
    assert not torch.allclose(open_out, ref, atol=1e-4)


def apply_head_only(base, kind):
    from petl_nas import apply_petl

    model = apply_petl(copy.deepcopy(base), HEAD)
    model.eval()
    return model


def test_a_prefix_with_positions_shut_is_the_prefix_of_the_open_ones():
    """Gated positions at 0 leave the softmax exactly as a shorter prefix would; at 1 they are the
    plain prefix positions (log 1 = 0 on their logits)."""
    from petl_nas import ModuleSpec, apply_petl
    from petl_nas.core.modules.prefix import PrefixEncoder

    base, x = tiny_model(), batch()
    spec = ModuleSpec(form="prefix", position="attn", size=6, reparam=0, composition="gated", layers=(1,))
    net = build_supernet(copy.deepcopy(base), (spec,), HEAD)
    _perturb(net)
    (unit,) = net.units
    assert unit.layer == 1 and unit.unit_cost == 2 * 32
    keep = torch.tensor([True, False, True, True, False, False])
    unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
    (enc,) = [m for m in net.model.modules() if isinstance(m, PrefixEncoder)]
    short = apply_petl(
        copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(**{**spec.to_dict(), "size": 3}),), pooling="mean")
    )
    (short_enc,) = [m for m in short.modules() if isinstance(m, PrefixEncoder)]
    with torch.no_grad():
        short_enc.flat.copy_(enc.flat[:, :, :, keep])
    net.model.eval(), short.eval()
    last = lambda m: m(**x, output_hidden_states=True).hidden_states[-1]  # noqa: E731 (the logits are tiny)
    with torch.no_grad():
        got, want = last(net.model), last(short)
    assert torch.allclose(got, want, atol=1e-5)
    unit.gate.set_log_alpha(torch.where(keep, 0.0, -30.0))  # the same positions, half open (g = 0.5)
    with torch.no_grad():
        assert not torch.allclose(last(net.model), want, atol=1e-3)


def test_a_prompt_with_positions_shut_is_the_prompt_of_the_open_ones(kind):
    """Only open positions are inserted (the tokens sit where the shorter prompt puts them), each
    with log g on its logits in every layer: at g = 1 the shorter prompt exactly, at g = 0.5 not;
    every position shut is the backbone; and derive reads the open positions as prompt_length."""
    from petl_nas import apply_petl

    base, x = tiny_model(kind), batch(kind)
    net = build_supernet(copy.deepcopy(base), (), HEAD, prompt_length=6)
    _perturb(net)
    (unit,) = net.units
    assert unit.candidate == PROMPT and unit.unit_cost == 32  # one embedding row per position
    keep = torch.tensor([True, False, True, True, False, False])
    unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
    short = apply_petl(copy.deepcopy(base), PetlConfig(prompt_length=3, pooling="mean"))
    with torch.no_grad():
        short.petl.prompt.embeddings.copy_(net.model.petl.prompt.embeddings[keep])
    net.model.eval(), short.eval()
    last = lambda m: m(**x, output_hidden_states=True).hidden_states[-1]  # noqa: E731
    with torch.no_grad():
        got, want = last(net.model), last(short)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
        unit.gate.set_log_alpha(torch.where(keep, 0.0, -30.0))  # the same positions, half open
        assert not torch.allclose(last(net.model), want, atol=1e-3)
        unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
        config, n = derive(net, base.config, 10_000, HEAD, min_open=0.5)
        assert config.prompt_length == 3 and not config.modules and n == 3 * 32
        net.close_all()
        assert torch.equal(net.model(**x).logits, apply_head_only(base, kind)(**x).logits)
        unit.gate.set_log_alpha(0.0)  # training: each forward inserts its own draw's open positions
        net.model.train()
        for _ in range(8):
            net.model(**x)
            assert net.model.petl.prompt.n == int((unit.gate.z() > 0).sum())


def test_compacter_columns_shut_are_the_smaller_compacter_of_the_open_ones():
    """A shut unit removes one column q of the fast matrices: n bottleneck dimensions (entries
    a·(size/n) + q of b_down); what stays is a Compacter of n·(open units), its rule unchanged."""
    from petl_nas import ModuleSpec, apply_petl
    from petl_nas.core.modules.phm import CompacterAdapter

    base, x = tiny_model(), batch()
    spec = ModuleSpec(
        form="compacter", position="ffn", size=16, insertion="parallel", init="lora", phm_n=4, layers=(1,)
    )
    net = build_supernet(copy.deepcopy(base), (spec,), HEAD)
    _perturb(net)
    (unit,) = net.units
    assert unit.unit_size == 4 and unit.unit_cost == 2 * 4 * 1 + 4 and unit.group_cost == 4**3
    keep = torch.tensor([True, False, True, False])
    unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
    (big,) = [m for m in net.model.modules() if isinstance(m, CompacterAdapter)]
    small_model = apply_petl(
        copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(**{**spec.to_dict(), "size": 8}),), pooling="mean")
    )
    (small,) = [m for m in small_model.modules() if isinstance(m, CompacterAdapter)]
    with torch.no_grad():
        small.down.rule[0].A.copy_(big.down.rule[0].A)
        small.down.s.copy_(big.down.s), small.up.t.copy_(big.up.t), small.up.bias.copy_(big.up.bias)
        small.down.t.copy_(big.down.t[:, :, keep]), small.up.s.copy_(big.up.s[:, keep, :])
        raw_bias = big.down.parametrizations.bias.original  # as trained, before the gates
        small.down.bias.copy_(raw_bias.view(4, 4)[:, keep].reshape(-1))
        net.model.eval(), small_model.eval()
        got, want = (m(**x, output_hidden_states=True).hidden_states[-1] for m in (net.model, small_model))
    assert torch.allclose(got, want, atol=1e-5)  # the encoder's output, not the small logits


def test_derived_compacters_pay_one_rule_per_distinct_size():
    from petl_nas import ModuleSpec

    model = tiny_model()
    spec = ModuleSpec(form="compacter", position="ffn", size=16, insertion="parallel", init="lora", phm_n=4)
    net = build_supernet(model, (spec,), HEAD)
    for u, open_units in zip(net.units, (2, 2, 1)):  # 3 layers: sizes 8, 8, 4
        u.gate.set_log_alpha(torch.tensor([30.0] * open_units + [-30.0] * (4 - open_units)))
    config, n = derive(net, model.config, 10**6, HEAD, min_open=0.5)
    assert sorted((m.size, m.layers) for m in config.modules) == [(4, (2,)), (8, (0, 1))]
    assert n == count_parameters(model.config, config).deployable  # two specs: two rules of n³
    just_under = derive(net, model.config, n - 1, HEAD, min_open=0.5)[1]
    assert (
        just_under < n
        and just_under
        == count_parameters(model.config, derive(net, model.config, n - 1, HEAD, min_open=0.5)[0]).deployable
    )


def test_a_multi_head_adapter_with_positions_shut_is_the_one_of_its_open_positions():
    from petl_nas import ModuleSpec, apply_petl
    from petl_nas.core.modules.mh_adapter import MultiHeadAdapter

    base, x = tiny_model(), batch()
    spec = ModuleSpec(form="mh_adapter", position="attn", size=6, insertion="parallel", composition="add", layers=(2,))
    net = build_supernet(copy.deepcopy(base), (spec,), HEAD)
    _perturb(net)
    (unit,) = net.units
    assert unit.unit_cost == 2 * 32  # a key and a value row per head
    keep = torch.tensor([False, True, True, False, True, False])
    unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
    (big,) = [m for m in net.model.modules() if isinstance(m, MultiHeadAdapter)]
    short = apply_petl(
        copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(**{**spec.to_dict(), "size": 3}),), pooling="mean")
    )
    (small,) = [m for m in short.modules() if isinstance(m, MultiHeadAdapter)]
    last = lambda m: m(**x, output_hidden_states=True).hidden_states[-1]  # noqa: E731
    with torch.no_grad():
        small.keys.copy_(big.keys[:, keep]), small.values.copy_(big.values[:, keep])
        net.model.eval(), short.eval()
        assert torch.allclose(last(net.model), last(short), atol=1e-5)


@pytest.mark.parametrize("gpu_width", [False, True])
def test_key_gates_add_log_g_to_exactly_the_gated_logits(gpu_width, monkeypatch):
    """Also with the feature padded to a head dim that is a multiple of 8, as on a GPU (`gate_columns`)."""
    import petl_nas.core.modules.head_attention as attention

    if gpu_width:
        monkeypatch.setattr(attention, "gate_columns", lambda head_dim, device: 8 - head_dim % 8)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g) for _ in range(3))  # [B, H, L, D]; keys: 2 prefix + 2 tokens
    log_g, s = torch.tensor([-0.7, -2.0]), 8**-0.5
    q2, k2, v2 = attention._with_key_gates(q, k, v, torch.cat([log_g, torch.zeros(2)]), s)
    assert q2.shape[-1] == k2.shape[-1] == v2.shape[-1] == (16 if gpu_width else 9)
    got = torch.softmax(q2 @ k2.transpose(-1, -2) * s, -1) @ v2
    want = torch.softmax(q @ k.transpose(-1, -2) * s + torch.cat([log_g, torch.zeros(2)]), -1) @ v
    assert torch.allclose(got[..., :8], want, atol=1e-6) and not got[..., 8:].any()


def test_a_gated_prompt_beside_a_gated_prefix_gates_its_own_keys():
    """An attention call's keys are the prefix's first, then the tokens; a gated prompt's log g lands
    on its own token keys (its start counted after the prefix), and the prefix's on the prefix's."""
    import petl_nas.core.modules.head_attention as attention

    prompt = (1, torch.tensor([-0.5, -1.0]))  # prompt tokens 1 and 2 of the input
    edits = attention.HeadEdits(is_enabled=lambda: True, key_gate=lambda: prompt)
    got = attention._key_log_gates(edits, 3 + 5, 3, torch.tensor([-0.1, -0.2, -0.3]), torch.device("cpu"))
    assert got.tolist() == pytest.approx([-0.1, -0.2, -0.3, 0.0, -0.5, -1.0, 0.0, 0.0])
    ungated = attention.HeadEdits(is_enabled=lambda: True)
    assert attention._key_log_gates(ungated, 4, 0, None, torch.device("cpu")) is None


def test_unit_costs_are_exact_deployable_counts():
    net, specs = _supernet()
    model_config = net.model.config
    full = count_parameters(
        model_config, PetlConfig(modules=specs, bitfit=True, train_layernorms=True, prompt_length=20)
    ).deployable
    shared = {u.candidate: u.group_cost for u in net.units if u.group_cost}  # Compacter's rule, once per spec
    assert net.shared_cost > 0  # LayerNorm biases: BitFit's and the norms'
    assert (
        sum(u.unit_cost * u.gate.log_alpha.numel() + u.fixed_cost for u in net.units)
        + sum(shared.values())
        + net.shared_cost
        == full
    )
    assert {specs[u.candidate].form for u in net.units if u.candidate >= 0} == {
        "lora",
        "adapter",
        "compacter",
        "prefix",
        "mh_adapter",
    }
    assert [u.gate.log_alpha.numel() for u in net.units if u.candidate == PROMPT] == [20]  # unified: up to 20 tokens
    for u in net.units:
        u.gate.set_log_alpha(30.0)  # every gate surely open
    assert float(net.expected_count().detach()) == pytest.approx(full, rel=1e-6)


def test_the_bitfit_unit_is_every_bias_and_derives_to_bitfit():
    from petl_nas.search.oneshot.supernet import BITFIT, allows_bitfit, bitfit_cost

    net, _ = _supernet()
    model_config = net.model.config
    biases = count_parameters(model_config, PetlConfig(bitfit=True, pooling="mean")).deployable
    assert bitfit_cost(model_config, HEAD) == biases > 0
    (unit,) = [u for u in net.units if u.candidate == BITFIT]
    for u in net.units:
        u.gate.set_log_alpha(30.0 if u is unit else -30.0)  # only the biases open
    config, n = derive(net, model_config, biases, HEAD, min_open=0.5)
    assert config.bitfit and not config.modules and n == biases
    config, n = derive(net, model_config, biases - 1, HEAD, min_open=0.5)  # they do not fit: nothing
    assert not config.bitfit and n == 0
    assert not allows_bitfit(SearchSpace.load("small"), model_config, None)  # bitfit: false there
    assert not allows_bitfit(SearchSpace.load("unified"), model_config, biases - 1, HEAD)


def test_the_layernorm_unit_derives_alone_or_with_bitfit_counted_exactly():
    """Trained LayerNorms are one unit; their biases are also BitFit's, counted once when both are
    taken, whichever comes first; with only the norms' gate open, only the norms differ from the
    backbone, and with it shut too the supernet is the backbone again."""
    from petl_nas.search.oneshot.supernet import BITFIT, LAYERNORMS, allows_layernorms, global_cost

    net, _ = _supernet()
    model_config = net.model.config
    norms_alone = (
        count_parameters(model_config, PetlConfig(train_layernorms=True, pooling="mean")).deployable
        - count_parameters(model_config, HEAD).deployable
    )
    both = (
        count_parameters(model_config, PetlConfig(bitfit=True, train_layernorms=True, pooling="mean")).deployable
        - count_parameters(model_config, HEAD).deployable
    )
    assert global_cost(model_config, HEAD, layernorms=True) == norms_alone > 0
    units = {u.candidate: u for u in net.units if u.candidate in (BITFIT, LAYERNORMS)}
    for first in (LAYERNORMS, BITFIT):
        for u in net.units:
            u.gate.set_log_alpha(-30.0)
        units[first].gate.set_log_alpha(30.0)
        units[BITFIT if first == LAYERNORMS else LAYERNORMS].gate.set_log_alpha(20.0)  # next most likely
        config, n = derive(net, model_config, both, HEAD, min_open=0.5)
        assert config.bitfit and config.train_layernorms and not config.modules and n == both
    for u in net.units:
        u.gate.set_log_alpha(30.0 if u is units[LAYERNORMS] else -30.0)
    config, n = derive(net, model_config, norms_alone, HEAD, min_open=0.5)
    assert config.train_layernorms and not config.bitfit and n == norms_alone
    assert not allows_layernorms(SearchSpace.load("unified"), model_config, norms_alone - 1, HEAD)

    x = batch()
    _perturb(net)
    net.model.eval()
    ref = apply_head_only(tiny_model(), "bert")
    with torch.no_grad():
        for u in net.units:
            u.gate.sample()  # deterministic z: 1 for the norms, 0 for the rest
        norms_only = net.model(**x).logits
        net.close_all()
        for u in net.units:
            u.gate.sample()
        shut = net.model(**x).logits
        assert torch.equal(shut, ref(**x).logits) and not torch.allclose(norms_only, shut, atol=1e-4)
        from petl_nas.core.inject import norm_modules

        norm = norm_modules(net.model)[1]
        for bitfit_open in (True, False):  # a norm's bias keeps its change while either gate is open
            units[BITFIT].gate.set_log_alpha(30.0 if bitfit_open else -30.0)
            units[LAYERNORMS].gate.set_log_alpha(-30.0)
            for u in units.values():
                u.gate.sample()
            trained = norm.parametrizations.bias.original
            start = norm.parametrizations.bias[0].start
            assert torch.allclose(norm.bias, trained if bitfit_open else start, atol=1e-7, rtol=0)
            assert torch.equal(norm.weight, norm.parametrizations.weight[0].start)  # the norms' own gate is shut


def test_a_unipelt_gate_choice_is_the_ungated_module_shut_and_the_gated_one_open():
    """Each gated instance's extra z mixes (1 − z) + z·g(x): shut, the module computes as without its
    gate; open, as with it. Derived, an instance is gated where that choice is likely open, and the
    gates' parameters are counted exactly."""
    from petl_nas import ModuleSpec

    base = tiny_model()
    specs = (
        ModuleSpec(form="lora", position="attn", size=4, targets=("q", "v"), gate=True),
        ModuleSpec(form="adapter", position="ffn", size=8, insertion="parallel", init="lora", gate=True),
    )
    net = build_supernet(copy.deepcopy(base), specs, HEAD)
    _perturb(net)
    choices = [u for u in net.units if u.gate_of is not None]
    layers, d = base.config.num_hidden_layers, base.config.hidden_size
    assert len(choices) == 3 * layers and all(u.unit_cost == d + 1 for u in choices)  # q, v and the FFN's, per layer
    x = batch()
    net.model.eval()
    composes = [m.compose for m in net.model.petl.modules() if hasattr(m, "compose") and m.compose.gate is not None]

    def logits(mix: float, strip=None):
        for u in net.units:
            u.gate.set_log_alpha(mix if u.gate_of is not None else 30.0)
            u.gate.sample()
        saved = [(c.gate, c.gate_mix) for c in composes]
        for c in composes:
            if strip == "gate":
                c.gate, c.gate_mix = None, None  # the module without its gate
            elif strip == "mix":
                c.gate_mix = None  # the module with its gate, no choice
        try:
            with torch.no_grad():
                return net.model(**x).logits
        finally:
            for c, (g, m) in zip(composes, saved):
                c.gate, c.gate_mix = g, m

    shut, ungated = logits(-30.0), logits(-30.0, strip="gate")
    open_, gated = logits(30.0), logits(30.0, strip="mix")
    assert torch.allclose(shut, ungated, atol=1e-6) and torch.allclose(open_, gated, atol=1e-6)
    assert not torch.allclose(shut, open_, atol=1e-4)
    for u in net.units:  # a gate of a module that is not there costs nothing
        u.gate.set_log_alpha(30.0 if u.gate_of is not None else -30.0)
    assert float(net.expected_count().detach()) < 1e-3
    for mix, want in ((30.0, True), (-30.0, False)):
        for u in net.units:
            u.gate.set_log_alpha(mix if u.gate_of is not None else 30.0)
        config, n = derive(net, net.model.config, 10**6, HEAD)
        assert {m.gate for m in config.modules} == {want}
        assert n == count_parameters(net.model.config, config).deployable
    assert n == count_parameters(
        net.model.config,
        dataclasses.replace(config, modules=tuple(dataclasses.replace(m, gate=True) for m in config.modules)),
    ).deployable - 3 * layers * (d + 1)


def test_derived_configurations_fit_each_budget_of_the_ladder_exactly():
    net, _ = _supernet(budget=20_000)
    g = torch.Generator().manual_seed(0)
    for u in net.units:
        u.gate.set_log_alpha(torch.randn(u.gate.log_alpha.shape, generator=g) * 3)
    budgets = ladder(500, 20_000, 10)
    assert len(budgets) == 10 and budgets[0] == 500 and budgets[-1] == 20_000
    counts = []
    for b in budgets:
        config, n = derive(net, net.model.config, b, HEAD)
        assert n <= b and n == count_parameters(net.model.config, config).deployable
        assert config.pooling == "mean" and all(m.layers for m in config.modules)
        counts.append(n)
    assert counts == sorted(counts) and counts[-1] > counts[0] > 0
    for u in net.units:
        u.gate.set_log_alpha(-30.0)  # nothing likely open: nothing derived
    assert derive(net, net.model.config, 20_000, HEAD, min_open=0.5)[1] == 0


@pytest.mark.parametrize("budget", [300, 2000, 20_000])
def test_an_anchored_proposal_is_its_baseline_whole_plus_the_supernets_fill_beside_it(budget):
    from petl_nas.search.baselines import anchors
    from petl_nas.search.oneshot.derive import anchored, touched

    net, _ = _supernet(budget=budget)
    g = torch.Generator().manual_seed(0)
    for u in net.units:
        u.gate.set_log_alpha(torch.randn(u.gate.log_alpha.shape, generator=g) * 3)
    c = net.model.config
    found = anchors(c, budget, c.num_hidden_layers)
    assert len(found) == 2  # the largest of each kind only (q, v / all or top / prompt)
    proposed = 0
    for name, anchor in found:
        own = count_parameters(
            c, dataclasses.replace(HEAD, modules=anchor.modules, prompt_length=anchor.prompt_length)
        ).deployable
        if (got := anchored(net, c, budget, anchor, HEAD)) is None:  # nothing the anchor leaves fits beside it
            leaves = [u for i, u in enumerate(net.units) if u.gate_of is None and i not in touched(net, anchor)]
            assert min(u.unit_cost + u.fixed_cost for u in leaves) > budget - own, name
            continue
        config, n = got
        proposed += 1
        assert own < n <= budget and n == count_parameters(c, config).deployable, name
        assert config.modules[: len(anchor.modules)] == anchor.modules and config.pooling == "mean"
        assert config.prompt_length >= anchor.prompt_length
        fill = config.modules[len(anchor.modules) :]
        for m in fill:  # never a second module of a form on a weight the anchor adapts
            for a in anchor.modules:
                if m.form == a.form and m.position == a.position:
                    layers = set(m.layers) & set(a.layers if a.layers is not None else range(c.num_hidden_layers))
                    assert not layers or not set(m.targets or ()) & set(a.targets or m.targets or ()), (name, m)
        if anchor.prompt_length:
            assert config.prompt_length == anchor.prompt_length and fill
    assert proposed >= 1
    for u in net.units:
        u.gate.set_log_alpha(-30.0)
    tight = found[-1][1]  # nothing fits beside it: the baseline alone, not a proposal
    assert (
        anchored(
            net,
            c,
            count_parameters(
                c, dataclasses.replace(HEAD, modules=tight.modules, prompt_length=tight.prompt_length)
            ).deployable,
            tight,
            HEAD,
        )
        is None
    )


def _tiny_keyword():
    """(backbone spec, splits, cached backbone, its config) of the tiny keyword task."""
    task = resolve_task("demo_keyword")
    splits = load_splits(task, k=320, data_seed=111, search_dev_size=64)
    base, _ = load_backbone(TINY_BACKBONE, task, splits)
    return TINY_BACKBONE, splits, base, model_config_for(TINY_BACKBONE, task, splits)


def test_a_derived_configuration_trains_like_any_trial():
    tiny, splits, base, model_config = _tiny_keyword()
    net = build_supernet(copy.deepcopy(base), candidates(SearchSpace.load("unified"), model_config, 3000), HEAD)
    config, n = derive(net, model_config, 3000, HEAD)
    assert 0 < n <= 3000
    spec = TrialSpec(
        backbone=tiny,
        task="demo_keyword",
        config=config.to_dict(),
        recipe={"lr": 3e-3, "epochs": 1, "batch_size": 16, "max_length": 24},
        k=320,
        search_dev=64,
    )
    r = run_trial(spec)
    assert 0.0 <= r.score <= 1.0 and r.steps > 0


@pytest.mark.parametrize(
    "multiples",
    [
        None,
        {
            "lora": 1.0,
            "adapter": 0.3,
            "compacter": 5.0,
            "prefix": 0.7,
            "mh_adapter": 2.0,
            "prompt": 10.0,
            "bitfit": 0.5,
        },
    ],
)
def test_a_supernet_trains_each_family_at_its_rate_and_each_gate_at_the_gate_rate(multiples):
    """With a study's measured rates, each family of the supernet trains at lr times its multiple (the
    head beside the first family, LayerNorms at the recipe's rate), as a trial would; every gate
    learns at ``gate_lr`` whatever group its log α sits in; without them everything is at lr."""
    from petl_nas.core.inject import parameter_families
    from petl_nas.training.loop import Recipe, param_groups

    tiny, splits, base, model_config = _tiny_keyword()
    space = SearchSpace.load("unified")
    net = build_supernet(
        copy.deepcopy(base),
        candidates(space, model_config, None),
        HEAD,
        bitfit=True,
        layernorms=True,
        prompt_length=prompt_length_for(space, model_config, None, HEAD),
    )
    lr, gate_lr = 2e-3, 0.05
    train_supernet(
        net,
        tiny,
        "demo_keyword",
        splits,
        10**6,
        lr=lr,
        gate_lr=gate_lr,
        epochs=1,
        batch_size=64,
        max_length=24,
        lr_multiples=multiples,
    )
    trained = [p for p in net.model.parameters() if p.requires_grad]
    rate_of = {
        id(p): g["lr"]
        for g in param_groups(net.model, trained, Recipe(lr=lr * (multiples or {}).get("lora", 1.0)))
        for p in g["params"]
    }
    gates = {id(g.raw): g for g in net.gates()}
    families = parameter_families(net.model)
    seen = set()
    for p in trained:
        if id(p) in gates:
            assert rate_of[id(p)] * gates[id(p)].speed == pytest.approx(gate_lr)
            continue
        family = families[id(p)]
        want = (multiples or {}).get(family, 1.0) if family not in ("head", "layernorms") else 1.0
        assert rate_of[id(p)] == pytest.approx(lr * want), family
        seen.add(family)
    assert seen >= {"lora", "adapter", "compacter", "prompt", "bitfit", "head"}


def test_the_count_penalty_waits_for_the_warmup_share_of_the_steps():
    """``warmup``: the multiplier stays 0 and no gate is pulled shut until that share of the steps
    has trained; then the penalty starts (here: 1 epoch of 2)."""
    tiny, splits, base, model_config = _tiny_keyword()
    space = SearchSpace.load("unified")
    multipliers = {}
    for warmup in (0.0, 0.5):
        net = build_supernet(copy.deepcopy(base), candidates(space, model_config, None), HEAD)
        seen = []
        train_supernet(
            net,
            tiny,
            "demo_keyword",
            splits,
            100,
            lr=3e-3,
            gate_lr=0.1,
            epochs=2,
            batch_size=64,
            max_length=24,
            warmup=warmup,
            on_epoch=lambda state: seen.append(state["multiplier"]),
        )
        multipliers[warmup] = seen
    assert multipliers[0.0][0] > 0 and multipliers[0.5][0] == 0.0 < multipliers[0.5][1] < multipliers[0.0][1]


def test_a_supernet_within_noise_of_the_trivial_baseline_says_it_did_not_learn():
    from petl_nas.search.oneshot.propose import not_learned_lines

    baseline = {"score": 0.508}
    said = not_learned_lines({"score": 0.496, "score_se": 0.016}, baseline)
    assert len(said) == 1 and said[0].startswith(
        "one-shot: the supernet did not learn (search-dev 0.4960, within noise of the trivial baseline's 0.5080)"
    )
    assert not_learned_lines({"score": 0.60, "score_se": 0.016}, baseline) == []
    assert "no better than" in not_learned_lines({"score": 0.50, "score_se": None}, baseline)[0]
    assert not_learned_lines({"score": 0.496, "score_se": 0.016}, None) == []  # no baseline: nothing to say


@pytest.mark.slow
def test_the_count_penalty_pulls_the_expected_size_to_its_target():
    tiny, splits, base, model_config = _tiny_keyword()
    net = build_supernet(copy.deepcopy(base), candidates(SearchSpace.load("unified"), model_config, None), HEAD)
    start = float(net.expected_count().detach())
    target = start / 10
    result = train_supernet(
        net, tiny, "demo_keyword", splits, target, lr=3e-3, gate_lr=0.1, epochs=4, batch_size=16, max_length=24
    )
    end = float(net.expected_count().detach())
    assert end < start / 3 and abs(end - target) / target < 1.0
    assert result["expected_count"] == pytest.approx(end, rel=1e-6)


def test_hard_concrete_gates_are_exactly_zero_or_one_at_their_extremes():
    g = HardConcrete(1000, init_open=0.5)
    g.train()
    g.sample()
    z = g.z()
    assert ((z == 0) | (z == 1)).float().mean() > 0.3 and (z >= 0).all() and (z <= 1).all()
    g.close()
    g.eval()
    g.sample()
    assert torch.equal(g.z(), torch.zeros(1000)) and float(g.p_open().max()) < 1e-6


def _exp(tmp_path, **kw):
    from petl_nas.study.experiment import Fidelity, OneShot

    return tiny_experiment(
        **{
            "name": "o",
            "task": "demo_keyword",
            "presets": ["lora"],
            "storage": f"sqlite:///{tmp_path}/study.db",
            "strategy": "both",
            "oneshot": OneShot(
                rungs=4, lr=3e-3, proposal_lr="sampler", gate_lr=0.05, epochs=2, retry_lr=0
            ),  # a 2-epoch tiny supernet rarely learns
            "fidelity": Fidelity(length_buckets=0, k=320, epochs=2, batch_size=16, max_length=24, search_dev=64),
            **kw,
        }
    )


@pytest.mark.slow
def test_a_study_trains_the_supernets_proposals_beside_the_samplers(tmp_path, monkeypatch):
    import dataclasses

    import optuna
    from optuna.trial import TrialState

    from petl_nas.search import progress
    from petl_nas.search.driver import run_search
    from petl_nas.study.fronts import group_of

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "EVERY_S", 0.001)  # while it trains, a line every EVERY_S
    exp = _exp(tmp_path)
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    record = study.user_attrs["oneshot"]
    start = next(i for i, line in enumerate(lines) if line.startswith("one-shot: training a supernet over space"))
    beat = f"  one-shot: training the supernet at budget {study.user_attrs['budget']:,} ("
    assert any(line.startswith(beat) for line in lines[start + 1 :])
    # once an epoch is saved, the line says how many are done (the file it reads is gone at the end)
    assert any(line.startswith(beat) and "; epoch 1 of " in line for line in lines[start + 1 :])
    assert not list((exp.run_dir / "oneshot").glob("*"))
    said = [line for line in lines[start + 1 :] if not line.startswith("  ")]  # no beats, no wrapped lines
    assert said[0].startswith("one-shot: a supernet of")  # said before the minutes it takes
    assert "besides the supernet's proposals (it trains first)" in lines[0]
    proposals = [t for t in study.trials if t.user_attrs.get("oneshot") == record["run"]]
    assert len(proposals) == len(record["proposed"]) >= 1
    budget = study.user_attrs["budget"]
    for t, p in zip(sorted(proposals, key=lambda t: t.number), record["proposed"]):
        assert t.state == TrialState.COMPLETE and group_of(t) == "oneshot"
        assert t.values[1] == t.user_attrs["deployable"] == p["deployable"] <= p["budget"] <= budget
        # its learning rate drawn by the sampler, from the space's range, and recorded as a parameter
        assert t.params["lr"] == t.user_attrs["recipe"]["lr"] and set(t.params) == {"lr"}
    lr = SearchSpace.load("small").globals["lr"]
    assert all(lr.low <= t.params["lr"] <= lr.high for t in proposals)
    sampled = [t for t in study.trials if group_of(t) == "searched" and t.state == TrialState.COMPLETE]
    assert len(sampled) == 2  # both: the sampler's trials on top
    # the count said up front is the count trained, the proposals tagged in the progress lines
    progress = [line for line in lines if line.startswith("[")]
    total = next(line for line in lines if line.endswith("to train in all, the supernet's proposals included"))
    assert all(line.split("]")[0].split("/")[1] == total.split()[0] for line in progress)
    assert len([line for line in progress if " one-shot: " in line]) == len(proposals)
    n = len(study.trials)
    run_search(exp, printer=lambda *a: None)  # resumed: no second supernet
    assert len(optuna.load_study(study_name="o", storage=exp.storage_url).trials) == n
    lines.clear()  # one more sampler trial: said once, as trained
    run_search(dataclasses.replace(exp, trials=exp.trials + 1), printer=lines.append)
    assert "; 1 to train; presets queued" in lines[0] and not any("in all" in line for line in lines)
    assert [line.split("]")[0] for line in lines if line.startswith("[")] == ["[1/1"]


@pytest.mark.slow
def test_strategy_oneshot_trains_only_the_proposals_and_presets(tmp_path, monkeypatch):
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import OneShot
    from petl_nas.study.fronts import group_of

    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,  # trials: only the sampler's, none here
        oneshot=OneShot(rungs=4, lr=3e-3, gate_lr=0.05, epochs=2, retry_lr=0),
    )  # at the supernet's lr
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    assert {group_of(t) for t in study.trials if not t.user_attrs.get("rejected")} <= {"oneshot", "preset"}
    proposals = [t for t in study.trials if t.user_attrs.get("oneshot")]
    assert proposals and all(t.user_attrs["recipe"]["lr"] == 3e-3 and "lr" not in t.params for t in proposals)
    # the largest baseline of each kind, whole, with what the supernet keeps beside it, at the budget
    from petl_nas.search.baselines import anchors
    from petl_nas.study.fronts import source_of

    built = {t.user_attrs["oneshot_anchor"]: t for t in proposals if t.user_attrs.get("oneshot_anchor")}
    config = _tiny_keyword()[3]
    kinds = dict(anchors(config, study.user_attrs["budget"], config.num_hidden_layers))
    assert built and set(built) <= set(kinds)
    for name, t in built.items():
        modules = PetlConfig.from_dict(t.user_attrs["petl_config"]).modules
        assert modules[: len(kinds[name].modules)] == kinds[name].modules and len(modules) > len(kinds[name].modules)
        assert source_of(t) == f"one-shot on {name}" and t.user_attrs["deployable"] <= study.user_attrs["budget"]
    record = {p.get("anchor") for p in study.user_attrs["oneshot"]["proposed"]}
    assert set(built) <= record
    from petl_nas.dashboards.report import write_report  # the report names them

    page = write_report(exp.storage_url, "o", tmp_path / "report")[-1].read_text()
    row = html.unescape(re.search(r"<th>one-shot supernet</th><td>(.*?)</td>", page).group(1))
    assert f"{len(built)} of them a baseline plus the supernet's choice beside it ({', '.join(built)})" in row


@pytest.mark.slow
def test_in_a_study_with_measured_rates_the_supernet_trains_each_family_at_its_rate(tmp_path, monkeypatch):
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import run
    from petl_nas.study.experiment import OneShot, Rates

    real, seen = run.train_supernet, {}
    real_build, built = run.build_supernet, []

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    def build_spy(model, specs, *args, **kw):
        built.extend(specs)
        return real_build(model, specs, *args, **kw)

    monkeypatch.setattr(run, "train_supernet", spy)
    monkeypatch.setattr(run, "build_supernet", build_spy)
    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,
        rates=Rates(share=0.5),
        oneshot=OneShot(rungs=3, lr=3e-3, gate_lr=0.05, epochs=1, retry_lr=0),
    )
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    measured, record = study.user_attrs["rate_calibration"]["rates"], study.user_attrs["oneshot"]
    assert set(measured) == {"lora", "adapter", "prefix"}  # the small space's families
    assert {f: 3e-3 * m for f, m in seen["lr_multiples"].items()} == pytest.approx(measured)
    assert record["family_rates"] == pytest.approx(measured) and record["score_se"] > 0
    scales = study.user_attrs["rate_calibration"]["scales"]  # each candidate whose scale is only a
    assert scales["lora"] == 2.0 and record["family_scales"] == scales  # rate trains at its family's
    folded = [m for m in built if form_named(m.form).scale_is_a_rate(m)]  # (LoRA's built at s = 1)
    assert {m.form for m in folded} == {"lora", "adapter"}
    assert all((m.scale if m.composition == "scaled" else 1.0) == scales[m.form] for m in folded)
    assert any(
        line.startswith("one-shot: a supernet of") and "with each family at its measured rate" in line for line in lines
    )
    proposals = [t for t in study.trials if t.user_attrs.get("oneshot")]
    assert proposals and all(t.user_attrs["recipe"]["lr_scale"] == 1.0 for t in proposals)  # trials, the same


@pytest.mark.slow
def test_a_supernet_that_did_not_learn_is_trained_again_at_slower_rates(tmp_path, monkeypatch):
    """At lr 0.3 the tiny supernet collapses to the trivial baseline; ``retry_lr`` trains it once
    more at a tenth of that, where it learns, and its proposals are that run's."""
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import run
    from petl_nas.study.experiment import OneShot

    real, rates = run.train_supernet, []

    def spy(*args, **kw):
        rates.append(kw["lr"])
        return real(*args, **kw)

    monkeypatch.setattr(run, "train_supernet", spy)
    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,
        presets=[],
        oneshot=OneShot(rungs=2, lr=0.3, gate_lr=0.05, epochs=8, anchors=False, retry_lr=0.1),
    )
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    record, baseline = study.user_attrs["oneshot"], study.user_attrs["baseline"]
    assert rates == pytest.approx([0.3, 0.03])
    assert record["retried"]["score"] <= baseline["score"] + 2 * record["retried"]["score_se"]  # did not learn
    assert record["score"] > baseline["score"] + 2 * record["score_se"] and record["retried"]["factor"] == 0.1
    assert record["lr"] == 0.3  # the proposals' rate (proposal_lr: supernet)
    assert any(line.startswith("one-shot: the supernet did not learn") and "oneshot.retry_lr" in line for line in lines)
    assert any("trained again at every rate x 0.1 after its first run did not learn" in line for line in lines)
    assert not list((tmp_path / "runs" / "o" / "oneshot").glob("*.pt"))  # both runs' states removed


@pytest.mark.slow
def test_a_study_stopped_during_the_second_supernet_run_goes_on_with_it(tmp_path, monkeypatch):
    """The first run's result is stored before the second starts: resumed, the study trains the
    second from its last saved epoch and not the first again."""
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import run
    from petl_nas.study.experiment import OneShot
    from petl_nas.training import checkpoint

    real_save, real_train, rates = checkpoint.save, run.train_supernet, []

    def save_then_die_in_the_retry(state, where):
        real_save(state, where)
        if str(where).endswith(".retry.pt"):
            raise KeyboardInterrupt

    def spy(*args, **kw):
        rates.append((kw["lr"], (kw["resume"] or {}).get("epoch")))
        return real_train(*args, **kw)

    monkeypatch.setattr(checkpoint, "save", save_then_die_in_the_retry)
    monkeypatch.setattr(run, "train_supernet", spy)
    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,
        presets=[],
        oneshot=OneShot(rungs=2, lr=0.3, gate_lr=0.05, epochs=2, anchors=False, retry_lr=0.1),
    )
    with pytest.raises(KeyboardInterrupt):
        run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    assert "oneshot" not in study.user_attrs and study.user_attrs["oneshot_first_run"]["factor"] == 0.1
    monkeypatch.setattr(checkpoint, "save", real_save)
    lines = []
    run_search(exp, printer=lines.append)
    assert rates == [(0.3, None), (pytest.approx(0.03), None), (pytest.approx(0.03), 1)]  # the first once
    assert any("first run did not learn" in line and "going on with its second" in line for line in lines)
    assert study.user_attrs["oneshot"]["retried"] == study.user_attrs["oneshot_first_run"]


@pytest.mark.slow
def test_a_supernet_whose_loss_diverged_is_trained_again_at_slower_rates(tmp_path, monkeypatch):
    """A loss gone non-finite is a rate too fast: with ``retry_lr`` the supernet is trained again
    at that fraction of its rates instead of the study stopping with an error."""
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import OneShot

    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,
        presets=[],
        oneshot=OneShot(rungs=2, lr=1e6, gate_lr=0.05, epochs=2, anchors=False, retry_lr=1e-6),
    )
    lines = []
    run_search(exp, printer=lines.append)
    record = optuna.load_study(study_name="o", storage=exp.storage_url).user_attrs["oneshot"]
    assert record["retried"]["diverged"] and record["retried"]["score"] is None and record["proposed"]
    assert any(line.startswith("one-shot: the supernet diverged (") and "oneshot.retry_lr" in line for line in lines)
    assert any("after its first run diverged" in line for line in lines)


def test_a_slower_supernet_moves_every_measured_rate_and_keeps_its_state_apart():
    from petl_nas.search.oneshot.propose import slower
    from petl_nas.search.oneshot.run import SupernetSpec

    spec = SupernetSpec(
        backbone={"tiny": {}},
        task="demo_keyword",
        data_dir=None,
        k=None,
        data_seed=0,
        search_dev=None,
        space="unified",
        budget=100,
        rungs=2,
        lr=1e-3,
        gate_lr=0.05,
        epochs=1,
        init_open=0.9,
        batch_size=8,
        max_length=16,
        length_buckets=0,
        seed=0,
        checkpoint="/r/oneshot/oneshot-0.pt",
        lr_multiples={"lora": 4.5, "adapter": 0.9},
    )
    s = slower(spec, 1 / 3)
    assert s.lr == spec.lr and s.gate_lr == spec.gate_lr  # the families' rates move, not lr
    assert s.lr_multiples == pytest.approx({"lora": 1.5, "adapter": 0.3})
    assert s.checkpoint == "/r/oneshot/oneshot-0.retry.pt"
    plain = slower(dataclasses.replace(spec, lr_multiples=None), 0.5)  # one rate for all: lr itself
    assert plain.lr == pytest.approx(5e-4) and plain.lr_multiples is None


def _killed_after_first_save(monkeypatch):
    """The process dies right after the first epoch's state is saved; returns the real `save`."""
    from petl_nas.training import checkpoint

    real = checkpoint.save

    def save_then_die(state, where):
        real(state, where)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save", save_then_die)
    return real


@pytest.mark.slow
def test_a_supernet_run_killed_midway_is_recorded_and_goes_on_from_its_last_epoch(tmp_path, monkeypatch):
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.training import checkpoint

    monkeypatch.chdir(tmp_path)
    exp = _exp(tmp_path, strategy="oneshot", trials=3)  # a 2-epoch supernet
    real = _killed_after_first_save(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    assert study.user_attrs["oneshot_started"]["attempt"] == 1 and "oneshot" not in study.user_attrs
    state_file = tmp_path / "runs" / "o" / "oneshot" / "oneshot-0.pt"
    assert checkpoint.load(state_file)["epoch"] == 1
    monkeypatch.setattr(checkpoint, "save", real)
    lines = []
    run_search(exp, printer=lines.append)
    assert any("left no result" in line and "attempt 2" in line for line in lines)
    assert any("went on from epoch 1" in line for line in lines)
    record = optuna.load_study(study_name="o", storage=exp.storage_url).user_attrs["oneshot"]
    assert record["attempts"] == 2 and record["proposed"] and record["resumed_from"]["epoch"] == 1
    assert not state_file.exists()  # removed once the record is stored


def test_whether_a_supernet_run_is_still_training_elsewhere():
    import os
    import socket
    import time

    from petl_nas.search.oneshot.propose import training_elsewhere

    here, now = socket.gethostname(), time.time()
    assert not training_elsewhere(None, 60)
    assert not training_elsewhere({"at": "x", "attempt": 1}, 60)  # recorded before beats were kept
    assert training_elsewhere({"host": "another-host", "pid": 1, "beat": now}, 60)
    assert not training_elsewhere({"host": "another-host", "pid": 1, "beat": now - 61}, 60)  # silent too long
    assert training_elsewhere({"host": here, "pid": os.getppid(), "beat": now}, 60)  # a live process here
    assert not training_elsewhere({"host": here, "pid": os.getpid(), "beat": now}, 60)  # this one trains nothing
    assert not training_elsewhere({"host": "another-host", "pid": 1, "beat": now, "diverged": "nan"}, 60)
    gone = max(os.getpid(), os.getppid()) + 10_000_000  # beyond any pid
    assert not training_elsewhere({"host": here, "pid": gone, "beat": now}, 60)


def test_a_supernet_whose_gates_stayed_over_the_budget_says_so():
    from petl_nas.search.oneshot.propose import over_budget_note

    assert over_budget_note(8_000, 8_387) == over_budget_note(9_200, 8_387) == ""  # within 10%
    assert over_budget_note(66_057, 8_387).startswith("; its gates ended over the budget of 8,387")


@pytest.mark.slow
def test_a_second_worker_waits_for_the_supernet_another_is_training(tmp_path, monkeypatch):
    """Two workers of one study: the second finds the first's run beating and waits for its proposals
    instead of training a second supernet (and leaving its own state file behind)."""
    import dataclasses
    import threading
    import time

    import optuna

    from petl_nas.search.oneshot import propose as proposing
    from petl_nas.study.storage import ClaimLock

    monkeypatch.chdir(tmp_path)
    exp = dataclasses.replace(_exp(tmp_path), heartbeat_interval=1, grace_period=30)
    study = optuna.create_study(study_name="o", storage=exp.storage_url, directions=["maximize", "minimize"])
    study.set_user_attr(
        "oneshot_started",
        {"at": "2026-11-26T22:00:00", "attempt": 1, "host": "another-host", "pid": 1, "beat": time.time()},
    )
    monkeypatch.setattr(proposing, "run_supernet", lambda spec: pytest.fail("trained a second supernet"))
    stored = threading.Timer(2.0, lambda: study.set_user_attr("oneshot", {"run": "oneshot-0"}))
    stored.start()
    lines = []
    assert proposing.propose(study, exp, 3000, ClaimLock(study, "o"), lines.append) == []
    stored.join()
    assert lines == [
        "one-shot: another worker (another-host, process 1) is training the supernet since "
        "2026-11-26T22:00:00; waiting for its proposals"
    ]
    assert not (tmp_path / "runs" / "o" / "oneshot").exists()


def test_the_worker_training_the_supernet_renews_its_beat_while_it_trains_and_only_then():
    import time

    import optuna

    from petl_nas.search.oneshot import propose as proposing

    study = optuna.create_study(directions=["maximize", "minimize"])
    mine = {"at": "2026-11-28T18:00:00", "attempt": 1, "host": "here", "pid": 7, "beat": 0.0}
    study.set_user_attr("oneshot_started", mine)
    with proposing._beating(study, mine, 0.01):
        deadline = time.time() + 30
        while study.user_attrs["oneshot_started"]["beat"] == 0.0 and time.time() < deadline:
            time.sleep(0.01)
        assert study.user_attrs["oneshot_started"]["beat"] > 0.0  # renewed while the block runs
    last = study.user_attrs["oneshot_started"]["beat"]
    time.sleep(0.05)
    assert study.user_attrs["oneshot_started"]["beat"] == last  # and not after it
    study.set_user_attr("oneshot_started", {**mine, "pid": 8, "beat": 1.0})  # another worker's run now
    with proposing._beating(study, mine, 0.01):
        time.sleep(0.05)
    assert study.user_attrs["oneshot_started"]["beat"] == 1.0  # never renews another's beat


@pytest.mark.slow
def test_a_supernet_killed_after_an_epoch_goes_on_from_it_and_ends_as_an_uninterrupted_run(tmp_path, monkeypatch):
    from petl_nas.search.oneshot.run import SupernetSpec, run_supernet
    from petl_nas.search.oneshot.standing import standing_path
    from petl_nas.training import checkpoint

    spec = SupernetSpec(
        backbone=TINY_BACKBONE,
        task="demo_keyword",
        data_dir=None,
        k=320,
        data_seed=111,
        search_dev=64,
        space="unified",
        budget=3000,
        rungs=4,
        lr=3e-3,
        gate_lr=0.05,
        epochs=2,
        init_open=0.9,
        batch_size=16,
        max_length=24,
        length_buckets=4,
        seed=0,
    )
    whole = run_supernet(spec, device="cpu")
    assert whole["bitfit"]  # unified allows it: biases trained, gated
    path = tmp_path / "oneshot-0.pt"
    real = _killed_after_first_save(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_supernet({**spec.to_dict(), "checkpoint": str(path)}, device="cpu")
    monkeypatch.setattr(checkpoint, "save", real)
    assert checkpoint.load(path)["epoch"] == 1
    torch.manual_seed(1234)  # a new process
    resumed = run_supernet({**spec.to_dict(), "checkpoint": str(path)}, device="cpu")
    assert resumed["resumed_from"]["epoch"] == 1 and whole["resumed_from"] is None
    assert resumed["proposed"] == whole["proposed"] and resumed["score"] == whole["score"]
    assert resumed["multiplier"] == whole["multiplier"] and resumed["expected_count"] == whole["expected_count"]
    stands = json.loads(Path(standing_path(path)).read_text())  # timed on the epoch it trained itself
    assert (stands["first_epoch"], stands["epoch"], stands["epochs"]) == (1, 2, 2)
    other = run_supernet({**spec.to_dict(), "checkpoint": str(path), "lr": 1e-3}, device="cpu")
    assert other["resumed_from"] is None  # another run's state is not used


@pytest.mark.slow
def test_with_the_ray_executor_the_supernet_is_a_ray_tune_trial(tmp_path, monkeypatch):
    """The driver may have no GPU: the supernet trains in a Tune trial that holds a whole GPU where
    the cluster has one, else every CPU of the largest node (here: a local Ray of 2 CPUs)."""
    ray = pytest.importorskip("ray")
    import optuna

    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    exp = _exp(tmp_path, strategy="oneshot", trials=3, executor="ray", scheduler="fifo")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    lines = []
    try:
        run_search(exp, printer=lines.append)
    finally:
        ray.shutdown()
    record = optuna.load_study(study_name="o", storage=exp.storage_url).user_attrs["oneshot"]
    where = record["where"]
    assert where["executor"] == "ray" and where["resources"] == {"cpu": 2, "gpu": 0} and where["device"] == "cpu"
    assert "/" in where["host"]  # host/node id: it ran in a Ray worker
    assert (tmp_path / "runs" / "o" / "ray" / "supernet").is_dir() and record["proposed"]
    assert any(line.startswith("one-shot: a supernet of") and " on cpu " in line for line in lines)


@pytest.mark.slow
def test_ctrl_c_during_a_ray_supernet_is_one_line_and_keeps_its_state(tmp_path):
    """A real SIGINT to `petl-nas search` while its supernet trains in a Ray Tune trial: exit 130 and
    petl-nas's one line, no traceback and no Tune restore advice (Tune's own handler would swallow
    the signal and end the run without a result); its saved epoch stays for the rerun (going on
    from it: `test_a_supernet_killed_after_an_epoch_goes_on_from_it...`)."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    pytest.importorskip("ray")
    experiment = {
        "name": "o",
        "backbone": TINY_BACKBONE,
        "task": "demo_keyword",
        "budget": "5%",
        "space": "small",
        "trials": 1,
        "presets": "none",
        "strategy": "oneshot",
        "executor": "ray",
        "ray_address": "local",
        "oneshot": {"rungs": 2, "epochs": 400},
        "fidelity": {"k": 64, "epochs": 1, "batch_size": 16, "max_length": 16, "search_dev": 32},
        "final": {"seeds": 0, "baselines": False},
    }
    (tmp_path / "e.yaml").write_text(json.dumps(experiment))
    command = [str(Path(sys.executable).with_name("petl-nas")), "search", "--experiment", "e.yaml"]
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = tmp_path / "runs" / "o" / "oneshot" / "oneshot-0.pt"
    deadline = time.time() + 300
    while not state.exists() and run.poll() is None and time.time() < deadline:
        time.sleep(0.5)  # its first epoch saved: it is in the Ray trial
    assert state.exists(), run.communicate()[1]
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130, err
    assert err.strip() == "petl-nas: interrupted; the study is kept: run the same command again to go on", err
    assert state.exists()  # its state is kept for the rerun to go on from


@pytest.mark.slow
def test_a_supernet_that_diverges_is_one_line_and_the_rerun_says_why_it_trains_again(tmp_path, monkeypatch):
    import dataclasses

    from petl_nas import ConfigError
    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    exp = _exp(tmp_path, strategy="oneshot", presets=[])
    wild = dataclasses.replace(exp, oneshot=dataclasses.replace(exp.oneshot, lr=1.0e6, gate_lr=1.0e6))
    with pytest.raises(
        ConfigError,
        match=r"oneshot: the supernet diverged \(loss is \w+ at step \d+\): lower "
        r"oneshot\.lr or oneshot\.gate_lr, then run the same command again",
    ):
        run_search(wild, printer=lambda *a: None)
    lines = []
    run_search(exp, printer=lines.append)
    assert any(" diverged (loss is " in line and "training it again (attempt 2)" in line for line in lines), lines
    assert any(line.startswith("one-shot: a supernet of") for line in lines)


@pytest.mark.slow
def test_a_resume_with_other_oneshot_settings_is_refused(tmp_path, monkeypatch):
    import dataclasses

    from petl_nas import ConfigError
    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    exp = _exp(tmp_path, strategy="oneshot", presets=[])
    run_search(exp, printer=lambda *a: None)
    import optuna

    before = len(optuna.load_study(study_name="o", storage=exp.storage_url).trials)
    other = dataclasses.replace(
        exp, oneshot=dataclasses.replace(exp.oneshot, rungs=6), presets=["bitfit"], strategy="both"
    )
    with pytest.raises(
        ConfigError,
        match=r"study 'o' trained its supernet with other oneshot settings \(rungs 4 -> 6\); "
        r"its proposals are those of the first: to train another supernet, name a "
        r"new study \(--study NAME\)",
    ):
        run_search(other, printer=lambda *a: None)
    assert len(optuna.load_study(study_name="o", storage=exp.storage_url).trials) == before  # refused: nothing queued
    lines = []
    run_search(exp, printer=lines.append)  # the same settings: nothing left to do
    assert any("; 0 to train;" in line for line in lines)


def test_strategy_errors_are_one_line(tmp_path):
    from petl_nas import ConfigError
    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment

    with pytest.raises(ConfigError, match="strategy: expected one of sampler, oneshot, both"):
        Experiment(strategy="supernet")
    with pytest.raises(ConfigError, match="oneshot: proposal_lr"):
        Experiment.from_dict({"oneshot": {"proposal_lr": "fast"}})
    with pytest.raises(ConfigError, match="oneshot: init_open"):
        Experiment.from_dict({"oneshot": {"init_open": 1.5}})
    with pytest.raises(ConfigError, match="set a budget"):
        run_search(_exp(tmp_path, budget=None), printer=lambda *a: None)


@pytest.mark.slow
def test_one_supernet_proposes_for_smaller_budgets_whose_studies_train_none(tmp_path, monkeypatch):
    """``oneshot.budgets``: the supernet also derives each smaller budget's own ladder (up to that
    budget, not the large ladder cut) and writes them to ``runs/NAME/oneshot.json``; a study with
    ``oneshot.file`` enqueues the proposals for its budget from it and trains no supernet. A file
    made on other data, or without this budget, is refused in one line before a study exists."""
    import optuna

    from petl_nas import ConfigError
    from petl_nas.dashboards.report import write_report
    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import propose as proposing
    from petl_nas.study.experiment import OneShot, parse_budget

    monkeypatch.chdir(tmp_path)
    one = OneShot(rungs=4, lr=3e-3, gate_lr=0.05, epochs=2, retry_lr=0)
    big = _exp(
        tmp_path,
        name="big",
        strategy="oneshot",
        trials=0,
        presets=[],
        budget="5%",
        storage=f"sqlite:///{tmp_path}/big.db",
        oneshot=dataclasses.replace(one, budgets=["1%"]),
    )
    lines = []
    run_search(big, printer=lines.append)
    made = json.loads((tmp_path / "runs" / "big" / "oneshot.json").read_text())
    b_big = optuna.load_study(study_name="big", storage=big.storage_url)
    count = parse_budget("1%", b_big.user_attrs["backbone_params"])
    assert set(made["proposed"]) == {str(b_big.user_attrs["budget"]), str(count)}
    ladder = made["proposed"][str(count)]
    assert max(p["budget"] for p in ladder) == count and all(p["deployable"] <= count for p in ladder)
    assert b_big.user_attrs["oneshot"]["serves"]["budgets"] == sorted([count, b_big.user_attrs["budget"]])
    assert any("and proposing for 1% too" in line for line in lines)

    def no_supernet(*a, **kw):
        raise AssertionError("a study reading oneshot.file trained a supernet")

    monkeypatch.setattr(proposing, "run_supernet", no_supernet)
    file = str(tmp_path / "runs" / "big" / "oneshot.json")
    small = _exp(
        tmp_path,
        name="small",
        strategy="oneshot",
        trials=0,
        presets=["lora"],
        budget="1%",
        storage=f"sqlite:///{tmp_path}/small.db",
        oneshot=dataclasses.replace(one, file=file),
    )
    for changed, said in [
        (dict(fidelity=dataclasses.replace(small.fidelity, k=160)), "another study: k 320 (here 160)"),
        (dict(budget="2%"), "holds proposals for budgets"),
        (dict(oneshot=dataclasses.replace(one, file=str(tmp_path / "none.json"))), "no such file"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            run_search(dataclasses.replace(small, **changed), printer=lambda *a: None)
        assert "small" not in optuna.get_all_study_names(small.storage_url)  # before a study exists
    lines = []
    run_search(small, printer=lines.append)
    study = optuna.load_study(study_name="small", storage=small.storage_url)
    proposals = [t for t in study.trials if t.user_attrs.get("oneshot")]
    assert [t.user_attrs["petl_config"] for t in proposals] == [p["config"] for p in ladder]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in proposals)
    assert {t.user_attrs["oneshot"] for t in proposals} == {"big/oneshot-0"}
    record = study.user_attrs["oneshot"]
    assert record["from"] == {"file": file, "study": "big"} and record["cost_s"] == 0
    assert any("proposals read from" in line and "none trained here" in line for line in lines)
    assert "oneshot_started" not in study.user_attrs

    def page(exp):
        return next(
            p for p in write_report(exp.storage_url, exp.name, tmp_path / exp.name) if p.suffix == ".html"
        ).read_text()

    assert "none trained here" in page(small) and "the supernet of study big" in page(small)
    assert f"it also proposed for budgets {count:,}" in page(big)


@pytest.mark.parametrize(
    "budgets, said",
    [
        (["5%"], "is not below the study's budget"),
        (["1"], "below the space's smallest module"),
        (["1.5"], "oneshot: budgets: budget: '1.5' is a fraction"),
    ],
)
def test_budgets_a_supernet_cannot_serve_are_refused_before_a_study_exists(tmp_path, monkeypatch, budgets, said):
    import optuna

    from petl_nas import ConfigError
    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import OneShot

    monkeypatch.chdir(tmp_path)
    exp = _exp(
        tmp_path,
        strategy="oneshot",
        trials=0,
        budget="5%",
        oneshot=OneShot(rungs=4, epochs=2, budgets=budgets, retry_lr=0),
    )
    with pytest.raises(ConfigError, match=re.escape(said)):
        run_search(exp, printer=lambda *a: None)
    assert optuna.get_all_study_names(exp.storage_url) == []


def test_a_study_stored_before_a_oneshot_setting_existed_resumes():
    """Settings stored without a key added since (``budgets``, ``file``) read as its default; a
    setting that really changed is still refused."""
    from types import SimpleNamespace

    from petl_nas import ConfigError
    from petl_nas.search.oneshot.propose import check_resumable
    from petl_nas.study.experiment import OneShot
    from petl_nas.study.storage import as_stored

    old = {k: v for k, v in as_stored(dataclasses.asdict(OneShot())).items() if k not in ("budgets", "file")}
    study = SimpleNamespace(study_name="s", user_attrs={"oneshot": {"settings": old}})
    check_resumable(study, SimpleNamespace(oneshot=OneShot()))
    with pytest.raises(ConfigError, match=re.escape("budgets None -> ['1%']")):
        check_resumable(study, SimpleNamespace(oneshot=OneShot(budgets=["1%"])))


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"budgets": "1%"}, "oneshot: budgets: expected a non-empty list"),
        ({"budgets": ["1x"]}, "oneshot: budgets: budget: '1x' is not a count"),
        ({"file": ""}, "oneshot: file: expected a non-empty string"),
        ({"file": "a.json", "budgets": ["1%"]}, "oneshot: file reads another study's proposals and trains no supernet"),
        ({"file": "a.json", "runs": 2}, "oneshot: file reads another study's proposals and trains no supernet"),
        ({"warmup": 1}, "oneshot: warmup: expected a number in [0, 1)"),
        ({"warmup": True}, "oneshot: warmup: expected a number in [0, 1)"),
    ],
)
def test_bad_shared_supernet_settings_are_one_line(fields, said):
    from petl_nas import ConfigError
    from petl_nas.study.experiment import Experiment

    with pytest.raises(ConfigError, match=re.escape(said)):
        Experiment.from_dict({"strategy": "oneshot", "trials": 0, "oneshot": fields}, "e.yaml")
