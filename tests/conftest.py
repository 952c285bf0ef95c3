"""Shared fixtures: tiny random BERT and RoBERTa classifiers (built from configs, CPU, milliseconds)."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch
from transformers import (BertConfig, BertForSequenceClassification, RobertaConfig,
                          RobertaForSequenceClassification)

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
