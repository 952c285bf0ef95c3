"""He et al. (ICLR 2022) Table 11: tunable parameters per method on BART/mBART-large-sized backbones.

Both backbones have 12 encoder + 12 decoder layers, d = 1024 and d_ffn = 4d; per layer index there
are three attention kinds (N_attn = 3: encoder self, decoder self, cross) and two FFNs (N_ffn = 2).
Every count below comes from the real injection code on the meta device (no weights allocated).

The paper's formulas omit bias terms. Prefix vectors, LoRA's A/B and the multi-head adapter have
none, so their counts are the formula exactly. Our bottleneck adapters keep the biases of their two
linear layers (r + d per adapter): the tests assert formula + (r + d)·N·12, and the paper's
percentages still come out to the precision it states.
"""

import pytest
from transformers import BartConfig, MBartConfig

from petl_nas import ModuleSpec, PetlConfig, count_parameters, preset

d, L = 1024, 12
LARGE = dict(
    d_model=d,
    encoder_layers=L,
    decoder_layers=L,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4 * d,
    decoder_ffn_dim=4 * d,
    max_position_embeddings=1024,
)
BART_LARGE = BartConfig(vocab_size=50265, **LARGE)
MBART_LARGE = MBartConfig(vocab_size=250027, **LARGE)  # mbart-large-cc25


def backbone_size(vocab: int, final_norms: bool) -> int:
    """BartModel / MBartModel parameters, written out: shared embeddings, two position tables, layers."""
    attention = 4 * (d * d + d)
    ffn = d * 4 * d + 4 * d + 4 * d * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    embeddings = vocab * d + 2 * (1024 + 2) * d + 2 * norm  # positions carry an offset of 2; embedding LNs
    return embeddings + L * (encoder_layer + decoder_layer) + (2 * norm if final_norms else 0)


def test_backbones_are_bart_large_and_mbart_large():
    assert count_parameters(BART_LARGE, PetlConfig()).backbone == backbone_size(50265, False) == 406_291_456
    assert count_parameters(MBART_LARGE, PetlConfig()).backbone == backbone_size(250027, True) == 610_851_840


def _spec(**kw):
    return PetlConfig(modules=(ModuleSpec(**kw),))


l, r, b = 30, 512, 800  # prefix length, bottleneck / rank, prefix MLP width (He et al.'s)
TABLE_11 = {
    # name: (config, He et al.'s formula, bias terms our modules add)
    "prefix tuning": (_spec(form="prefix", size=l, reparam=b), 2 * l * d * 3 * L, 0),
    "MH PA (attn)": (_spec(form="mh_adapter", size=l), 2 * l * d * 3 * L, 0),
    "adapter (attn)": (_spec(form="adapter", position="attn", size=r), 2 * r * d * 3 * L, (r + d) * 3 * L),
    "adapter (ffn)": (_spec(form="adapter", position="ffn", size=r), 2 * r * d * 2 * L, (r + d) * 2 * L),
    "LoRA (attn)": (_spec(form="lora", position="attn", size=r), 4 * r * d * 3 * L, 0),  # Wq and Wv
    "LoRA (ffn)": (_spec(form="lora", position="ffn", size=r), 10 * r * d * 2 * L, 0),  # W1, W2; d_ffn = 4d
    "MAM adapter": (preset("mam", BART_LARGE), 2 * l * d * 3 * L + 2 * r * d * 2 * L, (r + d) * 2 * L),
}


@pytest.mark.parametrize("backbone", [BART_LARGE, MBART_LARGE], ids=["bart-large", "mbart-large"])
@pytest.mark.parametrize("row", TABLE_11)
def test_table_11_counts(backbone, row):
    config, formula, biases = TABLE_11[row]
    assert count_parameters(backbone, config).deployable == formula + biases


def test_prefix_reparameterisation_is_trained_then_flattened():
    """Training holds one MLP per attention kind (Li & Liang's BART setup); deployment keeps 2·l·d·3·12."""
    count = count_parameters(BART_LARGE, TABLE_11["prefix tuning"][0])
    per_kind = l * d + (d * b + b) + (b * 2 * L * d + 2 * L * d)
    assert count.trainable == 3 * per_kind
    assert count.deployable == 2 * l * d * 3 * L


@pytest.mark.parametrize(
    "config, paper_pct",
    [
        (preset("mam", BART_LARGE), 6.7),  # MAM, l=30, r=512
        (_spec(form="prefix", size=200, reparam=b), 3.6),  # prefix tuning, l=200
    ],
)
def test_percentages_of_bart_large(config, paper_pct):
    assert round(count_parameters(BART_LARGE, config).deployable_pct, 1) == paper_pct
