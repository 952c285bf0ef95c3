"""Export to HF PEFT: a LoRA configuration found on any family whose adapted weights are whole
modules is the same model in PEFT. With petl-nas's trained A and B copied into the PEFT model the
exported config builds, the outputs are equal, and PEFT adapts exactly the weights petl-nas does
(ranks and scales per module through rank_pattern / alpha_pattern, layers written into the names).
"""

import copy

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    T5Config,
    T5ForConditionalGeneration,
)

from petl_nas import ModuleSpec, PetlConfig, apply_petl, count_model, preset
from petl_nas.core.backbones import spec_for
from petl_nas.core.tiny import tiny_backbone
from petl_nas.deploy.interop import NotExpressible, to_peft

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:.*frozen pooler looks untrained")

V = 100
MIXED = PetlConfig(
    modules=(  # two ranks, two scales, a subset of layers, attention and FFN
        ModuleSpec(form="lora", size=4, targets=("q", "v"), composition="scaled", scale=2.0, layers=(1,)),
        ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_in", "ffn_out")),
    )
)
ATTN_OUT_AND_FFN = PetlConfig(
    modules=(  # what a fused q/k/v leaves whole: o and the FFN
        ModuleSpec(form="lora", size=4, targets=("o",), composition="scaled", scale=2.0),
        ModuleSpec(form="lora", position="ffn", size=2, targets=("ffn_in", "ffn_out"), layers=(0,)),
    )
)


BLOCKS = PetlConfig(
    modules=(  # an encoder-decoder: LoRA in two of its three attention kinds
        ModuleSpec(form="lora", size=4, targets=("q", "v"), blocks=("encoder", "cross"), layers=(1,)),
        ModuleSpec(form="lora", position="ffn", size=2, composition="scaled", scale=0.5, blocks=("decoder",)),
    )
)


CAUSAL = ("llama", "phi3", "opt", "phi")


def build(kind: str):
    torch.manual_seed(0)
    if kind == "t5":
        return T5ForConditionalGeneration(
            T5Config(
                vocab_size=V,
                d_model=16,
                d_kv=4,
                d_ff=32,
                num_layers=2,
                num_heads=4,
                feed_forward_proj="gated-gelu",
                decoder_start_token_id=0,
            )
        ).eval()
    if kind == "bart":
        return BartForConditionalGeneration(
            BartConfig(
                vocab_size=V,
                d_model=16,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                max_position_embeddings=32,
            )
        ).eval()
    if kind in CAUSAL:
        return AutoModelForCausalLM.from_config(
            AutoConfig.for_model(
                kind,
                vocab_size=V,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                **({"ffn_dim": 32, "word_embed_proj_dim": 16} if kind == "opt" else {}),
            )
        ).eval()
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=4, n_positions=32)).eval()
    return tiny_backbone(kind, num_labels=2, vocab_size=V, pad_token_id=0)


def petl_loras(model) -> dict[str, torch.nn.Module]:
    """Each petl-nas LoRA by the full name of the weight it adapts (relative to the base model)."""
    spec = spec_for(model.config)
    out = {}
    for group in model.petl.groups.values():
        for block in spec.blocks:
            if len(spec.blocks) > 1 and block.name not in group:  # a module restricted to other blocks
                continue
            sub = group if len(spec.blocks) == 1 else group[block.name]
            for l in range(len(model.base_model.get_submodule(block.layers))):
                for t in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
                    sites = block.sites(t) if (t[0] != "f" or block.ffn_in) else ()
                    for j, site in enumerate(sites):
                        key = f"{l}_{t}" if len(sites) == 1 else f"{l}_{t}_{j}"
                        if key in sub:
                            out[f"{block.layers}.{l}.{site.path}"] = sub[key]
    return out


@pytest.mark.parametrize(
    "kind, config",
    [
        ("bert", MIXED),
        ("roberta", MIXED),
        ("distilbert", MIXED),
        ("deberta-v2", MIXED),
        ("llama", MIXED),
        ("modernbert", ATTN_OUT_AND_FFN),
        ("gpt2", ATTN_OUT_AND_FFN),
        ("bart", BLOCKS),
        ("t5", MIXED),  # T5 v1.1: two W1 matrices
        ("phi3", ATTN_OUT_AND_FFN),  # q/k/v fused in unequal slices; gate_up_proj whole
        ("mpnet", MIXED),
        ("opt", MIXED),
        ("phi", MIXED),  # one-letter q/k/v/o names; W1/W2 on the layer itself
    ],
)
def test_an_exported_lora_is_the_same_model_in_peft(kind, config):
    base = build(kind)
    causal = kind in CAUSAL + ("gpt2",)
    task_kind = "causal_lm" if causal else "seq2seq" if kind in ("bart", "t5") else "classification"
    ours = apply_petl(copy.deepcopy(base), config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in ours.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    exported = to_peft(config, base.config, task_kind)
    assert exported["task_type"] == {"causal_lm": "CAUSAL_LM", "seq2seq": "SEQ_2_SEQ_LM"}.get(task_kind, "SEQ_CLS")
    assert exported.get("fan_in_fan_out", False) == (kind == "gpt2")  # Conv1D keeps W as [in, out]
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.get_peft_config(exported)).eval()
    loras = petl_loras(ours)
    peft_loras = [(name, m) for name, m in theirs.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    adapted = {key: m for name, m in peft_loras for key in loras if name.endswith("." + key)}
    assert len(peft_loras) == len(adapted) and set(adapted) == set(loras)  # PEFT adapts exactly these weights
    with torch.no_grad():
        for name, module in adapted.items():
            assert module.r["default"] == loras[name].A.shape[0]
            assert module.scaling["default"] == loras[name].compose.fixed_scale
            module.lora_A["default"].weight.copy_(loras[name].A)
            module.lora_B["default"].weight.copy_(loras[name].B)
        ids = torch.randint(3, V, (2, 7), generator=g)
        x = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            **({"decoder_input_ids": ids[:, :4]} if task_kind == "seq2seq" else {}),
        }
        expected, got = ours(**x).logits, theirs(**x).logits
    assert not torch.allclose(expected, base(**x).logits, atol=1e-5)  # the LoRAs change the output
    assert torch.allclose(got, expected, atol=1e-5)
    # and PEFT trains the head petl-nas trains (DeBERTa's pooler, ModernBERT's head, not just the classifier)
    head = sum(p.numel() for n, p in theirs.named_parameters() if p.requires_grad and "lora_" not in n)
    assert head == count_model(ours).head


def test_a_fused_slice_and_a_second_lora_on_one_weight_are_named():
    with pytest.raises(NotExpressible, match=r"q is one of 3 slices of the fused attn\.Wqkv"):
        to_peft(preset("lora"), build("modernbert").config)
    twice = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=4, targets=("q",)),
            ModuleSpec(form="lora", size=2, targets=("q", "v"), layers=(1,)),
        )
    )
    with pytest.raises(NotExpressible, match=r"a second LoRA on encoder\.layer\.attention\.self\.query"):
        to_peft(twice, build("bert").config)
    apart = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=4, targets=("q",), layers=(0,)),
            ModuleSpec(form="lora", size=2, targets=("q",), layers=(1,)),
        )
    )
    assert to_peft(apart, build("bert").config)["rank_pattern"]  # the same weight, other layers: fine


def test_pooling_is_expressible_where_the_stock_head_reads_it():
    cls = PetlConfig(modules=(ModuleSpec(form="lora", size=4),), pooling="cls")
    assert to_peft(cls, build("roberta").config)["peft_type"] == "LORA"  # RoBERTa's head reads <s>
    with pytest.raises(
        NotExpressible,
        match=r"pooling: cls \(PEFT trains the model's own head, which reads "
        r"\[CLS\] through the pooler; a space or configuration with "
        r"pooling: pooler_trained exports\)",
    ):
        to_peft(cls, build("bert").config)


def test_why_a_prefix_is_not_exported_to_peft():
    """The refusal's reasons, measured on PEFT itself: its prefix tuning cannot run on a BERT
    classifier, and on Llama, with petl-nas's prefix copied in, it is petl-nas's prefix with the
    real tokens' positions moved by the prefix length (equal only once they are shifted)."""
    prefix = PetlConfig(modules=(ModuleSpec(form="prefix", size=3, reparam=0, composition="gated"),))
    ids = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(0))
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    on_bert = peft.get_peft_model(build("bert"), peft.PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=3))
    with pytest.raises(ValueError, match="does not support past key values"):
        on_bert(**x)
    with pytest.raises(NotExpressible, match="which transformers' bert models do not take"):
        to_peft(prefix, build("bert").config)

    base = build("llama")
    ours = apply_petl(copy.deepcopy(base), prefix, flat_prefix=True).eval()
    ((_, encoder),) = ours.petl.prefix_encoders()
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
    ).eval()
    with torch.no_grad():
        encoder.flat.normal_()
        flat = encoder.flat  # [layers, k/v, kv heads, l, head dim]
        theirs.prompt_encoder["default"].embedding.weight.copy_(flat.permute(3, 0, 1, 2, 4).reshape(3, -1))
        got = theirs(**x).logits
        assert not torch.allclose(ours(**x).logits, got, atol=1e-3)
        shifted = ours(**x, position_ids=torch.arange(3, 10).expand(2, -1)).logits
    assert torch.allclose(shifted, got, atol=1e-5)
    with pytest.raises(NotExpressible, match="moves the real tokens' positions by the prefix length"):
        to_peft(prefix, base.config, "causal_lm")


@pytest.mark.parametrize("kind", ["llama", "gpt2", "opt"])
def test_a_decoder_lm_prompt_is_peft_prompt_tuning(kind):
    """Both prepend the prompt to a decoder-only LM's input: with petl-nas's trained prompt copied
    in, PEFT's model gives the same logits at every real position, left-padded rows included (PEFT's
    logits begin with the prompt's). A decoder-only classifier's prompt is refused with the measured
    reason: PEFT's classifier then reads the last position, the pad of a right-padded row."""
    prompt = PetlConfig(prompt_length=3)
    base = build(kind)
    ours = apply_petl(copy.deepcopy(base), prompt).eval()
    exported = to_peft(prompt, base.config, "causal_lm")
    assert (exported["peft_type"], exported["num_virtual_tokens"]) == ("PROMPT_TUNING", 3)
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.get_peft_config(exported)).eval()
    ids = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row
    with torch.no_grad():
        ours.petl.prompt.embeddings.normal_()
        theirs.prompt_encoder["default"].embedding.weight.copy_(ours.petl.prompt.embeddings)
        expected = ours(input_ids=ids, attention_mask=mask).logits
        got = theirs(input_ids=ids, attention_mask=mask).logits
    assert got.shape[1] == expected.shape[1] + 3
    assert not torch.allclose(expected, base(input_ids=ids, attention_mask=mask).logits, atol=1e-3)
    assert torch.allclose(got[:, 3:][mask.bool()], expected[mask.bool()], atol=1e-5)
    config = copy.deepcopy(base.config)
    config.pad_token_id = 0
    classifier = AutoModelForSequenceClassification.from_config(config).eval()
    ours = apply_petl(copy.deepcopy(classifier), prompt).eval()
    theirs = peft.get_peft_model(
        copy.deepcopy(classifier), peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=3)
    ).eval()
    right = torch.ones_like(ids)
    right[1, -2:] = 0  # a right-padded row
    with torch.no_grad():
        ours.petl.prompt.embeddings.normal_()
        theirs.prompt_encoder["default"].embedding.weight.copy_(ours.petl.prompt.embeddings)
        x = {"input_ids": ids.masked_fill(right == 0, 0), "attention_mask": right}
        assert not torch.allclose(theirs(**x).logits[1], ours(**x).logits[1], atol=1e-3)
    with pytest.raises(NotExpressible, match="a prompt on a decoder-only classifier .*right-padded"):
        to_peft(prompt, base.config, "classification")
    with pytest.raises(NotExpressible, match=r"prompt tokens after the first token \(PEFT prepends them\)"):
        to_peft(prompt, build("bert").config)
