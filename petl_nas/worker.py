"""What a worker does for one trial: backbone + data (loaded once per process), apply, train, score.

A worker keeps the pretrained backbone, its tokenizer and the tokenised splits in memory across
trials (Ray reuses the actor; the local executor is one process), so a trial costs its training
and little else: each trial deep-copies the cached backbone and applies its configuration.
"""

from __future__ import annotations

import copy
import gc
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from .config import ConfigError, PetlConfig
from .costs import LATENCY_BATCH, deployed_latency_ms, gpu_footprint
from .inject import apply_petl
from .data import encode
from .tasks import Task, load_splits, resolve_task
from .train import Recipe, train

_BACKBONES: dict[str, tuple] = {}
_WARMED: set[str] = set()          # device types this process has warmed up (`_warm_up`)


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs for one trial, as plain picklable values."""

    backbone: Any                      # a local path / hub name, or {"tiny": {config overrides}}
    task: Any                          # a task name, or a file-task mapping (see tasks.resolve_task)
    config: dict                       # PetlConfig.to_dict()
    recipe: dict                       # Recipe fields
    data_dir: str | None = None
    k: int | None = None
    data_seed: int = 111
    search_dev: int = 500
    eval_split: str = "search_dev"     # "test" only for the final re-evaluation
    number: int = -1
    score: str = "last"                # the trial's score: its "last" evaluation, or its "best" one

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainData:
    """The two splits the trainer sees: train and the split it is scored on."""

    train: Any
    dev: Any


def _backbone_key(backbone, task: Task) -> str:
    return repr((backbone, task.name, task.kind, task.num_labels))


def tiny_model(backbone: dict, task: Task, tokenizer):
    """The random model of a ``{"tiny": {config overrides}}`` backbone, sized to ``tokenizer``, with
    the head ``task`` needs (a generation task gets a tiny BART / GPT-2 unless ``model_type`` says)."""
    from .models import check_task_head
    from .tiny import tiny_backbone

    overrides = dict(backbone["tiny"] or {})
    overrides.pop("vocab_size", None)                    # the tokenizer sets it
    default = {"seq2seq": "bart", "causal_lm": "gpt2"}.get(task.kind, "bert")
    check_task_head(overrides.setdefault("model_type", default), task, f"tiny {overrides['model_type']}")
    if task.kind == "seq2seq":
        from .seq2seq import tiny_seq2seq

        return tiny_seq2seq(overrides.pop("model_type", "bart"), tokenizer, int(overrides.pop("seed", 0)), **overrides)
    if task.kind == "causal_lm":
        from .causal_lm import tiny_causal_lm

        return tiny_causal_lm(overrides.pop("model_type", "gpt2"), tokenizer, int(overrides.pop("seed", 0)), **overrides)
    return tiny_backbone(overrides.pop("model_type", "bert"), num_labels=task.num_labels, tokenizer=tokenizer,
                         seed=int(overrides.pop("seed", 0)), **overrides)


def model_config_for(backbone, task: Task, splits=None):
    """The transformers config of a backbone with ``task``'s head (tiny ones are built, small)."""
    if isinstance(backbone, dict):
        return load_backbone(backbone, task, splits)[0].config
    from .models import check_task_head, load_model_config

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
            from .tiny import tiny_tokenizer

            texts = [t for col in splits.train.texts for t in col] if splits is not None else ["empty"]
            if splits is not None and task.generative:     # targets / responses need their words too
                texts += list(splits.train.labels)
            tok = tiny_tokenizer(texts, vocab_size=int((backbone["tiny"] or {}).get("vocab_size", 1000)))
            model = tiny_model(backbone, task, tok)
        elif isinstance(backbone, str):
            from transformers import AutoTokenizer

            from .causal_lm import ensure_pad_token
            from .models import hub_options, load_for_task, load_model_config, resolve_model

            load_model_config(backbone)                    # a name or path that is no model: one line
            path = resolve_model(backbone)
            tok = AutoTokenizer.from_pretrained(path, **hub_options(path))
            with torch.random.fork_rng():                  # a new head starts the same in every process
                torch.manual_seed(0)
                model = load_for_task(backbone, task)
            ensure_pad_token(model, tok)                   # GPT-2 / Llama tokenizers have no pad token
        else:
            raise ConfigError(f"backbone: expected a model name/path or {{tiny: {{...}}}}, got {backbone!r}")
        if task.kind == "regression":
            model.config.problem_type = "regression"
        _BACKBONES[key] = (model.eval(), tok)
    return _BACKBONES[key]


def prepare(spec: TrialSpec):
    """(task, backbone model, tokenizer, encoded splits) for a spec, all cached per process."""
    task = resolve_task(spec.task)
    splits = load_splits(task, data_dir=spec.data_dir, k=spec.k, data_seed=spec.data_seed,
                         search_dev_size=spec.search_dev)
    model, tok = load_backbone(spec.backbone, task, splits)
    encoded = encode(splits, tok, max_length=int(spec.recipe.get("max_length", 128)))
    return task, model, tok, encoded


def petl_copy(base, config: PetlConfig, seed: int):
    """A copy of ``base`` (head included) with ``config`` applied, its new modules initialised from
    ``seed`` alone: the same seed gives the same start whatever the process ran before."""
    torch.manual_seed(seed)
    return apply_petl(copy.deepcopy(base), config)


def _warm_up(base, config: PetlConfig, train_split, scored, task: Task, recipe: Recipe) -> None:
    """Two throwaway steps and an evaluation of 8 rows, once per process on a CPU, before its first
    trial is measured. What a process allocates once and keeps (thread pools, kernel caches, code
    imported on first use) would otherwise count in the first trial's peak memory: measured on a
    tiny BERT, 21 MB for a trial that later measures 4 MB in the same process."""
    warm = recipe.with_overrides(max_steps=2, eval_rows=LATENCY_BATCH, evals_per_epoch=0, compile="off",
                                 frozen_cache_mb=0)
    train(petl_copy(base, config, recipe.seed), TrainData(train_split, scored), task, warm, "cpu")
    _WARMED.add("cpu")


def run_trial(spec: TrialSpec, report: Callable[[int, dict, bool], None] | None = None,
              device: str | None = None) -> dict:
    """Train and score one configuration; returns the result as plain values."""
    start = time.perf_counter()
    task, base, _, encoded = prepare(spec)
    evaluated = encoded.test if spec.eval_split == "test" else encoded.search_dev
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    config, recipe = PetlConfig.from_dict(spec.config), Recipe(**spec.recipe)
    if torch.device(device).type == "cpu" and "cpu" not in _WARMED:
        _warm_up(base, config, encoded.train, evaluated, task, recipe)
    model = petl_copy(base, config, recipe.seed)
    setup_s = time.perf_counter() - start
    result = train(model, TrainData(encoded.train, evaluated), task, recipe, device, report)
    first = next(iter(evaluated.batches(LATENCY_BATCH, shuffle=False)))
    gpu = gpu_footprint(device)                                          # before latency's merge and forward
    latency_ms = deployed_latency_ms(model, first, device)             # merges LoRA: after training
    scored = result.metrics if spec.score == "best" else result.history[-1]
    score = result.score if spec.score == "best" else result.last_score
    return {"score": score, "score_se": scored.get("se"), "pooling": model.petl.pooling, "last_score": result.last_score, "best_score": result.score, "metrics": result.metrics,
            "history": result.history, "steps": result.steps, "train_s": result.wall_s,
            "setup_s": setup_s, "peak_mem_mb": result.peak_mem_mb,
            "train_step_ms": result.train_step_ms, "latency_ms": latency_ms, "metric": task.main_metric,
            "wall_s": time.perf_counter() - start, "epochs": spec.recipe.get("epochs"), "k": spec.k, **gpu,
            **({"frozen": result.frozen} if result.frozen is not None else {}),
            **({"graphs": result.graphs} if result.graphs is not None else {})}


def free_memory() -> None:
    """Give back what finished or failed trials held (the CUDA allocator's cache too), so the next
    trial in this process, or a trial packed beside it on the same GPU, starts with the card's room."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


__all__ = ["TrialSpec", "TrainData", "run_trial", "free_memory", "prepare", "petl_copy", "load_backbone", "model_config_for", "tiny_model"]
