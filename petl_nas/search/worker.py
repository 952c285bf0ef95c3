"""What a worker does for one trial: backbone + data (loaded once per process), apply, train, score.

A worker keeps the pretrained backbone, its tokenizer (`loading`) and the tokenised splits in memory
across trials (Ray reuses the actor; the local executor is one process), so a trial costs its
training and little else: each trial deep-copies the cached backbone and applies its configuration.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ..core.config import PetlConfig
from ..study.results import TrialResult
from ..tasks import Task, load_splits, resolve_task
from ..tasks.encoding import encode
from ..tasks.significance import encode_rows
from ..training.costs import LATENCY_BATCH, deployed_latency_ms, gpu_footprint
from ..training.loading import TrainData, load_backbone, petl_copy
from ..training.loop import Recipe, train

_WARMED: set[str] = set()  # device types this process has warmed up (`_warm_up`)


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs for one trial, as plain picklable values."""

    backbone: Any  # a local path / hub name, or {"tiny": {config overrides}}
    task: Any  # a task name, or a file-task mapping (see tasks.resolve_task)
    config: dict  # PetlConfig.to_dict()
    recipe: dict  # Recipe fields
    data_dir: str | None = None
    k: int | None = None
    data_seed: int = 111
    search_dev: int = 500
    eval_split: str = "search_dev"  # "test" only for the final re-evaluation
    number: int = -1
    score: str = "last"  # the trial's score: its "last" evaluation, or its "best" one
    final_twin: dict | None = None  # the final run's recipe this run trains exactly as: scored on test too

    def to_dict(self) -> dict:
        return asdict(self)


def prepare(spec: TrialSpec):
    """(task, backbone model, tokenizer, encoded splits) for a spec, all cached per process."""
    task = resolve_task(spec.task)
    splits = load_splits(
        task, data_dir=spec.data_dir, k=spec.k, data_seed=spec.data_seed, search_dev_size=spec.search_dev
    )
    model, tok = load_backbone(spec.backbone, task, splits)
    encoded = encode(splits, tok, max_length=int(spec.recipe.get("max_length", 128)))
    return task, model, tok, encoded


def _warm_up(base, config: PetlConfig, train_split, scored, task: Task, recipe: Recipe) -> None:
    """Two throwaway steps and an evaluation of 8 rows, once per process on a CPU, before its first
    trial is measured. What a process allocates once and keeps (thread pools, kernel caches, code
    imported on first use) would otherwise count in the first trial's peak memory: measured on a
    tiny BERT, 21 MB for a trial that later measures 4 MB in the same process."""
    warm = recipe.with_overrides(
        max_steps=2, eval_rows=LATENCY_BATCH, evals_per_epoch=0, compile="off", frozen_cache_mb=0
    )
    train(petl_copy(base, config, recipe.seed), TrainData(train_split, scored), task, warm, "cpu")
    _WARMED.add("cpu")


def run_trial(
    spec: TrialSpec, report: Callable[[int, dict, bool], None] | None = None, device: str | None = None
) -> TrialResult:
    """Train and score one configuration."""
    start = time.perf_counter()
    task, base, _, encoded = prepare(spec)
    evaluated = encoded.test if spec.eval_split == "test" else encoded.search_dev
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    config, recipe = PetlConfig.from_dict(spec.config), Recipe(**spec.recipe)
    if torch.device(device).type == "cpu" and "cpu" not in _WARMED:
        _warm_up(base, config, encoded.train, evaluated, task, recipe)
    model = petl_copy(base, config, recipe.seed)
    setup_s = time.perf_counter() - start
    twin = spec.final_twin if spec.eval_split == "search_dev" else None
    data = TrainData(encoded.train, evaluated, *((encoded.test, twin.get("eval_rows")) if twin else ()))
    result = train(model, data, task, recipe, device, report)
    first = next(iter(evaluated.batches(LATENCY_BATCH, shuffle=False)))
    gpu = gpu_footprint(device)  # before latency's merge and forward
    latency_ms = deployed_latency_ms(model, first, device)  # merges LoRA: after training
    scored = result.metrics if spec.score == "best" else result.history[-1]
    score = result.score if spec.score == "best" else result.last_score
    rows = result.rows_of(scored) if spec.eval_split == "search_dev" else None
    return TrialResult(
        score=score,
        score_se=scored.get("se"),
        pooling=model.petl.pooling,
        last_score=result.last_score,
        best_score=result.score,
        metrics=result.metrics,
        history=result.history,
        steps=result.steps,
        train_s=result.wall_s,
        setup_s=setup_s,
        peak_mem_mb=result.peak_mem_mb,
        train_step_ms=result.train_step_ms,
        latency_ms=latency_ms,
        metric=task.main_metric,
        wall_s=time.perf_counter() - start,
        epochs=spec.recipe.get("epochs"),
        k=spec.k,
        **gpu,
        frozen=result.frozen,
        graphs=result.graphs,
        threads=result.threads,
        rows=encode_rows(rows) if rows is not None else None,
        test_run=_test_run(result.report_metrics, twin, spec.k),
    )


def _test_run(metrics: dict | None, twin: dict | None, k: int | None) -> dict | None:
    """What the final re-evaluation reads instead of training a run again: the test split's metrics
    of a run that trained exactly as the final run of ``twin`` (its recipe) and ``k`` would."""
    if metrics is None or twin is None:
        return None
    return {"recipe": twin, "k": k, "metrics": {m: float(v) for m, v in metrics.items() if isinstance(v, (int, float))}}


def free_memory() -> None:
    """Give back what finished or failed trials held (the CUDA allocator's cache too), so the next
    trial in this process, or a trial packed beside it on the same GPU, starts with the card's room."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


__all__ = ["TrialSpec", "run_trial", "free_memory", "prepare"]
