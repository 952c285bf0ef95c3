"""Readers of one input in one product (`modules.shared_read`).

At a layer, LoRA on q, k and v, UniPELT's prefix gate and a parallel adapter read the same input
x; `inject` groups them so that x is projected once per forward. The model must compute exactly
what it computes with every reader on its own (outputs and every gradient), with fewer products;
a reader asking with another input, or after a weight changed in place, must get its own
columns; merged LoRA leaves its group; a cross-attention's q is not grouped with its k and v.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import batch, tiny_model
from transformers import BartConfig, BartForConditionalGeneration

from petl_nas import PetlConfig, apply_petl
from petl_nas.core.config import ModuleSpec
from petl_nas.core.inject import merge_lora
from petl_nas.training.operations import Operations

MODULES = (
    ModuleSpec(
        form="lora", position="attn", targets=("q", "k", "v"), size=4, composition="scaled", scale=2.0, gate=True
    ),
    ModuleSpec(form="prefix", position="attn", size=3, reparam=8, gate=True),
    ModuleSpec(form="adapter", position="attn", insertion="parallel", size=4, gate=True, init="bert"),
    ModuleSpec(form="lora", position="ffn", targets=("ffn_in",), size=2),
    ModuleSpec(form="adapter", position="ffn", insertion="parallel", size=4, init="bert"),
)
CONFIG = PetlConfig(modules=MODULES, pooling="mean")


def perturbed(config: PetlConfig = CONFIG):
    model = apply_petl(tiny_model(), config)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape) * 0.3)  # B and zero-init ups away from 0: every path counts
    return model


def ungrouped(model):
    """``model`` with every reader computing its own product (in place: a deep copy of a PETL model
    would keep hooks that call the original's modules)."""
    for group in model.petl._shared_reads:
        for reader in list(group.readers):
            group.remove(reader)
    model.petl._shared_reads.clear()
    return model


def step(model, x):
    model.train()
    torch.manual_seed(0)
    out = model(**x).logits
    (out * torch.tensor([1.0, -2.0])).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# LoRA's gates per token beside per-example gates of the prefix and the adapter: each kind apart
MIXED = PetlConfig(modules=(dataclasses.replace(MODULES[0], gate_per="token"), *MODULES[1:]), pooling="mean")


@pytest.mark.parametrize("config", [CONFIG, MIXED], ids=["gates alike", "gates per token and per example"])
def test_grouped_readers_compute_what_each_computes_alone(config):
    model = perturbed(config)
    assert sorted(len(g.readers) for g in model.petl._shared_reads) == [2] * 3 + [5] * 3  # per layer: ffn, attn
    alone = ungrouped(perturbed(config))
    x = batch()
    (out, grads), (out_alone, grads_alone) = step(model, x), step(alone, x)
    assert torch.allclose(out, out_alone, atol=1e-6)
    assert grads.keys() == grads_alone.keys()
    assert len([n for n in grads if n.startswith("petl.")]) == len(list(model.petl.parameters()))
    for name in grads:
        assert torch.allclose(grads[name], grads_alone[name], atol=1e-5), name


def test_one_product_per_input_and_layer():
    model, alone, x = perturbed(), ungrouped(perturbed()), batch()
    counts = []
    for m in (model, alone):
        with torch.no_grad(), Operations() as seen:
            m(**x)
        counts.append(seen.ops["addmm"] + seen.ops["mm"])
    # per layer (3) the attention input's 5 readers and the FFN input's 2 share one product each
    assert counts[1] - counts[0] == 3 * ((5 - 1) + (2 - 1))


def test_gates_of_one_input_share_one_sigmoid():
    """UniPELT's gates reading one input (here 5 a layer: LoRA's on q, k, v, the prefix's and the
    adapter's) take their logits from adjacent columns and are computed as one."""
    model, alone, x = perturbed(), ungrouped(perturbed()), batch()
    sigmoids = []
    for m in (model, alone):
        with torch.no_grad(), Operations() as seen:
            m(**x)
        sigmoids.append(seen.ops["sigmoid"])
    assert sigmoids == [3, 3 * 5]


def test_other_input_or_changed_weight_gets_its_own_columns():
    model = perturbed()
    q, k = model.petl._shared_reads[0].readers[:2]
    x, other = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.allclose(q(x), _own_out(q, x), atol=1e-6)  # makes every reader's columns for x
        assert torch.allclose(k(other), _own_out(k, other), atol=1e-6)  # another input: its own
        k.A.mul_(2)  # changed after x's product was made
        assert torch.allclose(k(x), _own_out(k, x), atol=1e-6)


def _own_out(lora, x):
    alone = copy.deepcopy(lora)
    alone.__dict__.pop("shared_read", None)
    return alone(x)


def test_merged_lora_leaves_its_group():
    config = PetlConfig(
        modules=(
            ModuleSpec(form="lora", position="attn", targets=("q", "v"), size=4),
            ModuleSpec(form="prefix", position="attn", size=3, reparam=8, gate=True),
        ),
        pooling="mean",
    )
    model, x = perturbed(config), batch()
    with torch.no_grad():
        before = model(**x).logits
        assert merge_lora(model) == 6  # q and v of 3 layers
        assert all(len(g.readers) == 1 for g in model.petl._shared_reads)  # the prefix gate: alone
        assert torch.allclose(model(**x).logits, before, atol=1e-5)


def test_cross_attention_q_is_not_grouped_with_its_keys():
    torch.manual_seed(0)
    base = BartForConditionalGeneration(
        BartConfig(
            vocab_size=64,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=64,
        )
    ).eval()
    config = PetlConfig(
        modules=(ModuleSpec(form="lora", position="attn", targets=("q", "k", "v"), size=2, init="bert"),)
    )
    model, alone = (apply_petl(copy.deepcopy(base), config) for _ in range(2) if torch.manual_seed(1))
    ungrouped(alone)
    groups = sorted(len(g.readers) for g in model.petl._shared_reads)
    assert groups == [2, 3, 3]  # cross k, v; encoder and decoder self q, k, v
    ids = torch.randint(3, 64, (2, 6))
    with torch.no_grad():
        assert torch.allclose(
            model(input_ids=ids, decoder_input_ids=ids).logits,
            alone(input_ids=ids, decoder_input_ids=ids).logits,
            atol=1e-6,
        )


@pytest.mark.parametrize("compiling", [False, True])
def test_readers_under_compile_or_parametrized_compute_alone(compiling, monkeypatch):
    model = perturbed()
    group = model.petl._shared_reads[0]
    if compiling:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    else:
        torch.nn.utils.parametrize.register_parametrization(group.readers[0], "A", _Same())
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        group.readers[0](x)
    assert group._parts == {}  # nothing computed for the others


class _Same(torch.nn.Module):
    def forward(self, a):
        return a


def test_products_padded_to_a_multiple_of_8_compute_the_same(monkeypatch):
    """On a GPU a joined product is padded with zero rows to a multiple of 8 columns (cuBLAS's
    aligned kernels); forced here on a CPU, grouped and alone: the same outputs and gradients, and
    the products are as wide as the padding says."""
    from petl_nas.core.modules import shared_read

    x = batch()
    plain = [step(perturbed(), x), step(ungrouped(perturbed()), x)]
    asked, widths = [], []
    monkeypatch.setattr(shared_read, "align_rows", lambda width, t: asked.append(width) or -width % 8)
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: widths.append(a[1].shape[0]) or linear(*a))
    padded = [step(perturbed(), x), step(ungrouped(perturbed()), x)]
    # attention: q, k, v 3 x 4 + adapter 4 + 5 gates = 21 -> 24; FFN 2 + 4 = 6 -> 8; LoRA alone 4 + gate -> 8
    assert {21, 6, 5} <= set(asked) and {24, 8} <= set(widths) and not {21, 6, 5} & set(widths)
    for (out, grads), (out_padded, grads_padded) in zip(plain, padded):
        assert torch.allclose(out, out_padded, atol=1e-6)
        assert grads.keys() == grads_padded.keys()
        for name in grads:
            assert torch.allclose(grads[name], grads_padded[name], atol=1e-5), name
