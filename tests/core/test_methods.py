"""The method matrix: every preset on every tiny backbone, with the same generic checks.

A method joins by being a preset; its closed-form count is written out below as arithmetic.
"""

import copy

import pytest
import torch
from conftest import batch, tiny_config, tiny_model
from peft.tuners.lokr.layer import factorization
from safetensors.torch import load_file

from petl_nas import (
    apply_petl,
    count_model,
    count_parameters,
    load_petl,
    petl_disabled,
    preset,
    preset_names,
    save_petl,
)


def closed_form(name: str, c) -> tuple[int, int]:
    """(trainable, deployable) from the papers' formulas (He et al. App. B), for a BERT-like encoder."""
    d, L, f = c.hidden_size, c.num_hidden_layers, c.intermediate_size
    pooler = d if c.model_type == "bert" else 0  # RoBERTa's classifier has no pooler
    adapter = lambda r: 2 * r * d + r + d  # W_down, W_up and their biases, per layer
    gate = d + 1  # UniPELT gate: Linear(d, 1)

    def prefix(l, b):  # (with MLP, flattened)
        return l * d + (d * b + b) + (b * 2 * L * d + 2 * L * d), 2 * l * d * L

    layernorms = (2 * L + 1) * 2 * d  # two per layer + the embeddings'
    u, v = factorization(d, -1)  # LoKr's factors of d (PEFT's rule): d = u·v, u ≤ v

    def phm_adapter(r, n=4):  # rank-one fast matrices: n·(in/n + out/n) each
        return (d + r) + r + (r + d) + d

    forms = {
        "houlsby": L * 2 * adapter(d // 16) + layernorms,
        "pfeiffer": L * adapter(d // 16),
        "parallel_adapter": L * adapter(d // 16),
        "scaled_pa": L * adapter(d // 16),
        "mh_pa": 2 * 30 * d * L,
        "lora": 4 * 8 * d * L,  # r·(d + d) on q and on v
        "lora_ffn": 2 * 8 * (d + f) * L,  # = 10·r·d·L when f = 4d
        "compacter": 2 * (4**3 + L * phm_adapter(4)) + layernorms,  # d/32 rounded up to n=4
        "compacter_pp": 4**3 + L * phm_adapter(4) + layernorms,
        "bitfit": d + L * (4 * d + d + f + d + d) + pooler,  # embeddings LN, q k v o, LN, W1, W2, LN
        "prompt_tuning": 20 * d,
        "dora": 4 * 8 * d * L + 2 * d * L,  # LoRA's, and a magnitude per output row of q, v
        "lokr": 2 * L * (u * u + (2 * 8 * v if 8 < v / 2 else v * v)),  # W₁ u×u, W₂ v×v of rank 8 (or full)
        "ia3": (2 * d + f) * L,  # k, v and W2's input (T-Few)
        "ia3_kv": 2 * d * L,
        "ln_tuning": 2 * 2 * d * L,  # γ, β of the attention and the FFN norm
        "vera": 2 * L * (d + 1024),  # L_t·(out + r), A and B frozen (not counted)
        "fourierft": 2 * L * 1000,  # n·L_t, the frequencies frozen
    }
    if name in forms:
        return forms[name], forms[name]
    mixes = {
        "prefix": (prefix(30, 800), 0),
        "mam": (prefix(30, 800), L * adapter(512)),
        "mam_glue": (prefix(16, 800), L * adapter(16)),
        "unipelt_ap": (prefix(10, 512), L * (adapter(d // 16) + 2 * gate)),
        "unipelt_apl": (prefix(10, 512), L * (adapter(d // 16) + 2 * gate + 4 * 8 * d + 2 * gate)),
    }
    (p_train, p_deploy), rest = mixes[name]
    return p_train + rest, p_deploy + rest


PRESETS = preset_names()


def _apply(kind, name, seed=0):
    model = tiny_model(kind, seed)
    return apply_petl(model, preset(name, model.config))


def _perturb(model, std=0.2, seed=3):
    """Give every PETL tensor non-trivial values (zero-initialised parts included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


@pytest.mark.parametrize("name", PRESETS)
def test_counts_equal_closed_forms(kind, name):
    cfg = tiny_config(kind)
    count = count_parameters(cfg, preset(name, cfg))
    assert (count.trainable, count.deployable) == closed_form(name, cfg)


@pytest.mark.parametrize("name", PRESETS)
def test_meta_count_equals_the_real_model(kind, name):
    model = _apply(kind, name)
    head = sum(p.numel() for p in model.classifier.parameters())
    real = sum(p.numel() for p in model.parameters() if p.requires_grad) - head
    meta = count_parameters(model.config, preset(name, model.config))
    assert meta.trainable == real == count_model(model).trainable
    assert meta.head == head


def _meant_to_train(model, config) -> set[str]:
    """The names the config says train, worked out from names alone (not from `requires_grad`):
    every PETL tensor, the task head (outside the backbone), and in the backbone its biases under
    BitFit, its LayerNorms under ``train_layernorms`` and its pooler under ``pooling: pooler_trained``."""
    backbone = model.base_model_prefix + "."

    def trains(n):
        if n.startswith("petl.") or not n.startswith(backbone):
            return True
        return (
            (config.bitfit and n.endswith(".bias"))
            or (config.train_layernorms and "LayerNorm" in n)
            or (getattr(config, "pooling", None) == "pooler_trained" and n.startswith(backbone + "pooler."))
        )

    return {n for n, _ in model.named_parameters() if trains(n)}


@pytest.mark.parametrize("name", PRESETS)
def test_only_petl_parameters_change(kind, name):
    """Training moves exactly what the method trains: every PETL tensor (so its hooks reach the
    forward pass and give it a gradient), the head, BitFit biases and LayerNorms where the config
    says; every other backbone tensor stays bit-identical."""
    model = _apply(kind, name).train()
    config = preset(name, model.config)
    expected = _meant_to_train(model, config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == expected, (
        f"trainable but meant frozen: {sorted(trainable - expected)[:3]}; "
        f"frozen but meant to train: {sorted(expected - trainable)[:3]}"
    )
    assert any(n.startswith("petl.") for n in expected) or config.bitfit  # BitFit alone adds no module
    # A zero-initialised half (LoRA's B, an adapter's W_up) keeps its other half's gradient at zero
    # until it moves; give it values so that three steps reach every PETL tensor.
    with torch.no_grad():
        for p in model.petl.parameters():
            if p.ndim >= 2 and not p.any():
                p.normal_(0, 0.2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        model(**batch(kind, seed=1 + step, n=8), labels=torch.tensor([0, 1] * 4)).loss.backward()
        opt.step()
        opt.zero_grad()
    after = dict(model.named_parameters())
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    frozen_moved = sorted(changed - expected)
    assert not frozen_moved, f"frozen backbone tensors changed: {frozen_moved[:5]}"
    untrained = sorted(expected - changed)
    assert not untrained, f"trainable tensors never moved (no gradient reached them): {untrained[:5]}"


@pytest.mark.parametrize("name", PRESETS)
def test_save_load_gives_identical_logits(kind, name, tmp_path):
    model = _apply(kind, name)
    _perturb(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad and not n.startswith("petl."):  # BitFit, LayerNorms, head
                p.add_(0.05)
    x = batch(kind)
    expected = model(**x).logits
    save_petl(model, tmp_path)
    fresh = load_petl(tiny_model(kind), tmp_path)
    assert torch.allclose(fresh(**x).logits, expected, atol=1e-6)
    # What is shipped is the deployable count plus the head.
    saved = sum(t.numel() for t in load_file(tmp_path / "petl_weights.safetensors").values())
    count = count_model(model)
    assert saved == count.deployable + count.head


@pytest.mark.parametrize("name", PRESETS)
def test_disabled_is_the_base_model(kind, name):
    base = tiny_model(kind)
    x = batch(kind)
    expected = base(**x).logits
    model = apply_petl(copy.deepcopy(base), preset(name, base.config))
    _perturb(model)
    with petl_disabled(model):
        assert torch.allclose(model(**x).logits, expected, atol=1e-6)
    if name != "bitfit":
        assert not torch.allclose(model(**x).logits, expected, atol=1e-6)
