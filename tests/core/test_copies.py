"""A PETL model copied whole (`copy.deepcopy`) or pickled whole (`torch.save(model)`) is a model of
its own: its hooks call its own modules, so the copy computes what the original does, a change to
the copy's weights changes the copy alone, and training the copy gives gradients to the copy's
parameters alone. The hooks once were closures, shared by a copy with the original.
"""

from __future__ import annotations

import copy
import dataclasses
import io

import pytest
import torch
from conftest import batch, tiny_config, tiny_model
from test_backbones_seq2seq import tiny

from petl_nas import ModuleSpec, PetlConfig, apply_petl, preset, preset_names, remove_petl


def trained(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def randomised(model):
    """Every trained tensor drawn at random (zero-initialised modules would hide a shared hook), and a
    forward with gradients taken, so that what one forward keeps holds tensors of its graph."""
    for p in trained(model).values():
        p.data.normal_(0, 0.2)
    model.train()
    out = model(**inputs(model))
    (out.logits.float().square().mean()).backward()
    for p in trained(model).values():
        p.grad = None
    return model.eval()


def inputs(model) -> dict:
    x = batch(n=2)
    x["input_ids"] = x["input_ids"] % model.config.vocab_size  # the tiny language models' 64 ids
    if model.config.is_encoder_decoder:
        x["decoder_input_ids"] = x["input_ids"][:, :4]
    return x


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs(model)).logits


def check_own_model(original, other) -> None:
    before = logits(original)
    torch.testing.assert_close(logits(other), before)
    for name, p in trained(other).items():
        if not name.startswith("classifier"):  # the PETL modules, BitFit's biases, LayerNorms
            p.data.add_(torch.randn_like(p))
    assert not torch.allclose(logits(other), before)  # the copy runs its own modules...
    torch.testing.assert_close(logits(original), before)  # ... and the original is untouched
    other.train()
    other(**inputs(other)).logits.float().square().mean().backward()
    assert all(p.grad is None for p in trained(original).values())
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0
        for n, p in trained(other).items()
        if not n.startswith("classifier")
    )


@pytest.mark.parametrize("name", preset_names())
def test_a_deep_copy_of_every_preset_is_a_model_of_its_own(name):
    original = randomised(apply_petl(tiny_model(), preset(name, tiny_config())))
    check_own_model(original, copy.deepcopy(original))


@pytest.mark.parametrize("kind", ["bart", "gpt2"])
def test_a_deep_copy_of_a_prompted_language_model_is_its_own(kind):
    """Encoder-decoder and decoder-only models insert the prompt and widen masks in hooks of their
    own (the encoder's and decoder's stacks)."""
    config = PetlConfig(
        modules=(ModuleSpec(form="lora", size=4, targets=("q", "v")), ModuleSpec(form="prefix", size=3, reparam=0)),
        prompt_length=2,
    )
    original = randomised(apply_petl(tiny(kind), config))
    check_own_model(original, copy.deepcopy(original))


@pytest.mark.parametrize("name", ["unipelt_apl", "mam", "compacter"])
def test_a_pickled_model_loads_as_a_model_of_its_own(name):
    """With mean pooling, whose hook on the base model reads the padding mask."""
    original = randomised(apply_petl(tiny_model(), dataclasses.replace(preset(name, tiny_config()), pooling="mean")))
    buffer = io.BytesIO()
    torch.save(original, buffer)
    buffer.seek(0)
    check_own_model(original, torch.load(buffer, weights_only=False))


def test_removing_the_modules_of_a_copy_leaves_the_original_its_own():
    original = randomised(apply_petl(tiny_model(), preset("unipelt_apl", tiny_config())))
    before = logits(original)
    bare = remove_petl(copy.deepcopy(original), warn=False)
    assert not hasattr(bare, "petl")
    assert not torch.allclose(logits(bare), before)
    torch.testing.assert_close(logits(original), before)
