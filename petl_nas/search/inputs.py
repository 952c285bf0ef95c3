"""Checking a search's input before its study is touched: the task resolves and its data loads, the
backbone's folder holds sound weights and a tokenizer, the space loads, the budget admits a module,
a rates file or warm start can be read. The rule: every problem found here is one `ConfigError`
line, and nothing is written while looking.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.budget import check_positions, count_parameters
from ..core.config import PetlConfig
from ..core.models import check_backbone_files
from ..errors import ConfigError
from ..study.experiment import Experiment, parse_budget
from ..study.space import SearchSpace
from ..tasks import load_splits, resolve_task
from ..tasks.seq2seq import check_languages
from ..training.loading import load_backbone, model_config_for
from . import rates
from .executors import EXECUTORS, check_ray_address
from .study import SAMPLERS, make_sampler, presets_within, smallest_count, smallest_module
from .warm_start import front_of


@dataclass
class Inputs:
    """What `check_inputs` read and found sound: the study is made from these."""

    task: object
    splits: object
    model_config: object
    space: SearchSpace
    budget: int | None
    backbone_params: int


def check_inputs(exp: Experiment, written_later=frozenset()) -> Inputs:
    """Everything that can be wrong with ``exp``'s input (task, data, backbone, space, budget, rates
    file, executor, warm start), checked without touching its study; one `ConfigError` line for the
    first problem. ``written_later``: files another study writes first (a suite's rates), not read here."""
    task = resolve_task(exp.task)
    task.check_max_length(exp.fidelity.max_length, "fidelity.max_length")
    if exp.sampler not in SAMPLERS:
        make_sampler(exp.sampler, exp.seed)  # raises with the names
    if exp.executor not in EXECUTORS:
        raise ConfigError(f"executor: unknown name {exp.executor!r}; accepted: {', '.join(EXECUTORS)}")
    splits = load_splits(
        task, data_dir=exp.data_dir, k=exp.fidelity.k, data_seed=exp.data_seed, search_dev_size=exp.fidelity.search_dev
    )
    model_config = model_config_for(exp.backbone, task, splits)
    check_positions(model_config, exp.fidelity.max_length, "fidelity.max_length")
    if task.kind == "seq2seq" and (task.seq2seq.source_lang or task.seq2seq.target_lang):
        check_languages(load_backbone(exp.backbone, task, splits)[1], task.seq2seq)
    space = SearchSpace.load(exp.space)
    n_layers = model_config.num_hidden_layers
    backbone_params = count_parameters(model_config, PetlConfig()).backbone
    budget = parse_budget(exp.budget, backbone_params)
    smallest = smallest_count(space, model_config, n_layers)
    if budget is not None and budget < smallest:
        raise ConfigError(
            f"budget {budget:,} is below the smallest configuration of space {space.name!r} "
            f"({smallest:,} deployable parameters on this backbone)"
        )
    fewest = smallest_module(space, model_config, n_layers)
    if budget is not None and fewest is not None and budget < fewest:
        raise ConfigError(
            f"budget {budget:,} admits no PETL module of space {space.name!r}: the smallest takes "
            f"{fewest:,} deployable parameters on this backbone (only the head would train)"
        )
    check_backbone_files(exp.backbone)
    if exp.sampler == "presets" and exp.strategy == "sampler" and not exp.warm_start and not exp.final.baselines:
        _check_some_preset_fits(exp.presets, space, model_config, budget)
    if exp.strategy != "sampler" and budget is None:
        raise ConfigError(f"strategy: {exp.strategy} trains a supernet toward the budget; set a budget")
    if exp.strategy != "sampler":
        _check_oneshot_budgets(exp.oneshot.budgets or (), budget, max(smallest, fewest or 0), backbone_params)
    if exp.executor == "ray":
        check_ray_address(exp.ray_address)
    if exp.warm_start:
        front_of(exp.warm_start)  # a source that cannot be read is said before a study exists
    if exp.rates.on and exp.rates.file and Path(exp.rates.file) not in written_later and Path(exp.rates.file).exists():
        rates.read_file(exp.rates.file, exp)  # a damaged or out-of-range file: said before a study exists
    return Inputs(task, splits, model_config, space, budget, backbone_params)


def _check_oneshot_budgets(budgets, budget: int, smallest: int, backbone_params: int) -> None:
    """Each of ``oneshot.budgets`` a count below the study's budget and at least ``smallest``, the
    space's smallest configuration with a module: the supernet proposes for those only. One error
    line otherwise."""
    for text in budgets:
        try:
            count = parse_budget(text, backbone_params)
        except ConfigError as e:
            raise ConfigError(f"oneshot: budgets: {e}") from None
        if not smallest <= count < budget:
            raise ConfigError(
                f"oneshot: budgets: {text} ({count:,} deployable parameters) is "
                + (
                    f"not below the study's budget of {budget:,}"
                    if count >= budget
                    else f"below the space's smallest module ({smallest:,})"
                )
                + ": the supernet proposes for smaller budgets it can fill"
            )


def _check_some_preset_fits(names, space, model_config, budget: int | None) -> None:
    """``sampler: presets`` trains presets only: one error, before a study exists, when none can train."""
    fitting, over, refused = presets_within(names, space, model_config, budget)
    if fitting:
        return
    whys = (
        [
            f"over the budget of {budget:,} deployable parameters: "
            + ", ".join(f"{name} ({count:,})" for name, count in over)
        ]
        if over
        else []
    )
    whys += [f"the backbone cannot take {name} ({why})" for name, why in refused]
    raise ConfigError(
        f"sampler: presets trains only presets, and none can train here: {'; '.join(whys) if whys else 'presets: none'}"
    )


__all__ = ["Inputs", "check_inputs"]
