"""Shared fixtures: tiny random BERT and RoBERTa classifiers (built from configs, CPU, milliseconds),
and a textbook prefix attention registered as `REFERENCE_ATTENTION` to compare the ``petl`` one with.
The suite runs offline, with torch.compile's cache in a folder of its own that it removes."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# torch.compile's cache: a folder of this run's, removed at its end (under /tmp/torchinductor_<user>
# each run from a new environment left ~40 MB of kernels behind; the one precompiled header, ~150 MB
# per environment, stays there: torch places it before any setting, and compiling without it cost
# test_compiling.py 326 s instead of 214 s). Set before torch is imported (importing its compiler
# fixes the folder); a cache the caller set is kept.
COMPILE_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = COMPILE_CACHE = tempfile.mkdtemp(prefix="petl-nas-tests-inductor-")

import pytest
import torch
from transformers import (AttentionInterface, BertConfig, BertForSequenceClassification, RobertaConfig,
                          RobertaForSequenceClassification)
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from petl_nas import ModuleSpec
from petl_nas.core.modules.head_attention import edits_of

def pytest_unconfigure(config):
    if COMPILE_CACHE is not None:
        shutil.rmtree(COMPILE_CACHE, ignore_errors=True)


TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, num_labels=2)

BACKBONES = {
    "bert": (BertConfig, BertForSequenceClassification),
    "roberta": (RobertaConfig, RobertaForSequenceClassification),
}


def tiny_config(kind: str = "bert", **overrides):
    cfg_cls, _ = BACKBONES[kind]
    kw = dict(TINY, **overrides)
    if kind == "roberta":
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=80)
    return cfg_cls(**kw)


def tiny_model(kind: str = "bert", seed: int = 0, **overrides):
    """A fresh tiny classifier in eval mode (deterministic for a given seed)."""
    _, model_cls = BACKBONES[kind]
    torch.manual_seed(seed)
    return model_cls(copy.deepcopy(tiny_config(kind, **overrides))).eval()


def batch(kind: str = "bert", seed: int = 1, n: int = 3, length: int = 9):
    """Random ids with one right-padded row, so padding masks matter."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY["vocab_size"], (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[-1, length - 3:] = 0
    ids[-1, length - 3:] = 1 if kind == "roberta" else 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(params=sorted(BACKBONES))
def kind(request):
    return request.param


def reference_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                               position_bias=None, **_):
    """Textbook attention over [prefix; tokens]: eager softmax, float mask (eager_mask), T5's bias, GQA by
    repetition; the prefix indexed here, not through its per-forward cache."""
    e = edits_of(module)
    b = query.shape[0]
    if e is not None and e.prefix is not None:
        pk, pv = e.prefix.all_kv()[e.prefix_index]
        n = pk.shape[1]
        key = torch.cat([pk.expand(b, -1, -1, -1), key], 2)
        value = torch.cat([pv.expand(b, -1, -1, -1), value], 2)
        pad = lambda t: None if t is None else torch.nn.functional.pad(t, (n, 0))  # noqa: E731
        attention_mask, position_bias = pad(attention_mask), pad(position_bias)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    for extra in (position_bias, attention_mask):
        if extra is not None:
            scores = scores + extra
    return (scores.softmax(-1) @ value).transpose(1, 2), None


REFERENCE_ATTENTION = "reference_prefix"
AttentionInterface.register(REFERENCE_ATTENTION, reference_prefix_attention)
AttentionMaskInterface.register(REFERENCE_ATTENTION, eager_mask)


# Modules whose Δh is exactly 0 at initialisation (LoRA's B, an adapter's up projection start at 0).
ZERO_INIT = {
    "parallel adapter": ModuleSpec(form="adapter", position="ffn", size=4, init="lora"),
    "scaled PA at attn": ModuleSpec(form="adapter", position="attn", size=4, init="lora", composition="scaled",
                                    scale=4.0),
    "sequential adapter": ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, init="lora"),
    "lora qkvo": ModuleSpec(form="lora", size=4, targets=("q", "k", "v", "o")),
    "lora ffn": ModuleSpec(form="lora", position="ffn", size=4),
    "mh_adapter": ModuleSpec(form="mh_adapter", size=4),
    "compacter": ModuleSpec(form="compacter", position="ffn", insertion="sequential", size=8, init="lora"),
}
