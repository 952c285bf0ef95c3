"""A classifier whose pooling the architecture's own head cannot read (mean pooling into BERT's
[CLS]-through-the-pooler head, the default journey's all-MiniLM-L6-v2), written for tools that do
not know petl-nas: its head apart (`write_head`, beside a PEFT adapter for the base model), or a
sentence-transformers folder (`write_sentence_transformers`: the encoder with the PETL weights
merged in, its ``Pooling`` and the head as a ``Dense`` layer, so ``encode`` gives the logits).

The rule it keeps: only what represents the trained model exactly is written: the pooling must be
one sentence-transformers' ``Pooling`` computes (mean over the real tokens, or the first token) and
the head one linear layer on the pooled vector (BERT-likes' ``classifier``); anything else is one
`ConfigError` line naming it.

Example:
    >>> write_sentence_transformers(model, task, "runs/best/st")                # doctest: +SKIP
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..core.head import stock_head_fields
from ..errors import ConfigError

HEAD_FILE = "head.safetensors"
HEAD_CONFIG = "head_config.json"
ST_POOLING = {"mean": "mean", "cls": "cls"}  # petl-nas pooling -> sentence-transformers' pooling_mode


def head_apart(model, task) -> bool:
    """The trained classifier reads a pooling its architecture's own head cannot (so PEFT's or a
    merged model's stock head would read something else): its head is written apart."""
    pooling = model.petl.pooling
    return (
        task.kind in ("classification", "regression")
        and pooling != "native"
        and stock_head_fields(model, pooling) is None
    )


def linear_head(model, where: str) -> tuple[str, nn.Linear]:
    """(name, layer) of the head: every part of the classifier outside the base model that has
    weights, which must be one linear layer reading the pooled vector; else one `ConfigError`."""
    parts = [
        (name, child)
        for name, child in model.named_children()
        if child is not model.base_model and child is not model.petl and any(True for _ in child.parameters())
    ]
    if model.petl.pooling not in ST_POOLING:
        raise ConfigError(f"{where}: pooling {model.petl.pooling} (written apart: mean or cls)")
    if len(parts) != 1 or not isinstance(parts[0][1], nn.Linear):
        names = ", ".join(f"{n} ({type(c).__name__})" for n, c in parts)
        raise ConfigError(
            f"{where}: the {type(model).__name__} head is {names}, not one linear layer on the pooled vector"
        )
    return parts[0]


def write_head(model, staging: Path, labels: list | None, where: str) -> dict:
    """``head.safetensors`` (the linear head's ``weight`` and ``bias``) and ``head_config.json``
    (the pooling it reads, the token length the run read, the labels) into ``staging``."""
    name, layer = linear_head(model, where)
    tensors = {"weight": layer.weight.detach().float().contiguous()}
    if layer.bias is not None:
        tensors["bias"] = layer.bias.detach().float().contiguous()
    save_file(tensors, str(staging / HEAD_FILE))
    config = {
        "pooling": model.petl.pooling,
        "head": name,
        "max_length": model.petl.info.get("max_length", 128),
        "labels": labels or [],
    }
    (staging / HEAD_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
    return {"head": name, "pooling": model.petl.pooling}


def head_load_lines(base: str, out: str) -> list[str]:
    """The lines of Python that load a PEFT adapter written with its head apart (in ``out``) and
    give the logits of a list of ``texts``: pooled and truncated as the run was."""
    config = json.loads((Path(out) / HEAD_CONFIG).read_text(encoding="utf-8"))
    pooled = "(h * m).sum(1) / m.sum(1)" if config["pooling"] == "mean" else "h[:, 0]"
    return [
        "from peft import PeftModel; from safetensors.torch import load_file; "
        "from transformers import AutoModel, AutoTokenizer",
        f"model, tok = PeftModel.from_pretrained(AutoModel.from_pretrained({base}), {out!r}).eval(), "
        f"AutoTokenizer.from_pretrained({out!r})",
        f"head = load_file({out!r} + '/{HEAD_FILE}')",
        f"x = tok(texts, padding=True, truncation=True, max_length={config['max_length']}, return_tensors='pt'); "
        "h = model(**x).last_hidden_state; m = x['attention_mask'].unsqueeze(-1).float()",
        f"logits = ({pooled}) @ head['weight'].T + head['bias']          # {config['pooling']} pooling",
    ]


class HeadApart(nn.Module):
    """The check's view of an encoder and a head written apart: pools as written, applies the head,
    returns ``.logits`` as the trained model does (`convert` compares them)."""

    def __init__(self, encoder: nn.Module, folder: Path):
        super().__init__()
        self.encoder = encoder
        self.head = load_file(str(folder / HEAD_FILE))
        self.pooling = json.loads((folder / HEAD_CONFIG).read_text(encoding="utf-8"))["pooling"]

    def forward(self, **batch):
        h = self.encoder(**batch).last_hidden_state  # [B, L, d]
        if self.pooling == "mean":
            m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
        else:
            pooled = h[:, 0]
        logits = pooled @ self.head["weight"].t() + self.head.get("bias", 0)
        return SimpleNamespace(logits=logits)


# ---- sentence-transformers ------------------------------------------------------------------------
def _st():
    try:
        import sentence_transformers
    except ImportError:
        raise ConfigError(
            "convert --to sentence-transformers needs the sentence-transformers package: pip install 'petl-nas[deploy]'"
        ) from None
    return sentence_transformers


def check_sentence_transformers(model, task, where: str) -> None:
    """One `ConfigError` where a sentence-transformers folder cannot hold the trained model."""
    if task.kind not in ("classification", "regression"):
        raise ConfigError(f"{where}: a {task.kind} task (a sentence-transformers folder holds an encoder's classifier)")
    if len(task.text_columns) > 1:
        raise ConfigError(f"{where}: the task reads text pairs; SentenceTransformer.encode reads one text a row")
    if model.petl.pooling == "native" or model.petl.pooling not in ST_POOLING:
        raise ConfigError(
            f"{where}: pooling {model.petl.pooling} (a sentence-transformers Pooling computes "
            f"mean or cls; convert --to peft or merged writes this head)"
        )
    linear_head(model, where)


def write_sentence_transformers(
    encoder: nn.Module, head: nn.Linear, pooling: str, tokenizer, max_length: int, staging: Path
) -> dict:
    """A sentence-transformers folder in ``staging``: ``encoder`` (a plain transformers base model,
    PETL weights merged in) and its tokenizer, ``Pooling`` as ``pooling``, and ``head`` as a ``Dense``
    layer without activation: ``SentenceTransformer(folder).encode(texts)`` gives the logits."""
    st = _st()
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

    with tempfile.TemporaryDirectory() as plain:
        encoder.save_pretrained(plain)
        tokenizer.save_pretrained(plain)
        transformer = Transformer(plain, max_seq_length=max_length)
    d = transformer.get_embedding_dimension()
    dense = Dense(
        d,
        head.out_features,
        bias=head.bias is not None,
        activation_function=nn.Identity(),
        init_weight=head.weight.detach().float().clone(),
        init_bias=head.bias.detach().float().clone() if head.bias is not None else None,
    )
    model = st.SentenceTransformer(modules=[transformer, Pooling(d, ST_POOLING[pooling]), dense], device="cpu")
    model.save(str(staging))
    return {"pooling": pooling, "max_seq_length": max_length}


class SentenceLogits(nn.Module):
    """The check's view of a sentence-transformers folder: its modules on the probe batch, ``.logits``."""

    def __init__(self, folder: Path):
        super().__init__()
        self.model = _st().SentenceTransformer(str(folder), device="cpu")

    def forward(self, **batch):
        with torch.no_grad():
            return SimpleNamespace(logits=self.model(dict(batch))["sentence_embedding"])


__all__ = [
    "head_apart",
    "linear_head",
    "write_head",
    "head_load_lines",
    "HeadApart",
    "check_sentence_transformers",
    "write_sentence_transformers",
    "SentenceLogits",
    "HEAD_FILE",
    "HEAD_CONFIG",
]
