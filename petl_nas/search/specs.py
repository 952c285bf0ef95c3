"""From an experiment to what a worker runs: the trials' recipe (its ``fidelity``), the final runs'
recipe (its ``final``) and each run's `TrialSpec`. Trials, calibration runs, confirmations and the
final re-evaluation are all built here, so they differ only where an argument says so.

Example:
    >>> recipe = trial_recipe(exp).with_overrides(lr=3e-3)                       # doctest: +SKIP
    >>> run_trial(trial_spec(exp, config, recipe, number=7))                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

from ..core.config import PetlConfig
from ..study.experiment import NEW_STUDY_LENGTH_BUCKETS
from ..training.loop import Recipe
from .worker import TrialSpec


def trial_recipe(exp) -> Recipe:
    """How the experiment's trials train (its fidelity; the sampler sets ``lr``). Only evaluations
    whose score is read are computed: ASHA reads every one, a trial scored by its best needs them
    all; otherwise only the last is read (multi-objective TPE cannot use intermediate values).
    ``length_buckets: auto`` is what a new study takes; a search resolves it from its study first."""
    f = exp.fidelity
    reads_all = (exp.executor == "ray" and exp.scheduler == "asha") or f.score == "best"
    buckets = NEW_STUDY_LENGTH_BUCKETS if f.length_buckets == "auto" else f.length_buckets
    return Recipe(
        epochs=f.epochs,
        batch_size=f.batch_size,
        max_length=f.max_length,
        evals_per_epoch=f.evals_per_epoch if reads_all else 0,
        seed=exp.seed,
        max_steps=f.max_steps,
        eval_rows=f.eval_rows,
        length_buckets=buckets,
        frozen_cache_mb=f.frozen_cache_mb,
        precision=f.precision,
        compile=f.compile,
        cuda_graphs=f.cuda_graphs,
    )


def final_recipe(exp, recipe: Recipe, lr: float, seed: int) -> Recipe:
    """The final re-evaluation's recipe: the trials' ``recipe`` at ``final.epochs`` (and its step
    and row caps), ``lr`` and ``seed``, evaluated once, at the end (only that score is reported)."""
    return dataclasses.replace(
        recipe.with_overrides(lr=lr, seed=seed, epochs=exp.final.epochs),
        max_steps=exp.final.max_steps,
        eval_rows=exp.final.eval_rows,
        evals_per_epoch=0,
    )


def final_twin(exp, recipe: Recipe) -> Recipe | None:
    """The final run that a search-dev run at ``recipe`` trains exactly as, or None. Where the final
    recipe is the trials' (same length, K, step cap and rate: a one-shot suite's 10-epoch trials),
    a trial's run at seed 0 and its confirmation at seeds 1, 2 are the final runs of those seeds:
    each is scored on the test split too, once, after its last step, and the final re-evaluation
    reads that score instead of training the run again (`reevaluate_front`). A run that evaluates
    during training (``evals_per_epoch``, for ASHA or ``score: best``) is not taken for one."""
    if not exp.final.seeds or recipe.seed not in range(exp.final.seeds) or recipe.evals_per_epoch:
        return None
    final = final_recipe(exp, recipe, recipe.lr, recipe.seed)
    if final_k(exp) != exp.fidelity.k or dataclasses.replace(final, eval_rows=recipe.eval_rows) != recipe:
        return None
    return final


def final_k(exp) -> int | None:
    """The training rows of the final runs: ``final.k``, where -1 is the search's own K."""
    return exp.fidelity.k if exp.final.k == -1 else exp.final.k


def trial_spec(exp, config: PetlConfig | dict, recipe: Recipe, *, number: int = -1, final: bool = False) -> TrialSpec:
    """A run of ``config`` with ``recipe`` on the experiment's backbone, task and data: scored on
    search-dev as the trials are (``fidelity.k`` rows, ``fidelity.score``), or with ``final`` on the
    held-out test split, by its last evaluation, with ``final.k`` rows."""
    twin = None if final else final_twin(exp, recipe)
    return TrialSpec(
        backbone=exp.backbone,
        task=exp.task,
        config=config.to_dict() if isinstance(config, PetlConfig) else config,
        recipe=recipe.to_dict(),
        data_dir=exp.data_dir,
        k=final_k(exp) if final else exp.fidelity.k,
        data_seed=exp.data_seed,
        search_dev=exp.fidelity.search_dev,
        eval_split="test" if final else "search_dev",
        number=number,
        score="last" if final else exp.fidelity.score,
        final_twin=twin.to_dict() if twin is not None else None,
    )


__all__ = ["trial_recipe", "final_recipe", "final_twin", "final_k", "trial_spec"]
