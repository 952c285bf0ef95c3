"""`canonical`: two LoRAs on one sublayer that differ only in rank are one LoRA of the summed rank,
with the same counts and the same function; modules with anything of their own (a gate, a scale,
other layers or weights, a bias of their own) stay apart; merging twice is merging once."""

import pytest
import torch
from conftest import batch, tiny_config, tiny_model

from petl_nas import ModuleSpec, PetlConfig, apply_petl, count_parameters
from petl_nas.core.canonical import canonical

D, LAYERS = 32, 3  # conftest's tiny BERT: hidden 32, 3 layers


def lora(size, **fields):
    return ModuleSpec(form="lora", size=size, **{"layers": (1,), **fields})


def config(*modules):
    return PetlConfig(modules=modules, pooling="mean")


def counts(cfg):
    n = count_parameters(tiny_config(), cfg)
    return n.trainable, n.deployable


def test_two_ranks_on_one_sublayer_are_one_lora_of_their_sum():
    two = config(lora(1), lora(5))
    one = canonical(two)
    assert one == config(lora(6))
    assert counts(two) == counts(one) == (2 * 6 * (D + D),) * 2  # q and v: r·(in + out) each, one layer


def test_the_merged_lora_takes_the_first_ones_place_and_the_rest_keep_their_order():
    adapter = ModuleSpec(form="adapter", position="ffn", size=3)
    ffn = lora(2, position="ffn")
    mixed = config(lora(1), adapter, ffn, lora(5), lora(4, layers=(2,)), ffn)
    merged = canonical(mixed)
    assert merged.modules == (lora(6), adapter, lora(4, position="ffn"), lora(4, layers=(2,)))
    assert counts(merged) == counts(mixed)


def test_canonical_is_idempotent_and_leaves_a_config_with_nothing_to_merge_as_it_is():
    once = canonical(config(lora(1), lora(2), lora(3), lora(4, layers=(2,))))
    assert once.modules == (lora(6), lora(4, layers=(2,)))
    assert canonical(once) == once
    plain = config(lora(8), ModuleSpec(form="adapter", position="ffn", size=4))
    assert canonical(plain) == plain


@pytest.mark.parametrize(
    "second",
    [
        lora(5, gate=True),
        lora(5, composition="scaled", scale=2.0),
        lora(5, layers=(2,)),
        lora(5, targets=("q",)),
        lora(5, position="ffn"),
        lora(5, init="bert"),
        lora(5, composition="add"),
    ],
    ids=["gate", "scale", "layers", "targets", "position", "init", "composition"],
)
def test_loras_that_differ_in_more_than_rank_stay_apart(second):
    apart = config(lora(1), second)
    assert canonical(apart) == apart


@pytest.mark.parametrize(
    "extra",
    [{"gate": True}, {"learn_scale": True, "composition": "scaled"}, {"dropout": 0.1}],
    ids=["gated", "learned scale", "dropout"],
)
def test_loras_with_something_of_their_own_stay_apart_even_when_equal_but_rank(extra):
    """Two gates (or two learned scales) are not one; two dropouts draw two masks where one draws one."""
    apart = config(lora(1, **extra), lora(5, **extra))
    assert canonical(apart) == apart
    if "dropout" not in extra:  # each brings parameters of its own
        assert counts(apart) != counts(config(lora(6, **extra)))


def test_two_parallel_adapters_stay_apart_their_output_biases_would_become_one():
    """f(xW₁ + b₁)W₂ + c + f(xW₁' + b₁')W₂' + c' is one adapter of the summed bottleneck except that
    c + c' is one bias: d parameters fewer per layer, so merging would change the count."""
    adapter = lambda r: ModuleSpec(form="adapter", position="ffn", size=r)  # noqa: E731
    apart = config(adapter(2), adapter(3))
    assert canonical(apart) == apart
    assert counts(apart)[0] - counts(config(adapter(5)))[0] == D * LAYERS


def test_two_loras_compute_what_the_merged_one_computes_with_concatenated_weights():
    """W + s·B₁A₁ + s·B₂A₂ = W + s·[B₁ B₂][A₁; A₂], checked on a model's outputs with nonzero updates."""
    fields = dict(composition="scaled", scale=2.0, targets=("q", "v", "o"))
    adapter = ModuleSpec(form="adapter", position="ffn", size=3)
    two_cfg = config(lora(1, **fields), adapter, lora(5, **fields))
    two, one = apply_petl(tiny_model(), two_cfg), apply_petl(tiny_model(), canonical(two_cfg))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in two.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
        first, adapter, second = two.petl.groups.values()
        merged, merged_adapter = one.petl.groups.values()
        merged_adapter.load_state_dict(adapter.state_dict())
        for name, m in merged.items():
            m.A.copy_(torch.cat([first[name].A, second[name].A], 0))  # [A₁; A₂]: (1 + 5) × in
            m.B.copy_(torch.cat([first[name].B, second[name].B], 1))  # [B₁ B₂]: out × (1 + 5)
    x = batch()
    with torch.no_grad():
        expected, got = two(**x).logits, one(**x).logits
        for m in first.values():
            m.B.zero_()
        assert not torch.allclose(two(**x).logits, expected, atol=1e-4)  # the rank-1 LoRA counts
    assert torch.allclose(got, expected, atol=1e-5)
