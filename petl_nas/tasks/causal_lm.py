"""Decoder-only models (GPT-2, Llama, ...): pad tokens, causal-LM encoding, its scores, a tiny model.

Two uses. Sequence classification on the usual tasks runs through
``AutoModelForSequenceClassification``, which pools the last non-padding token, so the model needs
a pad token: `ensure_pad_token` gives the tokenizer its end token as pad (they have none) and tells
the model. Causal-LM fine-tuning on a local file of ``prompt``/``response`` (or plain ``text``)
rows trains on the response tokens only: `encode_rows` writes ``[bos] prompt response eos`` with
the prompt positions labelled -100; `evaluate_lm` scores held-out rows by token accuracy and
perplexity over those same tokens.

Example:
    >>> ids, labels = encode_rows(["Q: 2+2? A:"], [" 4"], tokenizer, max_length=64)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..core.tiny import in_family_names
from ..errors import ConfigError
from .metrics import lm_metrics

__all__ = ["ensure_pad_token", "encode_rows", "evaluate_lm", "generate_responses", "tiny_causal_lm", "end_token_id"]


def ensure_pad_token(model, tokenizer) -> None:
    """Give a tokenizer without padding its end (or unknown) token as pad, and tell the model."""
    if tokenizer.pad_token_id is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ConfigError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad, "
                "an end nor an unknown token to pad with"
            )
        tokenizer.pad_token = fallback
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id


def end_token_id(tokenizer) -> int:
    """The token that ends a response: the end-of-sequence token, else BERT-style ``[SEP]``."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ConfigError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no end token")
    return eos


def _lead(tokenizer) -> list[int]:
    """The start token the tokenizer itself puts first (Llama's <s>, BERT's [CLS]), or none (GPT-2)."""
    probe = tokenizer("a")["input_ids"]
    starts = {tokenizer.bos_token_id, getattr(tokenizer, "cls_token_id", None)} - {None}
    return probe[:1] if probe and probe[0] in starts else []


def encode_rows(
    prompts: Sequence[str], responses: Sequence[str], tokenizer, max_length: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(input ids, labels) of ``lead + prompt + response + eos``; labels are -100 on the lead and prompt.

    Rows longer than ``max_length`` keep at least half of it for the response: the response is cut
    at its end, the prompt at its start (the words nearest the response matter most).
    """
    if not len(responses):
        return [], []
    lead, eos = _lead(tokenizer), end_token_id(tokenizer)
    prompt_ids = (
        tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if any(prompts) else [[] for _ in responses]
    )
    response_ids = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    room = max_length - len(lead)
    if room < 2:
        raise ConfigError(f"max_length {max_length} leaves no room for a response")
    inputs, labels = [], []
    for p, r in zip(prompt_ids, response_ids):
        r = list(r) + [eos]
        r = r[: max(room - len(p), room // 2)]
        p = p[len(p) - (room - len(r)) :] if len(p) + len(r) > room else p
        inputs.append(lead + list(p) + r)
        labels.append([-100] * (len(lead) + len(p)) + r)
    return inputs, labels


def evaluate_lm(model, split, task, batch_size: int, device, max_rows: int | None = None) -> dict:
    """Token accuracy and perplexity of next-token predictions on the labelled (response) tokens."""
    model.eval()
    nll, correct, tokens = 0.0, 0, 0
    with torch.no_grad():
        for batch in split.head(max_rows).batches(batch_size, shuffle=False, seed=0):
            labels = batch.pop("labels").to(device)[:, 1:]  # [B, T-1]: token t+1 ...
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits[:, :-1].float()  # ... from t
            scored = labels != -100
            nll += F.cross_entropy(logits[scored], labels[scored], reduction="sum").item()
            correct += int((logits.argmax(-1)[scored] == labels[scored]).sum())
            tokens += int(scored.sum())
    return lm_metrics(task.metrics, nll, correct, tokens)


def generate_responses(
    model, tokenizer, prompts: Sequence[str], max_length: int = 128, batch_size: int = 16, max_new_tokens: int = 64
) -> list[str]:
    """Greedy continuations of each prompt (its last ``max_length`` tokens), up to the end token."""
    model.eval()
    lead, eos = _lead(tokenizer), end_token_id(tokenizer)
    device = next(model.parameters()).device
    rows = [
        lead + ids[max(0, len(ids) - max_length + len(lead)) :]
        for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    ]
    rows = [r or [eos] for r in rows]  # an empty prompt starts after an end token
    out = []
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            width = max(len(r) for r in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(chunk):  # left padding: every row ends where generation starts
                ids[j, width - len(r) :], mask[j, width - len(r) :] = torch.tensor(r), 1
            new = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                do_sample=False,
                num_beams=1,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )[:, width:]
            out += [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
    return out


def tiny_causal_lm(
    model_type: str = "gpt2",
    tokenizer=None,
    seed: int = 0,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    intermediate_size: int = 64,
    **config_overrides,
):
    """A random ``AutoModelForCausalLM`` of a tiny size whose vocabulary and special ids match ``tokenizer``.

    Example:
        >>> model = tiny_causal_lm("llama", tokenizer=tok, num_key_value_heads=2)  # doctest: +SKIP
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = in_family_names(
        model_type,
        {
            "hidden_size": hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "intermediate_size": intermediate_size,
            "max_position_embeddings": 512,
        },
    )
    if tokenizer is not None:
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else getattr(tokenizer, "cls_token_id", None)
        kw.update(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=bos,
            eos_token_id=end_token_id(tokenizer),
        )
    kw.update(config_overrides)
    config = AutoConfig.for_model(model_type, **kw)
    with torch.random.fork_rng(devices=[]):  # seed the weights without moving the caller's RNG
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config).eval()
