"""Encoder-decoder and decoder-only backbones: BART, mBART, M2M100, Marian, Pegasus, T5 (and v1.1's
gated FFN), GPT-2, OPT, Phi, GPT-NeoX (q, k, v fused per head), and the Llama family (GQA; Mistral,
Qwen, Gemma, OLMo, StableLM, Granite, SmolLM3 and the fused Phi-3).

Every preset builds on each; zero-init modules and closed gates leave the outputs of the bare model;
only PETL parameters move; the prefix through the attention function equals explicit concatenation
of prefix keys/values (T5's position bias and Llama's key/value groups included); decoding with the
cache equals decoding without it; the `blocks` dimension places modules per attention kind.
"""

import copy
import dataclasses

import optuna
import pytest
import torch
from conftest import REFERENCE_ATTENTION, ZERO_INIT
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    DynamicCache,
    EncoderDecoderCache,
    GPT2Config,
    GPT2LMHeadModel,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MBartConfig,
    MBartForConditionalGeneration,
    MT5Config,
    MT5ForConditionalGeneration,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.pytorch_utils import Conv1D

from petl_nas import (
    ConfigError,
    ModuleSpec,
    PetlConfig,
    apply_petl,
    count_model,
    count_parameters,
    load_petl,
    petl_disabled,
    preset,
    preset_names,
    save_petl,
)
from petl_nas.core.backbones import spec_for
from petl_nas.core.modules.head_attention import edits_of
from petl_nas.study.space import SearchSpace

V, D, F = 64, 16, 32


def tiny(kind: str, seed: int = 0):
    """A tiny random LM of each family, in eval mode."""
    torch.manual_seed(seed)
    s2s = dict(
        vocab_size=V,
        d_model=D,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=F,
        decoder_ffn_dim=F,
        max_position_embeddings=64,
    )
    t5 = dict(
        vocab_size=V, d_model=D, d_kv=4, d_ff=F, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0
    )
    if kind == "bart":
        model = BartForConditionalGeneration(BartConfig(**s2s))
    elif kind == "mbart":
        model = MBartForConditionalGeneration(MBartConfig(**s2s))
    elif kind == "m2m_100":  # NLLB: sinusoidal positions, scaled embeddings
        model = M2M100ForConditionalGeneration(M2M100Config(**s2s, scale_embedding=True, pad_token_id=0))
    elif kind in ("marian", "pegasus"):  # their encoders scale ids' embeddings themselves
        ids = dict(pad_token_id=0, decoder_start_token_id=0, eos_token_id=2, bos_token_id=1)
        model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(kind, **s2s, scale_embedding=True, **ids))
    elif kind == "t5":
        model = T5ForConditionalGeneration(T5Config(**t5))
    elif kind == "t5_gated":  # T5 v1.1: gated-GELU FFN, untied LM head
        model = T5ForConditionalGeneration(T5Config(**t5, feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    elif kind == "mt5":  # mT5: T5 v1.1's layout under its own model type
        model = MT5ForConditionalGeneration(MT5Config(**t5))
    elif kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=64, pad_token_id=0))
    else:  # grouped-query attention: 4 query, 2 KV heads
        llama = dict(
            vocab_size=V,
            hidden_size=D,
            intermediate_size=F,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=D // 4,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            pad_token_id=0,
        )
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **llama, **OWN_NAMES.get(kind, {})))
    return model.eval()


# Config fields a family names its own way (OPT's FFN width; its embeddings are 512 wide by default),
# and StableLM's rotary quarter of a 4-wide head, which would be 1 (odd) and break the bare model.
# Granite's attention multiplier (its q·k scale, 1.0 by default) set off 1/sqrt(d) so the prefix must follow it.
OWN_NAMES = {
    "opt": dict(ffn_dim=F, word_embed_proj_dim=D),
    "stablelm": dict(partial_rotary_factor=0.5),
    "gpt_neox": dict(partial_rotary_factor=0.5),
    "granite": dict(attention_multiplier=0.3),
}
KINDS = [
    "bart",
    "mbart",
    "m2m_100",
    "marian",
    "pegasus",
    "t5",
    "t5_gated",
    "mt5",
    "gpt2",
    "llama",
    "opt",
    "phi",
    "gpt_neox",
]
# Llama's spec (Phi-3 its own, the same layout fused): Qwen2 adds q/k/v biases; Qwen3 and Gemma 3
# normalise q and k; Gemma scales its embeddings; Gemma 3 alternates sliding-window layers; Gemma 2
# soft-caps its logits (no head-attention forms there).
LLAMA_FAMILY = [
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma3_text",
    "phi3",  # Phi-3: q/k/v fused, unequal
    "olmo",
    "olmo2",
    "stablelm",
    "granite",
    "smollm3",
]
SOFT_CAPPED = ["gemma2"]
ENC_DEC = {"bart", "mbart", "m2m_100", "marian", "pegasus", "t5", "t5_gated", "mt5"}
BIAS_FREE = {
    "t5",
    "t5_gated",
    "mt5",
    "llama",
    "mistral",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo",
    "olmo2",
    "granite",
    "smollm3",
}


def batch(kind: str, seed: int = 1):
    """A padded batch with labels: right padding into an encoder, left padding into a decoder-only model."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (3, 8), generator=g)
    mask = torch.ones_like(ids)
    if kind in ENC_DEC:
        mask[-1, -3:] = 0
        labels = torch.randint(3, V, (3, 5), generator=g)
    else:
        mask[-1, :3] = 0
        labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}


def perturb(model, std=0.3, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def applied(kind, config):
    model = tiny(kind)
    if isinstance(config, str):
        config = preset(config, model.config)
    return apply_petl(model, config)


def logits(model, x):
    """Logits in inference mode. Both sides of a comparison must run under the same autograd state:
    on the CPU, SDPA takes another kernel when its float mask requires grad, and T5's position bias
    (from a trainable embedding in the bare model, frozen once PETL is applied) is such a mask. The
    kernels round differently (~1e-6 on T5 v1.1's logits), so comparing a trainable base with a
    frozen one measures the kernel choice, not PETL. Under no_grad both take the same kernel and
    the disabled model is the base model bit for bit."""
    with torch.no_grad():
        return model(**x).logits


def same(a, b, x, atol=1e-5, rtol=1e-5):
    """Equal logits at every real position (a left-padded row's pad positions carry no meaning)."""
    keep = (
        torch.ones(a.shape[:2], dtype=torch.bool)
        if x["labels"].shape != x["input_ids"].shape
        else x["attention_mask"].bool()
    )
    return torch.allclose(a[keep], b[keep], atol=atol, rtol=rtol)


PRESETS = preset_names()


# ---- every preset on every backbone ---------------------------------------------------------
def test_every_decoder_and_encoder_decoder_family_is_covered_here():
    from petl_nas.core.backbones import supported_model_types

    families = {t for t in supported_model_types() if spec_for(t).decoder_only or spec_for(t).encoder_decoder}
    assert families == (set(KINDS) - {"t5_gated"}) | set(LLAMA_FAMILY) | set(SOFT_CAPPED)


@pytest.mark.parametrize("kind", KINDS + LLAMA_FAMILY + SOFT_CAPPED)
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_and_trains_only_petl(kind, name):
    model = tiny(kind)
    if name == "bitfit" and kind in BIAS_FREE:
        with pytest.raises(ConfigError, match="no bias terms"):
            apply_petl(model, preset(name, model.config))
        return
    if (
        any(m.form == "ln" for m in preset(name, model.config).modules)
        and spec_for(model.config).blocks[0].attn_norm is None
    ):
        with pytest.raises(ConfigError, match="backbone spec does not say which norm"):  # Llama's serves Gemma 2 too
            apply_petl(model, preset(name, model.config))
        return
    if kind in SOFT_CAPPED and any(m.form in ("prefix", "mh_adapter") for m in preset(name, model.config).modules):
        with pytest.raises(ConfigError, match="cannot soft-cap attention logits"):
            apply_petl(model, preset(name, model.config))
        return
    width = getattr(model.config, "d_model", None) or model.config.hidden_size
    if any(m.form == "fourierft" and m.size > width * width for m in preset(name, model.config).modules):
        with pytest.raises(ConfigError, match=r"fourierft size n=\d+ exceeds the \d+×\d+ entries"):
            apply_petl(model, preset(name, model.config))  # a tiny model's q has fewer entries than n
        return
    apply_petl(model, preset(name, model.config)).train()
    # The meta-device count is the real model's trainable count (no head trains on an LM).
    assert count_parameters(model.config, preset(name, model.config)).trainable == count_model(model).trainable
    assert count_model(model).trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    norms = {
        f"{m}.{n}".lstrip(".")
        for m, mod in model.named_modules()
        for n, _ in mod.named_parameters(recurse=False)
        if "norm" in type(mod).__name__.lower()
    }
    assert all(n.startswith("petl.") or n.endswith("bias") or n in norms for n in trainable)
    assert not any(n.startswith("lm_head") for n in trainable)  # the LM head is pretrained: frozen
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**batch(kind)).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["mam", "unipelt_apl", "prompt_tuning", "compacter", "lora_ffn"])
def test_disabled_is_the_base_model_and_save_load_round_trips(kind, name, tmp_path):
    base = tiny(kind)
    x = batch(kind)
    expected = logits(base, x)
    model = apply_petl(copy.deepcopy(base), preset(name, base.config))
    perturb(model)
    with petl_disabled(model):
        assert torch.equal(logits(model, x), expected)  # bit for bit
    ours = logits(model, x)
    assert not torch.allclose(ours, expected, atol=1e-4)
    assert ours.shape == expected.shape  # prompt positions never reach the head
    save_petl(model, tmp_path)
    assert torch.allclose(logits(load_petl(tiny(kind), tmp_path), x), ours, atol=1e-5)


# ---- identity at zero-init (conftest's modules) and at closed gates --------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_zero_init_and_closed_gates_leave_the_output_unchanged(kind):
    base = tiny(kind)
    x = batch(kind)
    expected = logits(base, x)
    for label, spec in ZERO_INIT.items():
        model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(spec,)))
        assert same(logits(model, x), expected, x, atol=0, rtol=0), label  # Δh is exactly 0
    # Per-token gates: a closed one removes its module exactly (UniPELT's per-example prefix gate
    # leaves zero keys and values behind instead; tests/core/test_equivalence.py checks that form).
    per_token = PetlConfig(
        modules=tuple(dataclasses.replace(m, gate_per="token") for m in preset("unipelt_apl", base.config).modules)
    )
    model = apply_petl(copy.deepcopy(base), per_token)
    perturb(model, std=0.5)
    assert not same(logits(model, x), expected, x, atol=1e-4)
    with torch.no_grad():
        for g in (m for m in model.petl.modules() if type(m).__name__ == "Gate"):
            g.proj.weight.zero_()
            g.proj.bias.fill_(-1000.0)  # closed (T5 does not scale q·k: prefix logits run large)
    assert same(logits(model, x), expected, x)  # the gate's extra feature column reorders float sums


# ---- prefix through the attention function == explicit concatenation (conftest's reference) --


@pytest.mark.parametrize("kind", KINDS + LLAMA_FAMILY)
@pytest.mark.parametrize("reparam", [0, 8])
def test_prefix_equals_explicit_concatenation(kind, reparam):
    model = applied(kind, PetlConfig(modules=(ModuleSpec(form="prefix", size=3, reparam=reparam),)))
    perturb(model, std=1.0)
    x = batch(kind)
    ours = logits(model, x)
    model.set_attn_implementation(REFERENCE_ATTENTION)
    assert same(logits(model, x), ours, x)
    model.set_attn_implementation("petl")
    with petl_disabled(model):
        assert not same(logits(model, x), ours, x, atol=1e-4)
    n_attn = len(spec_for(model.config).blocks)  # 3 kinds of attention on encoder-decoders
    assert len(model.petl.prefix_encoders()) == n_attn


# ---- decoding with the cache == decoding without it ----------------------------------------
@pytest.mark.parametrize("kind", KINDS + LLAMA_FAMILY)
@pytest.mark.parametrize("name", ["prefix", "mam", "prompt_tuning", "unipelt_apl"])
def test_cached_decoding_equals_full_forward(kind, name):
    model = applied(kind, name)
    perturb(model)
    x = batch(kind)
    with torch.no_grad():
        if kind in ENC_DEC:
            dec = x["labels"]
            full = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"], decoder_input_ids=dec).logits
            enc = model.get_encoder()(input_ids=x["input_ids"], attention_mask=x["attention_mask"])
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            steps = [
                model(
                    encoder_outputs=enc,
                    attention_mask=x["attention_mask"],
                    decoder_input_ids=dec[:, i : i + 1],
                    past_key_values=cache,
                    use_cache=True,
                ).logits
                for i in range(dec.shape[1])
            ]
        else:
            ids, mask = x["input_ids"], x["attention_mask"]
            full = model(input_ids=ids, attention_mask=mask).logits
            cache = DynamicCache()
            steps = [
                model(input_ids=ids[:, :5], attention_mask=mask[:, :5], past_key_values=cache, use_cache=True).logits
            ]
            steps += [
                model(
                    input_ids=ids[:, i : i + 1], attention_mask=mask[:, : i + 1], past_key_values=cache, use_cache=True
                ).logits
                for i in range(5, ids.shape[1])
            ]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-4)  # T5 v1.1's untied logits run to ~10
    # And through generate: beam search with and without the cache picks the same tokens.
    gen = dict(
        input_ids=x["input_ids"],
        attention_mask=x["attention_mask"],
        max_new_tokens=5,
        num_beams=2,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(model.generate(**gen, use_cache=True), model.generate(**gen, use_cache=False))


# ---- where modules go: the blocks dimension ------------------------------------------------
def test_blocks_place_prefix_in_each_attention_kind_separately():
    model = applied("bart", PetlConfig(modules=(ModuleSpec(form="prefix", size=3, blocks=("cross",)),)))
    layers = model.model.decoder.layers
    assert all(edits_of(l.encoder_attn) is not None and edits_of(l.self_attn) is None for l in layers)
    assert all(edits_of(l.self_attn) is None for l in model.model.encoder.layers)
    # Two prefixes may share layers when their blocks differ; each has its own length.
    two = PetlConfig(
        modules=(
            ModuleSpec(form="prefix", size=3, blocks=("encoder", "decoder")),
            ModuleSpec(form="prefix", size=5, blocks=("cross",)),
        )
    )
    model = applied("bart", two)
    assert edits_of(model.model.decoder.layers[0].encoder_attn).prefix.shape[3] == 5
    assert edits_of(model.model.encoder.layers[1].self_attn).prefix.shape[3] == 3


@pytest.mark.parametrize("blocks, n_attn", [(None, 3), (("encoder",), 1), (("decoder", "cross"), 2)])
def test_lora_count_per_attention_kind(blocks, n_attn):
    """4·r·d per layer per attention kind (q and v), as He et al. count it."""
    r, L = 4, 2
    cfg = tiny("bart").config
    count = count_parameters(cfg, PetlConfig(modules=(ModuleSpec(form="lora", size=r, blocks=blocks),)))
    assert count.deployable == 4 * r * D * n_attn * L


def test_layers_count_within_each_stack():
    """A T5 with 2 encoder and 3 decoder layers: `layers` indexes each stack, checked against its depth."""
    cfg = T5Config(vocab_size=V, d_model=D, d_kv=4, d_ff=F, num_layers=2, num_decoder_layers=3, num_heads=4)
    top = PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=2, layers=(2,), blocks=("decoder",)),))
    assert count_parameters(cfg, top).deployable == 2 * 2 * D + 2 + D
    too_deep = PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=2, layers=(2,)),))
    with pytest.raises(ConfigError, match=r"modules\[0\].layers: layer 2 is past the encoder stack's depth"):
        count_parameters(cfg, too_deep)


@pytest.mark.parametrize(
    "spec, words",
    [
        (ModuleSpec(form="lora", blocks=("cross",)), "has no 'cross' block at attn; it has decoder"),
        (ModuleSpec(form="adapter", position="ffn", blocks=("encoder",)), "has no 'encoder' block at ffn"),
    ],
)
def test_blocks_a_backbone_lacks_are_rejected(spec, words):
    with pytest.raises(ConfigError, match=words):
        applied("gpt2", PetlConfig(modules=(spec,)))


def test_blocks_field_validates_and_round_trips():
    with pytest.raises(ConfigError, match="cross-attention has no FFN"):
        ModuleSpec(form="adapter", position="ffn", blocks=("cross",))
    with pytest.raises(ConfigError, match=r"modules\[0\].blocks: unknown value 'crosss' \(did you mean 'cross'"):
        PetlConfig.from_dict({"modules": [{"form": "lora", "blocks": ["crosss"]}]})
    spec = ModuleSpec(form="lora", blocks=["cross", "encoder"])
    assert spec.blocks == ("encoder", "cross")  # canonical order
    assert PetlConfig.from_dict({"modules": [{"form": "lora", "blocks": "encoder+cross"}]}).modules[0] == spec
    cfg = PetlConfig(modules=(spec, ModuleSpec(form="adapter")))
    assert PetlConfig.from_yaml(cfg.to_yaml()) == cfg
    assert "blocks" not in cfg.to_dict()["modules"][1]  # the default is not written


# ---- fused and gated weights: LoRA == merged W + s·B·A --------------------------------------
@pytest.mark.parametrize("kind", ["gpt2", "t5_gated", "llama", "bart", "phi3", "gpt_neox"])
def test_lora_equals_merged_weights_on_fused_and_gated_projections(kind):
    base = tiny(kind)
    config = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=3, targets=("q", "k", "v", "o"), composition="scaled", scale=2.0),
            ModuleSpec(form="lora", position="ffn", size=2),
        )
    )
    model = apply_petl(copy.deepcopy(base), config)
    perturb(model)
    merged = copy.deepcopy(base)
    spec = spec_for(base.config)
    with torch.no_grad():
        for block in spec.blocks:
            layers = merged.base_model.get_submodule(block.layers)
            for group in model.petl.groups.values():
                if len(spec.blocks) > 1 and block.name not in group:  # cross has no FFN
                    continue
                sub = group[block.name] if len(spec.blocks) > 1 else group
                for l, layer in enumerate(layers):
                    for t in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
                        sites = block.sites(t) if (t[0] != "f" or block.ffn_in) else ()
                        for j, site in enumerate(sites):
                            key = f"{l}_{t}" if len(sites) == 1 else f"{l}_{t}_{j}"
                            if key not in sub:
                                continue
                            delta = sub[key].delta_weight()  # [out, in]
                            linear = layer.get_submodule(site.path)
                            conv = isinstance(linear, Conv1D)  # weight [in, out]
                            weight = linear.weight.t() if conv else linear.weight
                            groups, start, width = site.layout(weight.shape[0], base.config)
                            size = weight.shape[0] // groups  # GPT-NeoX: q, k, v per head
                            for g in range(groups):  # Phi-3: unequal q, k, v rows
                                weight[g * size + start : g * size + start + width] += delta[
                                    g * width : (g + 1) * width
                                ]
    x = batch(kind)
    assert torch.allclose(logits(model, x), logits(merged, x), atol=1e-4)  # T5 v1.1 logits run to ~10


def test_lora_on_gpt_neox_q_adapts_the_query_rows_of_every_head():
    """GPT-NeoX fuses q, k and v per head: rows [3·h·d, 3·h·d + d) of ``query_key_value`` are head
    h's query. LoRA on q equals its update added to exactly those rows, written out from that layout."""
    base = tiny("gpt_neox")
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(form="lora", size=3, targets=("q",)),)))
    perturb(model)
    merged, heads = copy.deepcopy(base), base.config.num_attention_heads
    d = D // heads
    with torch.no_grad():
        (group,) = model.petl.groups.values()
        for l, layer in enumerate(merged.base_model.layers):
            delta = group[f"{l}_q"].delta_weight()  # [heads·d, D]
            for h in range(heads):
                layer.attention.query_key_value.weight[3 * h * d : 3 * h * d + d] += delta[h * d : (h + 1) * d]
    x = batch("gpt_neox")
    assert not same(logits(model, x), logits(base, x), x)
    assert same(logits(model, x), logits(merged, x), x)


def test_lora_counts_on_fused_grouped_and_gated_weights():
    r = 8
    gpt2, llama, t5g = (tiny(k).config for k in ("gpt2", "llama", "t5_gated"))
    lora = preset("lora", gpt2)
    assert count_parameters(gpt2, lora).deployable == 2 * 2 * r * (D + D)  # q and v slices of c_attn
    assert count_parameters(llama, lora).deployable == 2 * (r * (D + D) + r * (D + D // 2))  # v: 2 of 4 heads
    phi3 = tiny("phi3").config  # q and v: unequal slices of qkv_proj
    assert count_parameters(phi3, preset("lora", phi3)).deployable == 2 * (r * (D + D) + r * (D + D // 2))
    ffn = preset("lora_ffn", t5g)  # wi_0, wi_1 and wo
    assert count_parameters(t5g, ffn).deployable == (2 + 2) * 3 * r * (D + F)
    prefix = PetlConfig(modules=(ModuleSpec(form="prefix", size=5),))
    assert count_parameters(llama, prefix).deployable == 2 * 2 * 5 * (D // 2)  # per KV head
    assert count_parameters(t5g, prefix).deployable == 2 * 5 * D * (2 + 2 + 2)  # enc, dec, cross


# ---- the seq2seq search space ---------------------------------------------------------------
def test_seq2seq_space_samples_configs_that_apply_to_bart():
    space = SearchSpace.load("seq2seq")
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(0))
    cfg = tiny("bart").config
    placed = set()
    for _ in range(40):
        trial = study.ask()
        config, _ = space.sample(trial, n_layers=2)
        count_parameters(cfg, config)  # builds on the meta device
        placed |= {m.blocks for m in config.modules}
        study.tell(trial, [0.0, 1.0])
    assert {None, ("cross",), ("encoder",)} <= placed
    mam = preset("mam", cfg)
    assert space.params_for(mam, 2e-4, n_layers=2)["attn.blocks"] == "all"


def test_ffn_slot_rejects_cross(tmp_path):
    import yaml

    data = yaml.safe_load(open(SearchSpace.load("seq2seq").source).read())
    del data["slots"]["ffn"]["blocks"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"slots.ffn.blocks: cross-attention has no FFN"):
        SearchSpace.load(path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_gated_prompt_is_the_prompt_of_its_open_positions_or_none(kind):
    """The one-shot supernet's prompt on encoder-decoder and decoder-only models: the open positions
    alone are inserted and every attention that reads them (an encoder's, a decoder's cross-attention,
    a decoder-only model's self-attention) adds their log g, so at g = 1 it is the shorter prompt and,
    with every position shut, the model without a prompt."""
    from petl_nas.search.oneshot import build_supernet

    base, x = tiny(kind), batch(kind)
    net = build_supernet(copy.deepcopy(base), (), PetlConfig(), prompt_length=5)
    perturb(net.model)
    (unit,) = net.units
    keep = torch.tensor([False, True, True, False, True])
    unit.gate.set_log_alpha(torch.where(keep, 30.0, -30.0))
    short = apply_petl(copy.deepcopy(base), PetlConfig(prompt_length=3))
    with torch.no_grad():
        short.petl.prompt.embeddings.copy_(net.model.petl.prompt.embeddings[keep])
    net.model.eval()
    want = logits(short, x)
    assert torch.allclose(logits(net.model, x), want, atol=1e-5)
    unit.gate.set_log_alpha(torch.where(keep, 0.0, -30.0))  # half open: log 0.5 on their logits
    assert (logits(net.model, x) - want).abs().max() > 1e-4  # tiny random LMs: small logits
    net.close_all()
    assert torch.equal(logits(net.model, x), logits(apply_petl(copy.deepcopy(base), PetlConfig()), x))


@pytest.mark.parametrize("kind", sorted(ENC_DEC))
def test_the_prompt_leaves_the_first_tokens_embedding_as_the_encoder_had_it(kind):
    """The prompt goes in after the first token as embeddings: the first token's input to the first
    encoder layer is the bare model's, so a family that scales its token embeddings (M2M100, mBART
    with scale_embedding) still scales them when petl-nas hands the encoder embeddings instead of ids."""
    base = tiny(kind)
    model = apply_petl(copy.deepcopy(base), PetlConfig(prompt_length=3))
    seen = []
    for m in (base, model):
        layer = m.base_model.get_submodule(spec_for(m.config).block("encoder").layers)[0]
        handle = layer.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"])[:, 0].clone()),
            with_kwargs=True,
        )
        logits(m, batch(kind))
        handle.remove()
    assert torch.equal(seen[0], seen[1])


def test_unit_costs_of_the_seq2seq_space_count_every_attention_kind():
    """`space show seq2seq --model`: one unit of LoRA rank on q and v costs 2 · 2d per attention kind
    and layer, in all three kinds (encoder, decoder, cross: the default), not only the first choice
    of the blocks dimension."""
    from petl_nas.search.study import unit_costs

    rows = {
        tuple(line.split()[:2]): line.split()[3:]
        for line in unit_costs(SearchSpace.load("seq2seq"), tiny("bart").config)
    }
    assert rows[("attn", "lora")] == [f"{3 * 2 * 2 * D}", f"{3 * 2 * 2 * D * 2}"]  # 2 layers per stack
