"""Every supported encoder family as a sequence classifier: BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA
(embeddings narrower than the hidden size), DistilBERT, ModernBERT (fused q/k/v, gated FFN, sliding
windows, a head that pools by its config), DeBERTa v2/v3 and MPNet (attention in their own code).

Every preset builds or is refused with its reason, counts exactly and trains only PETL and the
head; disabled is the base model bit for bit; zero-init modules leave the output unchanged; saving
and loading round-trips; the prefix equals explicit concatenation; LoRA on a fused or narrow weight
equals the merged weight. A search (sampler and supernet) on a family that refuses part of the
space goes on and says what it left out; a DeBERTa v3 folder with only its SentencePiece model trains.
"""

import copy

import pytest
import torch
from conftest import NO_RATES, REFERENCE_ATTENTION, ZERO_INIT

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
    remove_petl,
    save_petl,
)
from petl_nas.core.backbones import spec_for, supported_model_types
from petl_nas.core.tiny import tiny_backbone

pytestmark = pytest.mark.filterwarnings("ignore:.*frozen pooler looks untrained")  # random BERT poolers

V = 100
ENCODERS = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "modernbert", "deberta-v2", "mpnet"]
SIZES = {
    "electra": dict(embedding_size=16),  # ELECTRA-small embeds at 128 < 256
    # two layers: one sliding (a 2-token half window binds on 9 tokens), one global
    "modernbert": dict(global_attn_every_n_layers=2, local_attention=4),
}
BIAS_FREE = {"modernbert"}  # no biases in its projections or LayerNorms by default
OWN_ATTENTION = {"deberta-v2", "mpnet"}  # no attention interface: no prefix, no multi-head adapter
HEAD_FORMS = ("prefix", "mh_adapter")


def tiny(kind: str, seed: int = 0, **overrides):
    return tiny_backbone(
        kind, num_labels=2, seed=seed, vocab_size=V, pad_token_id=0, **{**SIZES.get(kind, {}), **overrides}
    )


def batch(seed: int = 1):
    """9 tokens, the last row right-padded by 3, with labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, -3:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}


def logits(model, x):
    with torch.no_grad():
        return model(**{k: v for k, v in x.items() if k != "labels"}).logits


def perturb(model, std=0.3, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def refusal(kind: str, config: PetlConfig) -> str | None:
    """The error a family gives a configuration it cannot take, else None."""
    if config.bitfit and kind in BIAS_FREE:
        return "no bias terms"
    if kind in OWN_ATTENTION and any(m.form in HEAD_FORMS for m in config.modules):
        return "attention interface"
    return None


def test_every_encoder_family_is_covered_here():
    encoders = {t for t in supported_model_types() if not spec_for(t).encoder_decoder and not spec_for(t).decoder_only}
    assert encoders == set(ENCODERS)


@pytest.mark.parametrize("kind", ENCODERS)
@pytest.mark.parametrize("name", preset_names())
def test_every_preset_counts_exactly_and_trains_only_petl_and_the_head(kind, name):
    model = tiny(kind)
    config = preset(name, model.config)
    if (reason := refusal(kind, config)) is not None:
        with pytest.raises(ConfigError, match=reason):
            apply_petl(model, config)
        return
    apply_petl(model, config).train()
    counted = count_model(model)
    assert counted.trainable + counted.head == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count_parameters(model.config, config, num_labels=2).deployable == counted.deployable
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    base = {f"{model.base_model_prefix}.{n}" for n, _ in model.base_model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**batch()).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    petl = {n for n in changed if n.startswith("petl.")}
    assert petl or not (config.modules or config.prompt_length), "no PETL module moved"
    allowed = {
        n for n in base if (config.bitfit and n.endswith("bias")) or (config.train_layernorms and "norm" in n.lower())
    }
    assert changed & base and changed & base <= allowed if allowed else not changed & base


@pytest.mark.parametrize("kind", ENCODERS)
@pytest.mark.parametrize("name", ["mam", "unipelt_apl", "prompt_tuning", "compacter", "lora_ffn"])
def test_disabled_is_the_base_model_and_save_load_round_trips(kind, name, tmp_path):
    base, x = tiny(kind), batch()
    config = preset(name, base.config)
    if refusal(kind, config) is not None:
        pytest.skip(f"{kind} refuses {name}")
    expected = logits(base, x)
    model = apply_petl(copy.deepcopy(base), config)
    perturb(model, std=1.0)
    with petl_disabled(model):
        assert torch.equal(logits(model, x), expected)  # bit for bit
    ours = logits(model, x)
    assert not torch.allclose(ours, expected, atol=1e-6)  # a random head's logits are ~1e-2: so are their changes
    save_petl(model, tmp_path)
    assert torch.allclose(logits(load_petl(tiny(kind), tmp_path), x), ours, atol=1e-5)


@pytest.mark.parametrize("kind", ENCODERS)
def test_zero_init_modules_leave_the_output_unchanged(kind):
    base, x = tiny(kind), batch()
    expected = logits(base, x)
    for label, spec in ZERO_INIT.items():
        if refusal(kind, PetlConfig(modules=(spec,))) is None:
            model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(spec,)))
            assert torch.equal(logits(model, x), expected), label  # Δh is exactly 0


@pytest.mark.parametrize("kind", sorted(set(ENCODERS) - OWN_ATTENTION))
def test_prefix_equals_explicit_concatenation(kind):
    model = apply_petl(tiny(kind), PetlConfig(modules=(ModuleSpec(form="prefix", size=3, reparam=8),)))
    perturb(model, std=1.0)
    x = batch()
    ours = logits(model, x)
    model.set_attn_implementation(REFERENCE_ATTENTION)
    assert torch.allclose(logits(model, x), ours, atol=1e-5)
    model.set_attn_implementation("petl")
    with petl_disabled(model):
        assert not torch.allclose(logits(model, x), ours, atol=1e-4)


@pytest.mark.parametrize("kind", ["modernbert", "deberta-v2", "distilbert"])
def test_lora_equals_merged_weights(kind):
    """LoRA on q, k, v, o and the FFN equals W + s·B·A merged into each weight (ModernBERT: into
    its third of the fused ``Wqkv``, and into its gated ``Wi`` whole)."""
    base, x = tiny(kind), batch()
    config = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=3, targets=("q", "k", "v", "o"), composition="scaled", scale=2.0),
            ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_in", "ffn_out")),
        )
    )
    model = apply_petl(copy.deepcopy(base), config)
    perturb(model)
    merged = copy.deepcopy(base)
    (block,) = spec_for(base.config).blocks
    with torch.no_grad():
        for l, layer in enumerate(merged.base_model.get_submodule(block.layers)):
            for group in model.petl.groups.values():
                for t in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
                    (site,) = block.sites(t)
                    if f"{l}_{t}" in group:
                        delta = group[f"{l}_{t}"].delta_weight()  # [out, in]
                        rows = delta.shape[0]
                        layer.get_submodule(site.path).weight[site.part * rows : (site.part + 1) * rows] += delta
    assert torch.allclose(logits(model, x), logits(merged, x), atol=1e-5)


def test_a_prompt_on_narrow_embeddings_has_the_embedding_width():
    """ELECTRA embeds at ``embedding_size`` and projects up: the prompt joins the embeddings, so it
    is l × embedding_size, and the count says so."""
    model = tiny("electra")
    config = preset("prompt_tuning", model.config)
    apply_petl(model, config)
    assert model.petl.prompt.embeddings.shape == (config.prompt_length, 16)
    assert count_model(model).deployable == config.prompt_length * 16
    assert logits(model, batch()).shape == (3, 2)


@pytest.mark.parametrize("own", ["cls", "mean"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_head_pools_as_the_configuration_says(own, pooling):
    """ModernBERT's classifier pools by its config's ``classifier_pooling``: ``auto`` keeps it, an
    explicit pooling sets it while PETL is applied (its logits: the bare model configured so), and
    removing PETL restores it."""
    base = tiny("modernbert", classifier_pooling=own)
    lora = (ModuleSpec(form="lora", size=2),)  # zero-init: the base model's output
    auto = apply_petl(copy.deepcopy(base), PetlConfig(modules=lora))
    assert auto.petl.pooling == own
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=lora, pooling=pooling))
    assert model.petl.pooling == pooling and model.config.classifier_pooling == pooling
    assert torch.equal(logits(model, batch()), logits(tiny("modernbert", classifier_pooling=pooling), batch()))
    remove_petl(model)
    assert model.config.classifier_pooling == own


@pytest.mark.parametrize("form", HEAD_FORMS)
def test_deberta_refuses_head_attention_forms_in_one_line(form):
    with pytest.raises(
        ConfigError,
        match=rf"modules\[0\]: {form}: transformers' attention interface is needed.*"
        r"deberta-v2 .*use lora",
    ):
        apply_petl(tiny("deberta-v2"), PetlConfig(modules=(ModuleSpec(form=form, size=4),)))


# ---- a search on a backbone that refuses some of the space -----------------------------------
def test_the_supernet_leaves_out_what_a_backbone_refuses():
    from petl_nas.search.oneshot.supernet import allows_bitfit, candidates, prompt_length_for
    from petl_nas.study.space import SearchSpace

    space = SearchSpace.load("unified")
    deberta, modernbert, bert = (tiny(k).config for k in ("deberta-v2", "modernbert", "bert"))
    assert {s.form for s in candidates(space, bert, None)} >= {"prefix", "mh_adapter", "lora"}
    assert {s.form for s in candidates(space, deberta, None)} & set(HEAD_FORMS) == set()
    assert prompt_length_for(space, deberta, None) == 0 < prompt_length_for(space, bert, None)
    assert not allows_bitfit(space, modernbert, None) and allows_bitfit(space, bert, None)


@pytest.mark.parametrize("kind, refused", [("modernbert", "bitfit"), ("deberta-v2", "prefix")])
@pytest.mark.slow
def test_a_search_records_what_a_backbone_refuses_and_goes_on(kind, refused, tmp_path, monkeypatch):
    """The unified space allows BitFit and prefixes; a backbone without biases or without the
    attention interface cannot take them. The search starts, says which named presets it skips and
    why, records refused draws as invalid configurations, and its supernet proposes none of them."""
    import optuna
    from optuna.trial import TrialState

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment, Fidelity, FinalEval, OneShot

    monkeypatch.chdir(tmp_path)
    backbone = {
        "tiny": {
            "model_type": kind,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 400,
        }
    }
    exp = Experiment(
        rates=NO_RATES,
        name="r",
        backbone=backbone,
        task="demo_keyword",
        budget="5%",
        space="unified",
        trials=3,
        seed=3,
        presets=[refused, "pfeiffer"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/study.db",
        strategy="both",
        # no anchored proposals: with them TPE's draws here, at 5% of a 2-layer model, went 500 in
        # a row over the budget or refused (it models this tiny space from a few trials)
        oneshot=OneShot(rungs=3, lr=3e-3, gate_lr=0.05, epochs=1, anchors=False, retry_lr=0),
        fidelity=Fidelity(length_buckets=0, k=160, epochs=1, batch_size=16, max_length=24, search_dev=64),
        final=FinalEval(seeds=0, baselines=False),
    )
    lines = []
    run_search(exp, printer=lines.append)
    said = next(line for line in lines if line.startswith("presets this backbone cannot take"))
    assert said.split(": ", 1)[1].startswith(f"{refused} (")
    invalid = [line for line in lines if "not trained, invalid configuration" in line]  # each reason said once
    assert invalid and len(invalid) == len({line.split("configuration: ", 1)[1] for line in invalid})
    study = optuna.load_study(study_name="r", storage=exp.storage_url)
    assert all(t.user_attrs.get("preset") != refused for t in study.trials)
    for t in study.trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs["fail_reason"].startswith("invalid configuration")
            assert any(t.user_attrs["fail_reason"].split(": ", 1)[1] in line for line in invalid)
        config = t.user_attrs.get("petl_config")
        if t.state == TrialState.COMPLETE:
            forms = {m["form"] for m in config["modules"]} | ({"bitfit"} if config.get("bitfit") else set())
            assert refused not in forms and not (kind == "deberta-v2" and forms & set(HEAD_FORMS))
    assert study.user_attrs["oneshot"]["proposed"]


def test_presets_with_a_model_lists_what_the_backbone_cannot_take(tmp_path, capsys):
    from petl_nas.app.cli import main

    tiny("modernbert").save_pretrained(tmp_path / "mb")
    assert main(["presets", "--model", str(tmp_path / "mb")]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "not for this backbone: bitfit: the modernbert backbone has no bias terms" in rows["bitfit"]
    assert "not for this backbone" not in rows["lora"] and "%" in rows["lora"]
    assert (
        rows["preset"].split()[1:3] == ["deployable", "%"] and "head excluded" in rows["preset"]
    )  # what the numbers are


def test_a_deberta_v3_folder_with_only_its_sentencepiece_model_trains(tmp_path):
    """microsoft/deberta-v3-* ship their tokenizer as spm.model alone (no tokenizer.json): such a
    folder is a backbone, and a trial loads its tokenizer (sentencepiece) and trains on it."""
    import io

    import sentencepiece

    from petl_nas.core.models import check_backbone_files as _check_backbone_files
    from petl_nas.search.worker import TrialSpec, run_trial

    tiny("deberta-v2").save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no tokenizer files"):
        _check_backbone_files(str(tmp_path))
    spm = io.BytesIO()
    words = ["a great film", "an awful dull movie", "the plot was fine", "what a lovely story", "i did not like it"]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(words * 20),
        model_writer=spm,
        vocab_size=30,
        hard_vocab_limit=False,
        minloglevel=2,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        user_defined_symbols=["[MASK]"],
    )
    (tmp_path / "spm.model").write_bytes(spm.getvalue())
    _check_backbone_files(str(tmp_path))
    result = run_trial(
        TrialSpec(
            backbone=str(tmp_path),
            task="demo_sentiment",
            k=64,
            search_dev=32,
            config=PetlConfig(modules=(ModuleSpec(form="lora", size=2),)).to_dict(),
            recipe={"lr": 5e-3, "epochs": 1, "batch_size": 16, "max_length": 16, "seed": 0},
        )
    )
    assert 0 <= result.score <= 1 and result.history
