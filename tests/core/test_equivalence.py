"""Equivalence against trusted references: explicit prefix concatenation, merged LoRA weights,
He et al.'s λ decomposition, the multi-head adapter's formula, identity at zero-init and closed gates."""

import copy
import dataclasses
import re
import warnings

import pytest
import torch
from conftest import REFERENCE_ATTENTION, ZERO_INIT, batch, tiny_model
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from petl_nas import ModuleSpec, PetlConfig, apply_petl, petl_disabled, preset, remove_petl
from petl_nas.core.modules import Bottleneck, LoRA
from petl_nas.core.modules.head_attention import edits_of, petl_attention


class AdapterAfter(torch.nn.Module):
    """A sequential (Houlsby) adapter by hand: a linear's output h becomes h + up(act(down(h)))."""

    def __init__(self, dense, adapter):
        super().__init__()
        self.dense, self.adapter = dense, adapter

    def forward(self, x):
        h = self.dense(x)
        return h + self.adapter.up(self.adapter.act(self.adapter.down(h)))


def _perturb(model, std=0.2, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.petl.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


# ---- prefix through the attention function == explicit concatenation (conftest's reference) --


@pytest.mark.parametrize("reparam", [0, 16])
def test_prefix_equals_explicit_concatenation(kind, reparam):
    model = apply_petl(tiny_model(kind), PetlConfig(modules=(ModuleSpec(form="prefix", size=5, reparam=reparam),)))
    _perturb(model, std=1.0)
    x = batch(kind)
    ours = model(**x, output_hidden_states=True)
    ours.logits.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.petl.named_parameters()}
    model.zero_grad()
    model.set_attn_implementation(REFERENCE_ATTENTION)
    ref = model(**x, output_hidden_states=True)
    ref.logits.sum().backward()
    assert torch.allclose(ours.logits, ref.logits, atol=1e-5)
    for a, b in zip(ours.hidden_states, ref.hidden_states):
        assert torch.allclose(a[:-1], b[:-1], atol=1e-5)  # padded positions of the last row aside
    for n, p in model.petl.named_parameters():  # every layer's slice gets its own gradient
        assert torch.allclose(grads[n], p.grad, atol=1e-5) and grads[n].abs().sum() > 0, n
    with petl_disabled(model):
        model.set_attn_implementation("sdpa")
        assert not torch.allclose(model(**x).logits, ours.logits, atol=1e-4)


@pytest.mark.parametrize("name", ["prefix", "mam", "unipelt_apl", "prompt_tuning", "mh_pa"])
def test_padding_is_respected(kind, name):
    """A padded row scores exactly as the same row alone, without padding."""
    model = apply_petl(tiny_model(kind), preset(name, tiny_model(kind).config))
    _perturb(model)
    x = batch(kind)
    padded = model(**x).logits[-1]
    keep = int(x["attention_mask"][-1].sum())
    alone = model(input_ids=x["input_ids"][-1:, :keep], attention_mask=x["attention_mask"][-1:, :keep]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def test_gated_prefix_is_he_et_al_lambda_decomposition():
    """concat attention = (1-λ)·Attn(q,K,V) + λ·Attn(q,P_k,P_v), λ = prefix share of the softmax mass."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    pk, pv = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
    s = 8**-0.5
    concat = torch.softmax(q @ torch.cat([pk, k], 2).transpose(-1, -2) * s, -1) @ torch.cat([pv, v], 2)
    mass_p = torch.exp(q @ pk.transpose(-1, -2) * s).sum(-1, keepdim=True)
    mass_x = torch.exp(q @ k.transpose(-1, -2) * s).sum(-1, keepdim=True)
    lam = mass_p / (mass_p + mass_x)
    attn = lambda kk, vv: torch.softmax(q @ kk.transpose(-1, -2) * s, -1) @ vv
    assert torch.allclose(concat, (1 - lam) * attn(k, v) + lam * attn(pk, pv), atol=1e-5)


def test_ungated_prefix_adds_its_own_attention():
    """composition 'add': h + softmax(q P_kᵀ) P_v, the prefix normalised on its own."""
    model = apply_petl(tiny_model(), PetlConfig(modules=(ModuleSpec(form="prefix", size=4, composition="add"),)))
    attn = model.bert.encoder.layer[0].attention.self
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    out, _ = petl_attention(attn, q, k, v, None, scaling=8**-0.5)
    pk, pv = edits_of(attn).prefix.layer_kv(0)
    expected = (
        torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5, -1) @ v
        + torch.softmax(q @ pk.transpose(-1, -2) * 8**-0.5, -1) @ pv
    )
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-5)


def test_multi_head_adapter_matches_its_formula():
    model = apply_petl(tiny_model(), PetlConfig(modules=(ModuleSpec(form="mh_adapter", size=6),)))
    _perturb(model)
    attn = model.bert.encoder.layer[1].attention.self
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    out, _ = petl_attention(attn, q, k, v, None, scaling=8**-0.5)
    mh = edits_of(attn).mh
    expected = (
        torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5, -1) @ v
        + torch.relu(q * 8**-0.5 @ mh.keys.transpose(-1, -2)) @ mh.values
    )
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-5)


# ---- LoRA == running with W + s·B·A merged --------------------------------------------------
def test_lora_equals_merged_weights(kind):
    spec_attn = ModuleSpec(
        form="lora", position="attn", targets=("q", "k", "v", "o"), size=3, composition="scaled", scale=2.0
    )
    spec_ffn = ModuleSpec(form="lora", position="ffn", size=2, composition="scaled", scale=0.5, layers=(0, 2))
    base = tiny_model(kind)
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(spec_attn, spec_ffn)))
    _perturb(model)
    merged = copy.deepcopy(base)
    layers = merged.base_model.encoder.layer
    paths = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "o": "attention.output.dense",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
    }
    with torch.no_grad():
        for name, group in model.petl.groups.items():
            for key, lora in group.items():
                layer, target = key.split("_", 1)
                layers[int(layer)].get_submodule(paths[target]).weight += lora.delta_weight()
    x = batch(kind)
    assert torch.allclose(model(**x).logits, merged(**x).logits, atol=1e-5)


def test_merge_and_unload_gives_a_plain_model_with_the_trained_outputs(kind):
    """PEFT's merge_and_unload: the LoRA updates folded, no petl left, the same logits; what does not
    fold is one ConfigError naming each part, and the model is left as it was."""
    from petl_nas import ConfigError, merge_and_unload

    lora = PetlConfig(
        modules=(
            ModuleSpec(form="lora", targets=("q", "v"), size=3),
            ModuleSpec(form="lora", position="ffn", size=2, layers=(1,)),
        )
    )
    model = apply_petl(tiny_model(kind), lora)
    _perturb(model)
    x = batch(kind)
    with torch.no_grad():
        expected = model(**x).logits
        plain = merge_and_unload(model)
        assert type(plain) is type(tiny_model(kind)) and not hasattr(plain, "petl")
        assert not any("petl" in n for n, _ in plain.named_parameters())
        assert torch.allclose(plain(**x).logits, expected, atol=1e-5)

    for config, reasons in (
        (
            PetlConfig(modules=(*lora.modules, ModuleSpec(form="adapter", position="ffn", size=4))),
            "modules[2] (adapter at ffn) computes beside the weights",
        ),
        (dataclasses.replace(lora, pooling="mean"), "pooling: mean (the stock"),
    ):
        model = apply_petl(tiny_model(kind), config)
        _perturb(model)
        with torch.no_grad():
            before = model(**x).logits
            with pytest.raises(ConfigError, match=re.escape(reasons)):
                merge_and_unload(model)
            assert hasattr(model, "petl") and torch.equal(model(**x).logits, before)
    with pytest.warns(
        UserWarning,
        match=r"remove_petl: the classifier was trained reading mean pooling, which the "
        r"stock \w+ head does not read, so its outputs change",
    ):
        remove_petl(model)  # the last one: mean pooling
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a head the stock model reads: nothing to say
        stock = "pooler_trained" if kind == "bert" else "cls"  # RoBERTa's head reads the first token
        remove_petl(apply_petl(tiny_model(kind), dataclasses.replace(lora, pooling=stock)))


def test_petl_disabled_warns_that_merged_updates_stay(kind):
    from petl_nas import merge_lora

    model = apply_petl(tiny_model(kind), PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=2),)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with petl_disabled(model):  # nothing merged: the bare backbone, no warning
            pass
    assert merge_lora(model) == 2 * model.config.num_hidden_layers
    with pytest.warns(
        UserWarning,
        match=rf"petl_disabled: {2 * model.config.num_hidden_layers} LoRA update\(s\) "
        r"were merged into the weights \(merge_lora\) and stay on",
    ):
        with petl_disabled(model):
            pass


# ---- identity at zero-init (conftest's modules) and at closed gates --------------------------
@pytest.mark.parametrize("label", ZERO_INIT)
def test_zero_init_leaves_the_output_unchanged(kind, label):
    base = tiny_model(kind)
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(ZERO_INIT[label],)))
    x = batch(kind)
    assert torch.equal(model(**x).logits, base(**x).logits)  # exact: a zero update adds exactly 0


@pytest.mark.parametrize("s", [0.5, 2.5])
def test_a_scaled_composition_multiplies_the_update_by_s(s):
    """LoRA's and an adapter's update, and LoRA's merged weight, against s·(the unscaled update)
    (the forward and `delta_weight` read the same s: their agreement alone cannot see a wrong one)."""
    torch.manual_seed(0)
    lora = LoRA(ModuleSpec(form="lora", size=3, composition="scaled", scale=s), 8, 6)
    adapter = Bottleneck(ModuleSpec(form="adapter", size=3, composition="scaled", scale=s, init="bert"), 8)
    with torch.no_grad():
        lora.B.normal_()
        x = torch.randn(2, 4, 8)
        assert torch.allclose(lora(x), s * (x @ lora.A.t() @ lora.B.t()), atol=1e-6)
        assert torch.allclose(lora.delta_weight(), s * lora.B @ lora.A, atol=1e-6)
        assert torch.allclose(adapter(x), s * adapter.up(adapter.act(adapter.down(x))), atol=1e-6)


def test_a_sequential_adapter_reads_the_lora_updated_output_of_its_linear():
    """LoRA on o and a Houlsby adapter after o: the adapter reads o's output with o's update. The
    reference folds the LoRA into W_o and puts the same adapter after it by hand."""
    base = tiny_model("bert")
    lora = ModuleSpec(form="lora", position="attn", targets=("o",), size=2, composition="scaled", scale=2.0)
    seq = ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, layers=(1,))
    model = apply_petl(copy.deepcopy(base), PetlConfig(modules=(lora, seq)))
    _perturb(model)
    adapter = model.petl.groups["1_attn_adapter"]["1"]
    ref = copy.deepcopy(base)
    with torch.no_grad():
        for key, module in model.petl.groups["0_attn_lora"].items():
            ref.bert.encoder.layer[int(key.split("_")[0])].attention.output.dense.weight += module.delta_weight()
    out = ref.bert.encoder.layer[1].attention.output
    out.dense = AdapterAfter(out.dense, adapter)
    x = batch("bert")
    with torch.no_grad():
        assert torch.allclose(model(**x).logits, ref(**x).logits, atol=1e-5)


# ---- UniPELT's gates, against the paper's formulas --------------------------------------------
def _gates(model):
    return [m for m in model.petl.modules() if type(m).__name__ == "Gate"]


def _close(gates):
    with torch.no_grad():
        for g in gates:
            g.proj.weight.zero_()
            g.proj.bias.fill_(-40.0)  # σ(-40) ≈ 4e-18: closed


def _paper_gate(gate, x, mask):
    """UniPELT: mean over the example's (real) tokens of σ(W·x_t + b): [B, L, d] -> [B, 1, 1]."""
    g = torch.sigmoid(x @ gate.proj.weight.t() + gate.proj.bias)  # [B, L, 1]
    m = mask[..., None].float()
    return (g * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)


def reference_unipelt_attention(module, query, key, value, attention_mask, scaling=None, **_):
    """Textbook attention over [g·P_K; K], [g·P_V; V] with g from the sublayer input (UniPELT code)."""
    e = edits_of(module)
    pk, pv = e.prefix.all_kv()[e.prefix_index]  # indexed here, not through the per-forward cache
    b, n = query.shape[0], pk.shape[1]
    g = _paper_gate(e.prefix_compose.gate, e.sublayer_input(), e.pad_mask()).view(b, 1, 1, 1)
    k = torch.cat([g * pk.expand(b, -1, -1, -1), key], 2)
    v = torch.cat([g * pv.expand(b, -1, -1, -1), value], 2)
    scores = query @ k.transpose(-1, -2) * scaling
    if attention_mask is not None:
        scores = scores + torch.nn.functional.pad(attention_mask, (n, 0))
    return (scores.softmax(-1) @ v).transpose(1, 2), None


AttentionInterface.register("reference_unipelt", reference_unipelt_attention)
AttentionMaskInterface.register("reference_unipelt", eager_mask)


def test_open_unipelt_prefix_gate_scales_the_prefix_keys_and_values(kind):
    model = apply_petl(tiny_model(kind), preset("unipelt_ap", tiny_model(kind).config))
    _perturb(model, std=0.5)  # open, and far from 1/2
    x = batch(kind)
    ours = model(**x).logits
    model.set_attn_implementation("reference_unipelt")
    assert torch.allclose(ours, model(**x).logits, atol=1e-5)


def test_open_unipelt_adapter_and_lora_gates_match_the_formulas():
    """Adapter: Δh = g·up(f(down(h))); LoRA: Δh = g·B·A·x (the gate replaces alpha/r);
    g = mean over real tokens of σ(W·x_t + b), one scalar per example."""
    torch.manual_seed(0)
    x, mask = torch.randn(3, 7, 16), torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5])
    adapter = ModuleSpec(form="adapter", position="ffn", insertion="sequential", size=4, gate=True)
    lora = ModuleSpec(form="lora", size=4, composition="add", gate=True)
    from petl_nas.core.modules import Bottleneck, LoRA

    a, l = Bottleneck(adapter, 16), LoRA(lora, 16, 16)
    _perturb_module = lambda m: [p.data.add_(torch.randn(p.shape) * 0.5) for p in m.parameters()]  # noqa: E731
    _perturb_module(a), _perturb_module(l)
    g_a, g_l = _paper_gate(a.compose.gate, x, mask), _paper_gate(l.compose.gate, x, mask)
    assert g_a.shape == (3, 1, 1) and not torch.allclose(g_a, torch.full_like(g_a, 0.5), atol=0.05)
    assert torch.allclose(a(x, mask), g_a * a.up(a.act(a.down(x))), atol=1e-6)
    assert torch.allclose(l(x, mask), g_l * (x @ l.A.t() @ l.B.t()), atol=1e-6)
    # per token: a gate for every position instead
    tok = LoRA(ModuleSpec(form="lora", size=4, composition="add", gate=True, gate_per="token"), 16, 16)
    _perturb_module(tok)
    per_token = torch.sigmoid(x @ tok.compose.gate.proj.weight.t() + tok.compose.gate.proj.bias)
    assert torch.allclose(tok(x, mask), per_token * (x @ tok.A.t() @ tok.B.t()), atol=1e-6)


@pytest.mark.parametrize("per", ["example", "token"])
def test_fused_gates_equal_separate_ones_with_their_gradients(per):
    """A gate that reads the input of the module's first projection is computed in the same matmul
    (`shared_read.read`); forward and every gradient equal the separate gate's."""
    from torch import nn

    from petl_nas.core.modules import Bottleneck, LoRA

    torch.manual_seed(0)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5])
    adapter = ModuleSpec(form="adapter", position="ffn", insertion="sequential", size=4, gate=True, gate_per=per)
    lora = ModuleSpec(form="lora", size=4, composition="scaled", scale=2.0, gate=True, gate_per=per)
    for fused in (Bottleneck(adapter, 16), LoRA(lora, 16, 16)):
        for p in fused.parameters():
            p.data.add_(torch.randn(p.shape) * 0.5)
        separate = copy.deepcopy(fused)
        separate.dropout = nn.Dropout(0.0)  # not Identity: takes the separate-gate path
        results = []
        for m in (fused, separate):
            x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
            out = m(x, mask)
            (out * torch.linspace(-1, 1, 16)).sum().backward()
            results.append((out, x.grad, [p.grad for p in m.parameters()]))
        (o1, gx1, gp1), (o2, gx2, gp2) = results
        assert torch.allclose(o1, o2, atol=1e-6) and torch.allclose(gx1, gx2, atol=1e-6)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(gp1, gp2))
        assert fused.compose.gate.proj.weight.grad.abs().sum() > 0  # the gate learns through the fused path


def test_closed_unipelt_gates_leave_a_prefix_of_zeros(kind):
    """Closed UniPELT gates silence the adapter and LoRA exactly and scale P_K, P_V to zero: what is
    left is the base model attending to l extra positions whose keys and values are zero."""
    base = tiny_model(kind)
    model = apply_petl(copy.deepcopy(base), preset("unipelt_apl", base.config))
    _perturb(model, std=0.5)
    x = batch(kind)
    assert not torch.allclose(model(**x).logits, base(**x).logits, atol=1e-4)
    gates = _gates(model)
    assert len(gates) == 4 * base.config.num_hidden_layers  # prefix, adapter, LoRA q and v
    _close(gates)
    zeros = apply_petl(copy.deepcopy(base), PetlConfig(modules=(ModuleSpec(form="prefix", size=10),)))
    with torch.no_grad():
        zeros.petl.groups["0_attn_prefix"]["encoder"].flat.zero_()
    assert torch.allclose(model(**x).logits, zeros(**x).logits, atol=1e-6)


def test_closed_per_token_gates_leave_the_output_unchanged(kind):
    """The per-token variant adds log g to the prefix logits: a closed gate removes every module."""
    base = tiny_model(kind)
    per_token = PetlConfig(
        modules=tuple(dataclasses.replace(m, gate_per="token") for m in preset("unipelt_apl", base.config).modules)
    )
    model = apply_petl(copy.deepcopy(base), per_token)
    _perturb(model, std=0.5)
    x = batch(kind)
    assert not torch.allclose(model(**x).logits, base(**x).logits, atol=1e-4)
    _close(_gates(model))
    assert torch.allclose(model(**x).logits, base(**x).logits, atol=1e-6)


@pytest.mark.parametrize("hidden", [32, 36])  # head dims 8 and 9
def test_gate_columns_padded_as_on_a_gpu_change_nothing(kind, hidden, monkeypatch):
    """On a GPU the log-gate feature is padded to a head dim that is a multiple of 8 (`gate_columns`,
    for cuDNN's attention kernel): the same logits as the one column a CPU uses."""
    import petl_nas.core.modules.head_attention as attention

    base = tiny_model(kind, hidden_size=hidden)
    per_token = PetlConfig(
        modules=tuple(dataclasses.replace(m, gate_per="token") for m in preset("unipelt_apl", base.config).modules)
    )
    model = apply_petl(copy.deepcopy(base), per_token)
    _perturb(model, std=0.5)
    x = batch(kind)
    one_column = model(**x).logits
    widths, sdpa = [], attention.sdpa_attention_forward

    def spy(module, q, k, v, *args, **kwargs):
        widths.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return sdpa(module, q, k, v, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
    monkeypatch.setattr(attention, "gate_columns", lambda head_dim, device: 8 - head_dim % 8)
    assert torch.allclose(model(**x).logits, one_column, atol=1e-6)
    assert widths and set(widths) == {(16, 16, 16)}  # every layer's gated prefix, 8 + 8 or 9 + 7


def test_gate_columns_reach_a_multiple_of_8_on_a_gpu_and_stay_one_on_a_cpu():
    from petl_nas.core.modules.head_attention import gate_columns

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [d + gate_columns(d, cuda) for d in (64, 65, 71, 128)] == [72, 72, 72, 136]
    assert {gate_columns(d, cpu) for d in (8, 9, 64)} == {1}


def test_sequential_adapter_reads_the_sublayer_output():
    """Houlsby placement: o-projection output h becomes h + f(h·W_down)·W_up."""
    base = tiny_model()
    model = apply_petl(
        copy.deepcopy(base),
        PetlConfig(modules=(ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, layers=(1,)),)),
    )
    _perturb(model)
    adapter = model.petl.groups["0_attn_adapter"]["1"]
    ref = copy.deepcopy(base)
    ref.bert.encoder.layer[1].attention.output.dense = AdapterAfter(
        ref.bert.encoder.layer[1].attention.output.dense, adapter
    )
    x = batch()
    assert torch.allclose(model(**x).logits, ref(**x).logits, atol=1e-6)


def test_prompt_tokens_follow_the_first_token():
    model = apply_petl(tiny_model(), preset("prompt_tuning"))
    x = batch()
    out = model(**x, output_hidden_states=True)
    assert out.hidden_states[0].shape[1] == x["input_ids"].shape[1] + 20
    emb = model.bert.embeddings
    first = emb(input_ids=x["input_ids"][:, :1])
    assert torch.allclose(out.hidden_states[0][:, :1], first, atol=1e-6)  # [CLS] stays at position 0
