"""Compacter's PHM weights, built by their shared rule for every layer at once.

The rule builds the W of all its PHM layers of one shape in one batched product per forward
(`SharedRule.weight_of`). It must give each layer exactly its own Σᵢ Aᵢ ⊗ sᵢtᵢ, with the same
gradients; a weight changed in place after it was built must be built again, even outside a
model's forward; two forwards must not share a graph; and the products must not grow with depth.
"""

from __future__ import annotations

import torch
from conftest import batch, tiny_model

from petl_nas import PetlConfig, apply_petl
from petl_nas.core.config import ModuleSpec
from petl_nas.core.modules import PHMLinear
from petl_nas.training.operations import Operations

COMPACTER = PetlConfig(
    modules=(
        ModuleSpec(form="compacter", position="ffn", size=8, phm_n=4),
        ModuleSpec(form="compacter", position="attn", size=8, phm_n=4),
    ),
    pooling="mean",
)


def own_weight(layer: PHMLinear) -> torch.Tensor:
    """Σᵢ kron(Aᵢ, sᵢ·tᵢ), layer by layer: what the batched product must equal."""
    w = torch.einsum("iab,ipq->apbq", layer.rule[0].A, layer.s @ layer.t)
    return w.reshape(layer.in_features, layer.out_features)


def compacter_model(**kw):
    model = apply_petl(tiny_model(**kw), COMPACTER).train()
    with torch.no_grad():  # zero-initialised t would hide a mix-up
        for name, p in model.named_parameters():
            if ".t" in name[-2:] or name.endswith(".t"):
                p.normal_(std=0.05)
    return model


def phm_layers(model) -> list[PHMLinear]:
    return [m for m in model.modules() if isinstance(m, PHMLinear)]


def test_each_layer_gets_its_own_weight_and_the_same_gradients(monkeypatch):
    x, labels = batch(), torch.tensor([0, 1, 1])
    grads = {}
    for how in ("together", "alone"):
        model = compacter_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if how == "alone":
            monkeypatch.setattr(PHMLinear, "weight", own_weight)
        else:
            layers = phm_layers(model)
            assert len(layers) == 4 * 3  # 2 modules × down/up × 3 layers, one rule per module
            for layer in layers:
                torch.testing.assert_close(layer.weight(), own_weight(layer), rtol=1e-6, atol=1e-7)
        model(**x, labels=labels).loss.backward()
        grads[how] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        monkeypatch.undo()
    assert any(n.endswith(".s") for n in grads["together"]) and any(n.endswith("rule.A") for n in grads["together"])
    assert grads["together"].keys() == grads["alone"].keys()
    for n, g in grads["alone"].items():
        torch.testing.assert_close(grads["together"][n], g, rtol=1e-5, atol=1e-7)


def test_a_weight_changed_after_it_was_built_is_built_again():
    model = compacter_model()
    first, *rest = phm_layers(model)
    other = next(u for u in rest if u.rule == first.rule and u.s.shape == first.s.shape)  # built with it
    first.weight()  # builds every layer of the group, hands out one
    with torch.no_grad():
        other.s.add_(0.5)  # as an optimiser step would, outside any forward
    torch.testing.assert_close(other.weight(), own_weight(other))


def test_two_forwards_each_with_its_backward_build_their_own_graphs():
    model = compacter_model()
    x, labels = batch(), torch.tensor([0, 1, 1])
    for _ in range(2):  # no step between them: same values, new graph
        model(**x, labels=labels).loss.backward()


def test_the_weights_cost_two_products_per_shape_whatever_the_depth():
    """Per forward, the rule of a module builds its down and its up weights in one s·t product
    and one Kronecker product each: 4 batched matmuls per module, not 4 per layer."""
    x = batch()
    extra = {}
    for layers in (2, 4):
        counts = []
        for config in (None, COMPACTER):
            model = tiny_model(num_hidden_layers=layers)
            model = apply_petl(model, config) if config is not None else model
            with torch.no_grad(), Operations() as seen:
                model(**x)
            counts.append(seen.ops["bmm"] + seen.ops["mm"])
        extra[layers] = counts[1] - counts[0]
    # attention's bmm is in both; the adapters' own input matmuls are addmm; what is left is the rule's
    assert extra[2] == extra[4] == 2 * 2 * 2  # 2 modules × 2 shapes × (s·t, A ⊗ ·)
