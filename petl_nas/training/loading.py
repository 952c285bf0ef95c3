"""Loading a backbone and its tokenizer for a task (a local folder, a hub name, or a tiny random
model built from a config), cached per process, and a fresh PETL copy of it for one run. A search's
workers, `petl-nas train` and the one-shot supernet all load backbones through here.

Example:
    >>> model, tok = load_backbone("all-MiniLM-L6-v2", resolve_task("sst2"))    # doctest: +SKIP
    >>> trained = petl_copy(model, config, seed=0)                               # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from ..core.config import PetlConfig
from ..core.inject import apply_petl
from ..errors import ConfigError
from ..tasks import Task

_BACKBONES: dict[str, tuple] = {}


@dataclass
class TrainData:
    """The splits the trainer sees: train, the split it is scored on and, where given, a split
    ``report`` scored once more at the very end (its first ``report_rows`` rows; None: all), which
    nothing in the run reads: the test split of a run that is also a final run (`search.specs`)."""

    train: Any
    dev: Any
    report: Any = None
    report_rows: int | None = None


def _backbone_key(backbone, task: Task) -> str:
    return repr((backbone, task.name, task.kind, task.num_labels))


def tiny_model(backbone: dict, task: Task, tokenizer):
    """The random model of a ``{"tiny": {config overrides}}`` backbone, sized to ``tokenizer``, with
    the head ``task`` needs (a generation task gets a tiny BART / GPT-2 unless ``model_type`` says)."""
    from ..core.models import check_task_head
    from ..core.tiny import tiny_backbone

    overrides = dict(backbone["tiny"] or {})
    overrides.pop("vocab_size", None)  # the tokenizer sets it
    default = {"seq2seq": "bart", "causal_lm": "gpt2"}.get(task.kind, "bert")
    check_task_head(overrides.setdefault("model_type", default), task, f"tiny {overrides['model_type']}")
    if task.kind == "seq2seq":
        from ..tasks.seq2seq import tiny_seq2seq

        return tiny_seq2seq(overrides.pop("model_type", "bart"), tokenizer, int(overrides.pop("seed", 0)), **overrides)
    if task.kind == "causal_lm":
        from ..tasks.causal_lm import tiny_causal_lm

        return tiny_causal_lm(
            overrides.pop("model_type", "gpt2"), tokenizer, int(overrides.pop("seed", 0)), **overrides
        )
    return tiny_backbone(
        overrides.pop("model_type", "bert"),
        num_labels=task.num_labels,
        tokenizer=tokenizer,
        seed=int(overrides.pop("seed", 0)),
        **overrides,
    )


def model_config_for(backbone, task: Task, splits=None):
    """The transformers config of a backbone with ``task``'s head (tiny ones are built, small)."""
    if isinstance(backbone, dict):
        return load_backbone(backbone, task, splits)[0].config
    from ..core.models import check_task_head, load_model_config

    config = load_model_config(str(backbone), task.num_labels)
    check_task_head(config.model_type, task, str(backbone))
    return config


def load_backbone(backbone, task: Task, splits=None):
    """(model, tokenizer) for ``backbone`` with a head for ``task``; cached per process. A tiny
    model's tokenizer is built from the training texts, so its cache entry is per data as well."""
    key = _backbone_key(backbone, task)
    if isinstance(backbone, dict) and splits is not None:
        key += repr(splits.key)
    if key not in _BACKBONES:
        if isinstance(backbone, dict) and "tiny" in backbone:
            from ..core.tiny import tiny_tokenizer

            texts = [t for col in splits.train.texts for t in col] if splits is not None else ["empty"]
            if splits is not None and task.generative:  # targets / responses need their words too
                texts += list(splits.train.labels)
            tok = tiny_tokenizer(texts, vocab_size=int((backbone["tiny"] or {}).get("vocab_size", 1000)))
            model = tiny_model(backbone, task, tok)
        elif isinstance(backbone, str):
            from transformers import AutoTokenizer

            from ..core.models import hub_options, load_for_task, load_model_config, resolve_model
            from ..tasks.causal_lm import ensure_pad_token

            load_model_config(backbone)  # a name or path that is no model: one line
            path = resolve_model(backbone)
            tok = AutoTokenizer.from_pretrained(path, **hub_options(path))
            with torch.random.fork_rng():  # a new head starts the same in every process
                torch.manual_seed(0)
                model = load_for_task(backbone, task)
            ensure_pad_token(model, tok)  # GPT-2 / Llama tokenizers have no pad token
        else:
            raise ConfigError(f"backbone: expected a model name/path or {{tiny: {{...}}}}, got {backbone!r}")
        if task.kind == "regression":
            model.config.problem_type = "regression"
        _BACKBONES[key] = (model.eval(), tok)
    return _BACKBONES[key]


def petl_copy(base, config: PetlConfig, seed: int):
    """A copy of ``base`` (head included) with ``config`` applied, its new modules initialised from
    ``seed`` alone: the same seed gives the same start whatever the process ran before."""
    torch.manual_seed(seed)
    return apply_petl(copy.deepcopy(base), config)


__all__ = ["TrainData", "tiny_model", "model_config_for", "load_backbone", "petl_copy"]
