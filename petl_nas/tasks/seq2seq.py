"""Encoder-decoder tasks: their settings, source/target encoding, the label-smoothed loss, a tiny model.

`Seq2SeqSettings` is what a generation task fixes besides its data: label smoothing and target
length for training, beam search for decoding (the values He et al. used are on the registered
tasks, see `petl_nas.tasks.generation`). `encode_pairs` tokenises sources and targets (target padding
becomes -100 batch by batch, in `data.EncodedSplit.batches`); `seq2seq_loss` is the training loss;
`tiny_seq2seq` builds a random BART/mBART/T5 of a tiny size for tests and smoke runs.

Example:
    >>> settings = Seq2SeqSettings(num_beams=6, max_length=60, min_length=10, no_repeat_ngram_size=3)
    >>> settings.generate_kwargs()["num_beams"]
    6
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..errors import ConfigError

if TYPE_CHECKING:  # torch is imported where it is used: reading a study's tasks needs none
    import torch

__all__ = [
    "Seq2SeqSettings",
    "encode_pairs",
    "seq2seq_loss",
    "check_languages",
    "language_start",
    "tiny_seq2seq",
    "SEQ2SEQ_FAMILIES",
]


@dataclass(frozen=True)
class Seq2SeqSettings:
    """How a sequence-to-sequence task is trained and decoded.

    Attributes:
        label_smoothing: ε of the label-smoothed cross-entropy (He et al.: 0.1).
        max_target_length: target tokens kept for training (longer targets are truncated).
        num_beams: beam width at decoding.
        max_length: most decoder tokens a beam may hold, the start token included (transformers'
            ``generate(max_length=...)``, as He et al.'s scripts pass it).
        min_length: fewest decoder tokens before the end token may be chosen.
        length_penalty: exponent on the length when beams are ranked (1.0: mean log-probability).
        no_repeat_ngram_size: forbid repeating any n-gram of this size (0: off).
        source_lang, target_lang: language codes for multilingual tokenizers (mBART: ``en_XX``,
            ``ro_RO``); ignored by tokenizers without languages.
    """

    label_smoothing: float = 0.1
    max_target_length: int = 128
    num_beams: int = 4
    max_length: int = 128
    min_length: int = 0
    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    source_lang: str | None = None
    target_lang: str | None = None

    def __post_init__(self):
        def whole(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        for name in ("label_smoothing", "length_penalty"):
            if not isinstance(getattr(self, name), (int, float)) or isinstance(getattr(self, name), bool):
                raise ConfigError(f"generation: {name} must be a number, got {getattr(self, name)!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"generation: label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        for name in ("max_target_length", "num_beams", "max_length"):
            if not whole(getattr(self, name)) or getattr(self, name) < 1:
                raise ConfigError(f"generation: {name} must be a whole number >= 1, got {getattr(self, name)!r}")
        if not whole(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise ConfigError(
                f"generation: no_repeat_ngram_size must be a whole number >= 0, got {self.no_repeat_ngram_size!r}"
            )
        for name, least, why in (
            ("max_length", 2, "the decoder's start token and one generated token"),
            ("max_target_length", 3, "one target token beside the start and end tokens"),
        ):
            if getattr(self, name) < least:  # shorter: nothing to decode, or to train on
                raise ConfigError(
                    f"generation: {name} {getattr(self, name)} leaves no room for {why}: give at least {least}"
                )
        if not whole(self.min_length) or not 0 <= self.min_length <= self.max_length:
            raise ConfigError(
                f"generation: min_length must be a whole number from 0 to max_length "
                f"({self.max_length}), got {self.min_length!r}"
            )

    def generate_kwargs(self) -> dict:
        """Keyword arguments of ``model.generate`` for beam search with these settings."""
        return {
            "num_beams": self.num_beams,
            "max_length": self.max_length,
            "min_length": self.min_length,
            "length_penalty": self.length_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
            "early_stopping": True,
            "do_sample": False,
        }


def _set_languages(tokenizer, settings: Seq2SeqSettings) -> None:
    if settings.source_lang and hasattr(tokenizer, "src_lang"):
        tokenizer.src_lang = settings.source_lang
    if settings.target_lang and hasattr(tokenizer, "tgt_lang"):
        tokenizer.tgt_lang = settings.target_lang


def check_languages(tokenizer, settings: Seq2SeqSettings) -> None:
    """One error line, before a search trains, for ``source_lang``/``target_lang`` that this tokenizer
    cannot write: it has no languages (they would be ignored), or not that one."""
    named = [k for k in ("source_lang", "target_lang") if getattr(settings, k)]
    if named and not (hasattr(tokenizer, "src_lang") or hasattr(tokenizer, "tgt_lang")):
        raise ConfigError(
            f"generation: {' and '.join(named)} given, but this backbone's tokenizer "
            f"({type(tokenizer).__name__}) has no languages (mBART's, M2M100's and NLLB's do); "
            f"leave {'them' if len(named) > 1 else 'it'} out"
        )
    language_start(tokenizer, settings)  # a target language it does not have: its error


def language_start(tokenizer, settings: Seq2SeqSettings) -> dict:
    """How decoding starts in the target language, read off where the tokenizer puts its code in a
    target, as training saw it: at the end (mBART: the decoder starts with the code, which the
    labels shifted right put first) -> ``decoder_start_token_id``; at the start (M2M100, NLLB,
    mBART-50: the decoder starts with the model's own start token, then the code) ->
    ``forced_bos_token_id``. ``{}`` without a target language or a tokenizer that has languages."""
    if not (settings.target_lang and hasattr(tokenizer, "tgt_lang")):
        return {}
    try:
        _set_languages(tokenizer, settings)
        code = (
            tokenizer.get_lang_id(settings.target_lang)
            if hasattr(tokenizer, "get_lang_id")
            else tokenizer.convert_tokens_to_ids(settings.target_lang)
        )
    except (KeyError, ValueError):
        code = None
    target = tokenizer(text_target="a")["input_ids"] if code not in (None, tokenizer.unk_token_id) else []
    if target and target[0] == code:
        return {"forced_bos_token_id": code}
    if code in target:
        return {"decoder_start_token_id": code}
    raise ConfigError(
        f"generation: target_lang {settings.target_lang!r} is not a language this tokenizer writes into its targets"
    )


def encode_pairs(
    sources: Sequence[str], targets: Sequence[str], tokenizer, max_length: int, settings: Seq2SeqSettings
) -> tuple[list[list[int]], list[list[int]]]:
    """(source ids, target ids): sources cut at ``max_length``, targets at ``max_target_length``.

    Example:
        >>> src, tgt = encode_pairs(["a b c"], ["c b a"], tok, 16, Seq2SeqSettings())  # doctest: +SKIP
    """
    if not len(sources):
        return [], []
    _set_languages(tokenizer, settings)
    src = tokenizer(list(sources), truncation=True, max_length=max_length)["input_ids"]
    tgt = tokenizer(text_target=list(targets), truncation=True, max_length=settings.max_target_length)["input_ids"]
    return list(src), list(tgt)


def seq2seq_loss(model, batch: dict[str, torch.Tensor], label_smoothing: float) -> torch.Tensor:
    """Mean label-smoothed cross-entropy over the batch's target tokens (-100 labels are skipped).

    The decoder reads the labels shifted right (the model's own rule: BART starts with its end
    token, T5 with padding, mBART with the language code); smoothing spreads ε uniformly over the
    vocabulary as in torch's ``cross_entropy(label_smoothing=ε)`` and transformers' Trainer.
    """
    import torch.nn.functional as F

    labels = batch["labels"]  # [B, T], -100 at padding
    if hasattr(model, "prepare_decoder_input_ids_from_labels"):
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels)
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
        ).logits  # [B, T, V]
    else:
        logits = model(**batch).logits
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, label_smoothing=label_smoothing
    )


# Generic tiny sizes (hidden, layers, heads, FFN) in each family's own config names.
SEQ2SEQ_FAMILIES = {
    "bart": (
        "d_model",
        ("encoder_layers", "decoder_layers"),
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ),
    "t5": ("d_model", ("num_layers", "num_decoder_layers"), ("num_heads",), ("d_ff",)),
}
_FAMILY = {
    "bart": "bart",
    "mbart": "bart",
    "m2m_100": "bart",
    "marian": "bart",
    "pegasus": "bart",
    "t5": "t5",
    "mt5": "t5",
}


def _special_ids(tokenizer) -> dict:
    pad = tokenizer.pad_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    return {"pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos}


def tiny_seq2seq(
    model_type: str = "bart",
    tokenizer=None,
    seed: int = 0,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    intermediate_size: int = 64,
    **config_overrides,
):
    """A random ``AutoModelForSeq2SeqLM`` of a tiny size whose vocabulary and special ids match
    ``tokenizer`` (BART-style: decoding starts with the end token; T5-style: with padding).

    Example:
        >>> model = tiny_seq2seq("bart", tokenizer=tiny_tokenizer(["a b c"], 50))  # doctest: +SKIP
    """
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    family = _FAMILY.get(model_type)
    if family is None:
        raise ConfigError(
            f"backbone: tiny encoder-decoder model_type must be one of {', '.join(_FAMILY)}, got {model_type!r}"
        )
    width, layers, heads, ffn = SEQ2SEQ_FAMILIES[family]
    kw = {
        width: hidden_size,
        **dict.fromkeys(layers, num_hidden_layers),
        **dict.fromkeys(heads, num_attention_heads),
        **dict.fromkeys(ffn, intermediate_size),
    }
    if family == "t5":
        kw["d_kv"] = hidden_size // num_attention_heads
    else:
        kw["max_position_embeddings"] = 512
    if tokenizer is not None:
        ids = _special_ids(tokenizer)
        kw.update(
            vocab_size=len(tokenizer),
            **ids,
            forced_eos_token_id=ids["eos_token_id"],
            decoder_start_token_id=ids["pad_token_id"] if family == "t5" else ids["eos_token_id"],
        )
    if family == "t5" and "num_layers" in config_overrides and "num_decoder_layers" not in config_overrides:
        kw["num_decoder_layers"] = config_overrides["num_layers"]  # as T5Config reads num_layers alone
    kw.update(config_overrides)
    config = AutoConfig.for_model(model_type, **kw)
    with torch.random.fork_rng(devices=[]):  # seed the weights without moving the caller's RNG
        torch.manual_seed(seed)
        return AutoModelForSeq2SeqLM.from_config(config).eval()
