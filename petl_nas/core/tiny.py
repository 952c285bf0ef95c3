"""Tiny random backbones for tests and smoke runs: no network, no downloads, milliseconds.

`tiny_tokenizer` builds a WordPiece vocabulary (characters, then frequent words) from the texts you
give it, the same in every process, and wraps it as a transformers BERT tokenizer; `tiny_backbone`
builds a randomly initialised sequence classifier (hidden 32, 2 layers, 4 heads, FFN 64 by default)
whose vocabulary matches that tokenizer.

Example:
    >>> tok = tiny_tokenizer(["a good film", "a dull plot"], vocab_size=100)
    >>> model = tiny_backbone(tokenizer=tok, num_labels=2)
    >>> model(**tok(["a good plot"], return_tensors="pt")).logits.shape
    torch.Size([1, 2])
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Iterable

import torch

__all__ = ["tiny_tokenizer", "tiny_backbone", "in_family_names", "SPECIAL_TOKENS", "TINY_CONFIG"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TINY_CONFIG = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=514
)
# Families that name the same sizes differently (DistilBERT's config maps some of them, not the FFN
# width; GPT-2's FFN is n_inner; OPT's is ffn_dim).
_OWN_NAMES = {
    "distilbert": {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "intermediate_size": "hidden_dim",
    },
    "gpt2": {"intermediate_size": "n_inner"},
    "opt": {"intermediate_size": "ffn_dim"},
}


def in_family_names(model_type: str, sizes: dict) -> dict:
    """Generic config sizes (``hidden_size``, ``intermediate_size``, ...) in ``model_type``'s own
    field names. OPT's embeddings are 512 wide by default: a tiny one embeds at its hidden size."""
    names = _OWN_NAMES.get(model_type, {})
    out = {names.get(k, k): v for k, v in sizes.items()}
    if model_type == "opt" and "hidden_size" in sizes:
        out.setdefault("word_embed_proj_dim", sizes["hidden_size"])
    return out


def tiny_tokenizer(texts: Iterable[str], vocab_size: int = 1000):
    """A lower-casing WordPiece BERT tokenizer whose vocabulary is built from ``texts`` in memory.

    Ids 0-4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]``; then every character seen (as a word start and
    as a ``##`` continuation, so any word of those characters can be spelled), then whole words,
    most frequent first, until ``vocab_size`` (fewer when the texts hold fewer). Ties are broken by
    the text of the piece, so the same texts give the same vocabulary in every process (a trained
    WordPiece vocabulary does not: its merges tie-break in hash order). ``name_or_path`` is
    ``tiny-wordpiece-<hash of the vocabulary>`` so caches can key on it.

    Example:
        >>> tok = tiny_tokenizer(["the cat sat", "the dog ran"], vocab_size=60)
        >>> tok.convert_ids_to_tokens(tok("the cat")["input_ids"])
        ['[CLS]', 'the', 'cat', '[SEP]']
    """
    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertTokenizerFast

    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(word for text in texts for word, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)))
    starts, continuations = Counter(), Counter()
    for word, count in words.items():
        starts[word[0]] += count
        for char in word[1:]:
            continuations["##" + char] += count
    by_frequency = lambda counts: sorted(counts, key=lambda piece: (-counts[piece], piece))  # noqa: E731
    pieces = list(
        dict.fromkeys([*SPECIAL_TOKENS, *by_frequency(starts), *by_frequency(continuations), *by_frequency(words)])
    )[:vocab_size]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    digest = hashlib.sha1(repr(pieces).encode()).hexdigest()[:12]
    # BertTokenizerFast rebuilds BERT's normaliser, pre-tokeniser and [CLS]/[SEP] template around
    # the vocabulary, so the result behaves exactly like a pretrained BERT tokenizer.
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, name_or_path=f"tiny-wordpiece-{digest}")


def tiny_backbone(model_type: str = "bert", num_labels: int = 2, tokenizer=None, seed: int = 0, **config_overrides):
    """A randomly initialised ``AutoModelForSequenceClassification`` from a tiny config, in eval mode.

    Args:
        model_type: a transformers model type (``bert``, ``roberta``, ``electra``, ``distilbert``, ...).
        num_labels: head width; 1 makes a regression head.
        tokenizer: sets ``vocab_size`` and ``pad_token_id`` to match it (else ``vocab_size`` 1000).
        seed: the same seed gives the same weights.
        **config_overrides: any config field, e.g. ``num_hidden_layers=3``.

    Example:
        >>> model = tiny_backbone("roberta", num_labels=1, vocab_size=50)
        >>> model.config.hidden_size, model.config.problem_type
        (32, 'regression')
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    kwargs = dict(TINY_CONFIG, vocab_size=1000)
    if tokenizer is not None:
        kwargs.update(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    kwargs.update(config_overrides)
    kwargs = in_family_names(model_type, kwargs)
    # Special-token ids a family's default config names (ModernBERT's lie near 50,281) move into the
    # tiny vocabulary: [CLS] opens and [SEP] closes, as the tiny tokenizer writes them.
    defaults = AutoConfig.for_model(model_type)
    specials = {"bos_token_id": 2, "cls_token_id": 2, "eos_token_id": 3, "sep_token_id": 3}
    for name, tiny_id in specials.items():
        value = getattr(defaults, name, None)
        if name not in kwargs and isinstance(value, int) and value >= kwargs["vocab_size"]:
            kwargs[name] = tiny_id
    config = AutoConfig.for_model(model_type, num_labels=num_labels, **kwargs)
    if num_labels == 1:
        config.problem_type = "regression"
    with torch.random.fork_rng(devices=[]):  # seed the weights without moving the caller's RNG
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config).eval()
